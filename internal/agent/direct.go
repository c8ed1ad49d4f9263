package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A session command is a string that the shell would run ("sh -c CMD"). When
// that string is nothing but literal words, as QuoteArgs writes an argv, the
// shell adds nothing but its own start-up: the agent then runs the program
// itself. Inside gVisor that start-up is the dominant cost of a short
// command: bash is dynamically linked, and every page it touches is a fault
// the Sentry serves (about 35 ms of the 60 ms that "bash -c true" takes on
// a 2-core systrap host, against 25 ms for /usr/bin/true). Anything the shell
// would interpret (expansions, redirections, builtins other than true and
// false, a program that is not found or cannot be executed) still goes
// through the shell, so the result is the same either way.

// splitPlain splits command into words when it is only literal words:
// unquoted characters that sh never expands or splits on, single-quoted
// strings, and backslash-escaped characters, separated by blanks. It reports
// false for anything else, including an empty command.
func splitPlain(command string) ([]string, bool) {
	var (
		argv   []string
		word   strings.Builder
		inWord bool
	)
	for i := 0; i < len(command); i++ {
		c := command[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				argv = append(argv, word.String())
				word.Reset()
				inWord = false
			}
		case c == '\'':
			end := strings.IndexByte(command[i+1:], '\'')
			if end < 0 {
				return nil, false
			}
			word.WriteString(command[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == '\\':
			// A backslash-newline is a line continuation, not a character.
			if i+1 >= len(command) || command[i+1] == '\n' {
				return nil, false
			}
			word.WriteByte(command[i+1])
			i++
			inWord = true
		case isLiteral(c, !inWord):
			word.WriteByte(c)
			inWord = true
		default:
			return nil, false
		}
	}
	if inWord {
		argv = append(argv, word.String())
	}
	return argv, len(argv) > 0
}

// isLiteral reports whether an unquoted byte means itself to sh. '=' and
// '~' are literal only inside a word: at its start '~' expands, and '=' in
// the first word would make an assignment (rejected later as a command
// name anyway). Everything outside ASCII letters, digits and _@%+=:,./-
// (globs, $, `, quotes, #, blanks other than space and tab, operators) is
// left to the shell.
func isLiteral(c byte, wordStart bool) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	case c == '~':
		return !wordStart
	}
	return strings.IndexByte("_@%+=:,./-", c) >= 0
}

// shellWords are the builtins and reserved words of bash and dash: as a
// command name they mean something only the shell can do (cd, exit, export),
// or they differ in detail from the program of the same name (echo, kill,
// pwd, test, time). true and false are not here: with no arguments the
// programs behave exactly as the builtins (coreutils' only differ on
// --help and --version).
var shellWords = map[string]bool{
	".": true, ":": true, "[": true, "[[": true, "]]": true, "!": true, "{": true, "}": true,
	"alias": true, "bg": true, "bind": true, "break": true, "builtin": true, "caller": true,
	"case": true, "cd": true, "chdir": true, "command": true, "compgen": true, "complete": true,
	"compopt": true, "continue": true, "coproc": true, "declare": true, "dirs": true,
	"disown": true, "do": true, "done": true, "echo": true, "elif": true, "else": true,
	"enable": true, "esac": true, "eval": true, "exec": true, "exit": true, "export": true,
	"fc": true, "fg": true, "fi": true, "for": true, "function": true, "getopts": true,
	"hash": true, "help": true, "history": true, "if": true, "in": true, "jobs": true,
	"kill": true, "let": true, "local": true, "logout": true, "mapfile": true, "popd": true,
	"printf": true, "pushd": true, "pwd": true, "read": true, "readarray": true,
	"readonly": true, "return": true, "select": true, "set": true, "shift": true,
	"shopt": true, "source": true, "suspend": true, "test": true, "then": true, "time": true,
	"times": true, "trap": true, "type": true, "typeset": true, "ulimit": true, "umask": true,
	"unalias": true, "unset": true, "until": true, "wait": true, "while": true,
}

// directArgv returns the argv to run without a shell, or false when the
// command needs one.
func directArgv(command string) ([]string, bool) {
	argv, ok := splitPlain(command)
	if !ok || shellWords[argv[0]] || strings.Contains(argv[0], "=") {
		return nil, false
	}
	if (argv[0] == "true" || argv[0] == "false") && len(argv) > 1 {
		return nil, false
	}
	return argv, true
}

// lookPath finds name as the shell would, in the session's PATH, or returns
// "" to leave it to the shell: a name that is not found (the shell prints
// the canonical error), and a PATH with a relative entry (it is relative to
// the session's directory, which the shell resolves and this does not try
// to). A name with a slash is used as it is; exec resolves a relative one
// against the session's directory.
func lookPath(name string, env []string) string {
	if strings.Contains(name, "/") {
		return name
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range strings.Split(path, ":") {
		if !filepath.IsAbs(dir) {
			return ""
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// shellEnviron adds what the shell itself would have exported to the
// program it runs, so that a command sees the same environment with or
// without one: PWD (bash and dash; an inherited PWD naming the same
// directory, through a symlink, is kept), and for bash SHLVL and _ (the
// program's path). bash 5 raises SHLVL at start-up and lowers it again when
// it execs the command's program in its place, so the program sees the
// inherited level, or 0.
func shellEnviron(env []string, shell, dir, path string) []string {
	get := func(name string) (string, bool) {
		for i := len(env) - 1; i >= 0; i-- {
			if v, ok := strings.CutPrefix(env[i], name+"="); ok {
				return v, true
			}
		}
		return "", false
	}
	out := append([]string(nil), env...)
	pwd, ok := get("PWD")
	if !ok || !sameDir(pwd, dir) {
		out = append(out, "PWD="+dir)
	}
	if filepath.Base(shell) == "bash" {
		lvl, _ := get("SHLVL")
		n, _ := strconv.Atoi(lvl)
		out = append(out, "SHLVL="+strconv.Itoa(max(n, 0)), "_="+path)
	}
	return dedupEnv(out)
}

func sameDir(a, b string) bool {
	if !filepath.IsAbs(a) {
		return false
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// needsShellEnv reports whether the environment asks the shell to do
// something at start-up (bash sources $BASH_ENV even for -c).
func needsShellEnv(env []string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, "BASH_ENV=") || strings.HasPrefix(kv, "ENV=") {
			return true
		}
	}
	return false
}
