package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestHelpTexts: every command a user can see has a one-line and a long
// help in the house style, every flag says what it does, a command that
// takes arguments or flags shows an example, and every command
// line its help shows (its examples, and the indented "moat ..." lines of
// its long help) parses: the command exists, its flags exist and take
// their values, and its arguments are the right number.
func TestHelpTexts(t *testing.T) {
	for _, p := range helpProblems(newRoot) {
		t.Error(p)
	}
}

// TestHelpTextsCatch: the lint fails on each kind of mistake it is meant
// to catch, so that TestHelpTexts passing means something.
func TestHelpTextsCatch(t *testing.T) {
	tests := []struct {
		name   string
		path   string // the command to break
		break_ func(c *cobra.Command)
		want   string // in one of the problems
	}{
		{"no example", "status", func(c *cobra.Command) { c.Example = "" }, "moat status: takes arguments or flags but shows no example"},
		{"no long help", "status", func(c *cobra.Command) { c.Long = "" }, "moat status: no long help"},
		{"no short help", "status", func(c *cobra.Command) { c.Short = "" }, "moat status: no one-line help"},
		{"short of two lines", "status", func(c *cobra.Command) { c.Short = "Show\none sandbox's state" }, "one line"},
		{"short ends with a period", "status", func(c *cobra.Command) { c.Short += "." }, "period"},
		{"short in lower case", "status", func(c *cobra.Command) { c.Short = "show one sandbox's state" }, "capital"},
		{"example of another command", "status", func(c *cobra.Command) { c.Example = "  moat down api" }, "runs moat down"},
		{"example with an unknown flag", "status", func(c *cobra.Command) { c.Example = "  moat status api --no-such-flag" }, "unknown flag: --no-such-flag"},
		{"example with too many arguments", "status", func(c *cobra.Command) { c.Example = "  moat status api web" }, "accepts at most 1 arg"},
		{"example with too few arguments", "logs", func(c *cobra.Command) { c.Example = "  moat logs -f" }, "accepts 1 arg"},
		{"example with a bad flag value", "network suggest", func(c *cobra.Command) { c.Example = "  moat network suggest api --since lots" }, `invalid argument "lots" for "--since"`},
		{"example with an unclosed quote", "network allow", func(c *cobra.Command) { c.Example = "  moat network allow api 'GET x" }, "unclosed quote"},
		{"example not indented", "status", func(c *cobra.Command) { c.Example = "moat status" }, "indented by two spaces"},
		{"examples that do not run moat", "status", func(c *cobra.Command) { c.Example = "  status api" }, "no example runs moat"},
		{"example with sudo", "status", func(c *cobra.Command) { c.Example = "  sudo moat status api web" }, "accepts at most 1 arg"},
		{"long help naming a missing command", "network", func(c *cobra.Command) { c.Long += "\n\n  moat network alow api example.com" }, `unknown command "alow"`},
		{"long help with a missing flag", "forward", func(c *cobra.Command) { c.Long += "\n\n  moat forward add --revers api 80  a typo" }, "unknown flag: --revers"},
		{"flag without help", "status", func(c *cobra.Command) { c.Flags().Bool("quiet", false, "") }, "--quiet: no help"},
		{"flag help in upper case", "status", func(c *cobra.Command) { c.Flags().Bool("quiet", false, "Print nothing") }, "--quiet: its help starts with a capital"},
		{"flag help ends with a period", "status", func(c *cobra.Command) { c.Flags().Bool("quiet", false, "print nothing.") }, "--quiet: its help ends with a period"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			broken := func() *cobra.Command {
				root := newRoot()
				c, _, err := root.Find(strings.Fields(tt.path))
				if err != nil || c == root {
					t.Fatalf("no command %q: %v", tt.path, err)
				}
				tt.break_(c)
				return root
			}
			got := helpProblems(broken)
			for _, p := range got {
				if strings.Contains(p, tt.want) {
					return
				}
			}
			t.Errorf("no problem mentions %q; got %q", tt.want, got)
		})
	}
}

