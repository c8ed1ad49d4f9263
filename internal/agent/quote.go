package agent

import "strings"

// QuoteArgs joins argv into one POSIX sh command line that the agent's
// "Shell -c" turns back into exactly argv. SSH exec carries a string, not an
// argv, so the client must quote; single quotes are the only sh quoting with
// no special characters inside, which makes the encoding easy to verify.
//
// Plain words stay unquoted so that logs and "ps" stay readable: an argv of
// ["ls"] is sent as "ls", not "'ls'".
func QuoteArgs(argv []string) string {
	var b strings.Builder
	for i, arg := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		if isPlainWord(arg, i == 0) {
			b.WriteString(arg)
			continue
		}
		b.WriteByte('\'')
		b.WriteString(strings.ReplaceAll(arg, "'", `'\''`))
		b.WriteByte('\'')
	}
	return b.String()
}

// reservedWords are the sh words that change meaning in command position:
// an unquoted "if" as argv[0] is a syntax error, not a command called if.
var reservedWords = map[string]bool{
	"!": true, "{": true, "}": true, "case": true, "do": true, "done": true,
	"elif": true, "else": true, "esac": true, "fi": true, "for": true,
	"if": true, "in": true, "then": true, "until": true, "while": true,
}

// isPlainWord reports whether s means itself to sh without quotes. The
// character set excludes everything sh expands or splits on (globs, $, `,
// ~, #, quotes, whitespace). In command position a word with '=' would be
// an assignment and a reserved word would be syntax, so both get quoted.
func isPlainWord(s string, first bool) bool {
	if s == "" {
		return false
	}
	if first && (reservedWords[s] || strings.Contains(s, "=")) {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("_@%+=:,./-", r):
		default:
			return false
		}
	}
	return true
}
