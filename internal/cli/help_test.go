package cli

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestHelpTexts: every command a user can see has a one-line and a long
// help, and every example in its help parses: it names this command, its
// flags exist and its arguments are the right number.
func TestHelpTexts(t *testing.T) {
	root := newRoot()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		if c.Short == "" || c.Long == "" {
			t.Errorf("%s: want both a one-line (Short) and a long (Long) help", c.CommandPath())
		}
		for _, line := range strings.Split(c.Example, "\n") {
			line = strings.TrimSpace(line)
			if i := strings.Index(line, " #"); i >= 0 {
				line = strings.TrimSpace(line[:i])
			}
			if line == "" {
				continue
			}
			checkExample(t, root, c, line)
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// checkExample parses one example line as the shell would split it and as
// cobra would dispatch it, without running it.
func checkExample(t *testing.T, root, c *cobra.Command, line string) {
	t.Helper()
	words, err := splitWords(line)
	if err != nil || len(words) == 0 || words[0] != "moat" {
		t.Errorf("%s: example %q is not a moat command line (%v)", c.CommandPath(), line, err)
		return
	}
	found, rest, err := root.Find(words[1:])
	if err != nil || found != c {
		t.Errorf("%s: example %q runs %q, not this command (%v)", c.CommandPath(), line, found.CommandPath(), err)
		return
	}
	// Parse on a fresh tree: flags keep their values between parses.
	fresh, rest, _ := newRoot().Find(words[1:])
	if err := fresh.ParseFlags(rest); err != nil {
		t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
		return
	}
	if fresh.Args != nil {
		if err := fresh.Args(fresh, fresh.Flags().Args()); err != nil {
			t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
		}
	}
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

var errUnclosedQuote = errorString("unclosed quote")

type errorString string

func (e errorString) Error() string { return string(e) }