// helpProblems lints the help of every visible command of the tree
// newTree builds. Each command line is parsed on a tree of its own: flags
// keep their values between parses.
func helpProblems(newTree func() *cobra.Command) []string {
	var out []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		add := func(format string, a ...any) {
			out = append(out, c.CommandPath()+": "+fmt.Sprintf(format, a...))
		}
		shortProblems(c.Short, add)
		if strings.TrimSpace(c.Long) == "" {
			add("no long help (Long)")
		} else if c.Long != strings.TrimSpace(c.Long) {
			add("long help begins or ends with white space")
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			switch u := f.Usage; {
			case strings.TrimSpace(u) == "":
				add("--%s: no help", f.Name)
			case strings.HasSuffix(u, "."):
				add("--%s: its help ends with a period", f.Name)
			case unicode.IsUpper(firstRune(u)):
				add("--%s: its help starts with a capital (flags' help is lower case)", f.Name)
			}
		})
		runs := 0
		for _, line := range strings.Split(c.Example, "\n") {
			if strings.TrimSpace(line) == "" {
				continue
			}
			if !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "   ") {
				add("example %q: not indented by two spaces", line)
			}
			found, err := parseCommandLine(newTree, line)
			if !errors.Is(err, errNotMoat) {
				runs++
			}
			switch {
			case errors.Is(err, errNotMoat):
				// Another program's line (sudo kill -HUP ...).
			case err != nil:
				add("example %q: %v", strings.TrimSpace(line), err)
			case found != c.CommandPath():
				add("example %q runs %s, not this command", strings.TrimSpace(line), found)
			}
		}
		if strings.TrimSpace(c.Example) != "" && runs == 0 {
			add("no example runs moat")
		}
		if c.Runnable() && !c.HasSubCommands() && strings.TrimSpace(c.Example) == "" &&
			(len(strings.Fields(c.Use)) > 1 || c.LocalNonPersistentFlags().HasAvailableFlags()) {
			add("takes arguments or flags but shows no example (Example)")
		}
		for _, line := range strings.Split(c.Long, "\n") {
			// Indented lines of the long help that start with moat are
			// command lines, some followed by what they do after two
			// spaces (moat --help's "Start here").
			trimmed := strings.TrimLeft(line, " \t")
			if trimmed == line || !strings.HasPrefix(strings.TrimPrefix(trimmed, "sudo "), "moat ") {
				continue
			}
			if i := strings.Index(trimmed, "  "); i >= 0 {
				trimmed = trimmed[:i]
			}
			if _, err := parseCommandLine(newTree, trimmed); err != nil {
				add("long help's %q: %v", trimmed, err)
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newTree())
	return out
}

// shortProblems checks a one-line help: one line, a capital first, no
// period last (cobra lists them in a column after the command's name).
func shortProblems(s string, add func(string, ...any)) {
	switch {
	case strings.TrimSpace(s) == "":
		add("no one-line help (Short)")
	case strings.Contains(s, "\n"):
		add("one-line help %q is more than one line", s)
	case s != strings.TrimSpace(s):
		add("one-line help %q begins or ends with white space", s)
	case strings.HasSuffix(s, "."):
		add("one-line help %q ends with a period", s)
	case !unicode.IsUpper(firstRune(s)):
		add("one-line help %q does not start with a capital", s)
	}
}

func firstRune(s string) rune {
	r, _ := utf8.DecodeRuneInString(s)
	return r
}

// parseCommandLine parses one command line as the shell would split it
// and cobra would dispatch it, without running it, and returns the path
// of the command it runs. A comment (" #") and what follows a shell
// operator (moat ssh-config >> ~/.ssh/config) are not moat's; a line
// that does not run moat, after sudo, is errNotMoat.
func parseCommandLine(newTree func() *cobra.Command, line string) (string, error) {
	line = strings.TrimSpace(line)
	if i := strings.Index(line, " #"); i >= 0 {
		line = strings.TrimSpace(line[:i])
	}
	words, err := splitWords(line)
	if err != nil {
		return "", err
	}
	for i, w := range words {
		if shellOperators[w] {
			words = words[:i]
			break
		}
	}
	if len(words) > 0 && words[0] == "sudo" {
		words = words[1:]
	}
	if len(words) == 0 || words[0] != "moat" {
		return "", errNotMoat
	}
	root := newTree()
	c, rest, err := root.Find(words[1:])
	if err != nil {
		return "", err
	}
	c.InitDefaultHelpFlag()
	if err := c.ParseFlags(rest); err != nil {
		return c.CommandPath(), err
	}
	if err := c.ValidateArgs(c.Flags().Args()); err != nil {
		return c.CommandPath(), err
	}
	return c.CommandPath(), nil
}

// splitWords splits a line into words as a POSIX shell would for the
// quoting examples use: single and double quotes, no expansions.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote != 0 && ch == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(ch)
		case ch == '\'' || ch == '"':
			quote, in = ch, true
		case ch == ' ' || ch == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(ch)
			in = true
		}
	}
	if quote != 0 {
		return nil, errUnclosedQuote
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

var (
	errUnclosedQuote = errors.New("unclosed quote")
	errNotMoat       = errors.New("not a moat command line")
)

var shellOperators = map[string]bool{">": true, ">>": true, "<": true, "|": true, "&&": true, "||": true, ";": true, "2>": true, "2>&1": true}
