package agent

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestQuoteArgs(t *testing.T) {
	tests := []struct {
		argv []string
		want string
	}{
		{[]string{"ls"}, "ls"},
		{[]string{"ls", "-la", "/tmp/x.y"}, "ls -la /tmp/x.y"},
		{[]string{"echo", "hello world"}, "echo 'hello world'"},
		{[]string{"echo", ""}, "echo ''"},
		{[]string{"echo", "it's"}, `echo 'it'\''s'`},
		{[]string{"echo", "$HOME", "*", "~", "a;b", "#c"}, `echo '$HOME' '*' '~' 'a;b' '#c'`},
		{[]string{"FOO=bar"}, "'FOO=bar'"},
		{[]string{"env", "FOO=bar"}, "env FOO=bar"},
		{[]string{"if"}, "'if'"},
		{[]string{"echo", "if"}, "echo if"},
		{[]string{"ls -la"}, "'ls -la'"},
		{nil, ""},
	}
	for _, tt := range tests {
		if got := QuoteArgs(tt.argv); got != tt.want {
			t.Errorf("QuoteArgs(%q) = %s, want %s", tt.argv, got, tt.want)
		}
	}
}

// TestQuoteArgsRoundTrip has sh itself split the quoted line back into an
// argv, which is the only check that matters.
func TestQuoteArgsRoundTrip(t *testing.T) {
	args := [][]string{
		{"plain", "words"},
		{"", " ", "  two  spaces "},
		{"'", "''", `\`, `"`, "a'b\"c"},
		{"$(id)", "`id`", "${x:-y}", "*", "?", "[a]", "~root", "#", "!"},
		{"line\nbreak", "tab\there", "uni\u00e9code"},
		{"x=y", "if", "{", "}", "&&", "|", ";"},
	}
	for _, argv := range args {
		line := "printf '%s\\0' " + QuoteArgs(argv)
		out, err := exec.Command("/bin/sh", "-c", line).Output()
		if err != nil {
			t.Fatalf("sh -c %s: %v", line, err)
		}
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if !slices.Equal(got, argv) {
			t.Errorf("sh split %s into %q, want %q", line, got, argv)
		}
	}
}
