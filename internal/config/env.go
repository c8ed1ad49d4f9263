package config

import (
	"fmt"
	"strings"
)

// maxNameLen: names are written into host object names (directories,
// cgroups, network namespaces) and must stay one short DNS label there.
const maxNameLen = 39

// ValidName checks a sandbox name: 1 to 39 lower-case letters, digits
// and '-', not starting with '-'. The error suggests a name that would
// pass, when one can be made from the input.
func ValidName(name string) error {
	bad := ""
	switch {
	case name == "":
		return &Error{Msg: `sandbox name is empty; use lower-case letters, digits and "-", e.g. "api"`}
	case len(name) > maxNameLen:
		bad = fmt.Sprintf("is %d characters long; the limit is %d", len(name), maxNameLen)
	case name[0] == '-':
		bad = "starts with \"-\"; start with a letter or digit"
	default:
		for _, r := range name {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				bad = fmt.Sprintf("contains %q; use lower-case letters, digits and \"-\"", r)
				break
			}
		}
	}
	if bad == "" {
		return nil
	}
	msg := fmt.Sprintf("sandbox name %q %s", name, bad)
	if s := suggestName(name); s != "" {
		msg += fmt.Sprintf(`, e.g. %q`, s)
	}
	return &Error{Msg: msg}
}

// suggestName maps name onto the allowed alphabet: "My_API" → "my-api".
func suggestName(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else if b.Len() > 0 && !strings.HasSuffix(b.String(), "-") {
			b.WriteByte('-')
		}
	}
	s := b.String()
	if len(s) > maxNameLen {
		s = s[:maxNameLen]
	}
	s = strings.TrimRight(s, "-")
	if s == "" || ValidName(s) != nil {
		return ""
	}
	return s
}

// ExpandEnv expands an [env] value on the host. The grammar is a small
// part of the shell's, the part that is unambiguous:
//
//	${VAR}          the value of VAR, empty if unset
//	${VAR:-word}    word if VAR is unset or empty
//	${VAR:?message} an error saying message if VAR is unset or empty
//	$$              a literal $
//
// Any other $ is literal, so "pa$word" needs no escaping. Parse calls it
// with a lookup that always succeeds, which checks only the syntax, so a
// typo is reported with its line before any sandbox exists.
func ExpandEnv(s string, lookup func(string) (string, bool)) (string, error) {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 || i == len(s)-1 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			s = s[i+2:]
			continue
		case '{':
		default:
			b.WriteByte('$')
			s = s[i+1:]
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", &Error{Msg: fmt.Sprintf("%q has an unclosed ${; close it with }, or write $$ for a literal $", s[i:])}
		}
		v, err := expandOne(s[i+2:i+end], lookup)
		if err != nil {
			return "", err
		}
		b.WriteString(v)
		s = s[i+end+1:]
	}
}

// expandOne expands the inside of one ${...}.
func expandOne(expr string, lookup func(string) (string, bool)) (string, error) {
	name, op, arg := expr, "", ""
	if i := strings.IndexByte(expr, ':'); i >= 0 {
		name, op, arg = expr[:i], expr[i:min(i+2, len(expr))], expr[min(i+2, len(expr)):]
	}
	if !isEnvName(name) {
		return "", &Error{Msg: fmt.Sprintf("${%s}: %q is not a variable name; write ${NAME}, ${NAME:-default} or ${NAME:?message}", expr, name)}
	}
	v, ok := lookup(name)
	switch op {
	case "":
		return v, nil
	case ":-":
		if !ok || v == "" {
			return arg, nil
		}
		return v, nil
	case ":?":
		if !ok || v == "" {
			if arg == "" {
				arg = name + " is not set"
			}
			return "", &Error{Msg: fmt.Sprintf("%s: %s", name, arg)}
		}
		return v, nil
	default:
		return "", &Error{Msg: fmt.Sprintf("${%s}: unknown operator %q; write ${NAME:-default} or ${NAME:?message}", expr, op)}
	}
}
