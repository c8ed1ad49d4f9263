package agent

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

func TestSplitPlain(t *testing.T) {
	tests := []struct {
		command string
		want    []string // nil: not plain
	}{
		{"true", []string{"true"}},
		{"ls -la /tmp/x.y", []string{"ls", "-la", "/tmp/x.y"}},
		{"  go   test\t./... ", []string{"go", "test", "./..."}},
		{"echo 'hello world'", []string{"echo", "hello world"}},
		{`echo 'it'\''s'`, []string{"echo", "it's"}},
		{"echo ''", []string{"echo", ""}},
		{`a\ b`, []string{"a b"}},
		{"env FOO=bar x~y", []string{"env", "FOO=bar", "x~y"}},
		{"", nil},
		{"   ", nil},
		{"echo $HOME", nil},
		{"echo ~", nil},
		{"ls *", nil},
		{"a;b", nil},
		{"a && b", nil},
		{"a | b", nil},
		{"a > f", nil},
		{`echo "x"`, nil},
		{"echo `id`", nil},
		{"echo 'open", nil},
		{"a\nb", nil},
		{"x # comment", nil},
		{`a\`, nil},
		{"a\\\nb", nil},
		{"(a)", nil},
		{"{ a; }", nil},
	}
	for _, tt := range tests {
		got, ok := splitPlain(tt.command)
		if ok != (tt.want != nil) || !slices.Equal(got, tt.want) {
			t.Errorf("splitPlain(%q) = %q, %v; want %q", tt.command, got, ok, tt.want)
		}
	}
}

// TestSplitPlainInvertsQuoteArgs: whatever QuoteArgs writes either splits
// back into exactly the argv, or is left to the shell.
func TestSplitPlainInvertsQuoteArgs(t *testing.T) {
	args := [][]string{
		{"plain", "words"},
		{"", " ", "  two  spaces "},
		{"'", "''", `\`, `"`, "a'b\"c"},
		{"$(id)", "`id`", "${x:-y}", "*", "?", "[a]", "~root", "#", "!"},
		{"line\nbreak", "tab\there", "uni\u00e9code"},
		{"x=y", "if", "{", "}", "&&", "|", ";"},
		{"go", "test", "-run", "TestX/y=1", "./..."},
	}
	for _, argv := range args {
		line := QuoteArgs(argv)
		got, ok := splitPlain(line)
		if !ok {
			t.Errorf("splitPlain(%s) refused a QuoteArgs line", line)
			continue
		}
		if !slices.Equal(got, argv) {
			t.Errorf("splitPlain(%s) = %q, want %q", line, got, argv)
		}
	}
}

func TestDirectArgv(t *testing.T) {
	tests := []struct {
		command string
		direct  bool
	}{
		{"true", true},
		{"false", true},
		{"git status", true},
		{"/bin/true", true},
		{"true --help", false}, // coreutils would print its help; the builtin does not
		{"cd /tmp", false},
		{"exit 7", false},
		{"echo hi", false},
		{"time make", false},
		{"'if'", false},
		{"'FOO=bar'", false},
		{"exec env", false},
		{"echo $HOME", false},
	}
	for _, tt := range tests {
		if _, got := directArgv(tt.command); got != tt.direct {
			t.Errorf("directArgv(%q) direct = %v, want %v", tt.command, got, tt.direct)
		}
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "tool")
	os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "data"), nil, 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	tests := []struct {
		name, path, want string
	}{
		{"tool", "/nonexistent:" + dir, exe},
		{"data", dir, ""}, // not executable: the shell says so
		{"sub", dir, ""},
		{"missing", dir, ""},
		{"tool", "relative:" + dir, ""}, // relative entries are the shell's job
		{"tool", ":" + dir, ""},
		{"./tool", dir, "./tool"},
	}
	for _, tt := range tests {
		if got := lookPath(tt.name, []string{"PATH=" + tt.path}); got != tt.want {
			t.Errorf("lookPath(%q, PATH=%s) = %q, want %q", tt.name, tt.path, got, tt.want)
		}
	}
}

// TestDirectMatchesShell runs the same program with and without the shell
// ("env" runs directly; "\"env\"" has quotes only the shell reads) and
// wants the same output, environment included.
func TestDirectMatchesShell(t *testing.T) {
	for _, shell := range []string{"/bin/sh", "/bin/bash"} {
		if _, err := os.Stat(shell); err != nil {
			t.Logf("skipping %s: not installed", shell)
			continue
		}
		t.Run(filepath.Base(shell), func(t *testing.T) {
			ts := startServer(t, func(s *Server) { s.Shell = shell })
			c := ts.dial(t)
			dir := t.TempDir()
			for _, env := range []map[string]string{nil, {"SHLVL": "4", "PWD": "/elsewhere"}, {cwdEnv: dir, "PWD": dir}} {
				direct := run(t, c, "env", nil, env)
				viaShell := run(t, c, `"env"`, nil, env)
				if got, want := sortedLines(direct.stdout), sortedLines(viaShell.stdout); !slices.Equal(got, want) || direct.code != 0 {
					t.Errorf("env %v: direct %q (exit %d)\nshell  %q", env, got, direct.code, want)
				}
			}
		})
	}
}

func sortedLines(s string) []string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(l)
	return l
}

// TestDirectFallsBackToShell: what the program path cannot run, the shell
// runs or reports as it always did.
func TestDirectFallsBackToShell(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	dir := ts.srv.Dir
	os.WriteFile(filepath.Join(dir, "noshebang"), []byte("echo from script\nexit 5\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "noexec"), []byte("#!/bin/sh\necho no\n"), 0o644)
	tests := []struct {
		command    string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"true", 0, "", ""},
		{"false", 1, "", ""},
		{"true --help", 0, "", ""},
		{"./noshebang", 5, "from script\n", ""},
		{"./noexec", 126, "", "noexec"},
		{"no-such-command-here", 127, "", "no-such-command-here"},
		{"sh -c 'exit 9'", 9, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.command, func(t *testing.T) {
			got := run(t, c, tt.command, nil, nil)
			if got.code != tt.wantCode || got.stdout != tt.wantStdout || !strings.Contains(got.stderr, tt.wantStderr) {
				t.Errorf("got %+v; want exit %d, stdout %q, stderr containing %q", got, tt.wantCode, tt.wantStdout, tt.wantStderr)
			}
		})
	}
}
