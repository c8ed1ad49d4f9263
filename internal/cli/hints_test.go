package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestHintsRun: the next command an error or a hint tells the user to
// type ("see: moat list", "confirm with: moat destroy %s --yes") is one
// moat has, with flags it has and a number of arguments it takes, across
// every package whose messages reach a user. Only hints written after a
// colon are read; prose that mentions moat is not a command line.
func TestHintsRun(t *testing.T) {
	hints := 0
	for _, h := range sourceHints(t, "../..") {
		hints++
		_, err := parseCommandLine(newRoot, h.line)
		if err == nil || strings.Contains(err.Error(), `unknown command "x"`) {
			continue
		}
		file := filepath.ToSlash(strings.TrimPrefix(strings.SplitN(h.pos, ":", 2)[0], "../../"))
		if why, ok := hintGaps[file+": "+h.line]; ok {
			t.Logf("%s: known gap: hint %q: %v (%s)", h.pos, h.line, err, why)
			continue
		}
		t.Errorf("%s: hint %q: %v", h.pos, h.line, err)
	}
	t.Logf("%d hints checked", hints)
	if hints < 20 {
		t.Errorf("found %d hints in the sources; the scan is broken", hints)
	}
}

// TestHintsRunCatch: the scan finds hints where they are written, and a
// hint naming a command moat lacks fails.
func TestHintsRunCatch(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "internal", "x"), 0o755)
	src := `package x

import "fmt"

func f(name string) error {
	fmt.Println("moat needs root") // prose
	return fmt.Errorf("sandbox %q is stopped; start it with: moat strat %s (or see: moat list)", name, name)
}
`
	os.WriteFile(filepath.Join(dir, "internal", "x", "x.go"), []byte(src), 0o644)
	var got []string
	for _, h := range sourceHints(t, dir) {
		got = append(got, h.line)
		_, err := parseCommandLine(newRoot, h.line)
		if (err != nil) != strings.Contains(h.line, "strat") {
			t.Errorf("hint %q: %v", h.line, err)
		}
	}
	if strings.Join(got, "|") != "moat strat x|moat list" {
		t.Errorf("hints %q, want [moat strat x, moat list]", got)
	}
}

// hintGaps are hints known not to run as written, and why; each is a
// fix to make in its file, then remove it here.
var hintGaps = map[string]string{}

type hint struct {
	pos  string
	line string
}

// hintStart is where a hint begins: "moat " right after a colon.
var hintStart = regexp.MustCompile(`: (sudo )?moat [a-z]`)

// formatVerb stands for a value in a hint: a name, a number, a path.
var formatVerb = regexp.MustCompile(`%[-+# 0-9.]*[a-zA-Z]`)

// sourceHints reads the string literals of every non-test Go file under
// root's cmd and internal and returns the command lines in them.
func sourceHints(t *testing.T, root string) []hint {
	t.Helper()
	var out []hint
	fset := token.NewFileSet()
	for _, top := range []string{"cmd", "internal"} {
		filepath.WalkDir(filepath.Join(root, top), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Errorf("parsing %s: %v", path, err)
				return nil
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				for _, line := range hintLines(s) {
					out = append(out, hint{pos: fset.Position(lit.Pos()).String(), line: line})
				}
				return true
			})
			return nil
		})
	}
	return out
}

// hintLines cuts the command lines out of one string: each from "moat"
// to the end of its clause.
func hintLines(s string) []string {
	var out []string
	for _, loc := range hintStart.FindAllStringIndex(s, -1) {
		rest := s[loc[0]+2:]
		end := len(rest)
		for _, stop := range []string{";", ")", "\n", ", ", " (", " or ", " then ", " and ", ". "} {
			if i := strings.Index(rest, stop); i >= 0 && i < end {
				end = i
			}
		}
		line := rest[:end]
		if end == len(rest) && strings.HasSuffix(line, " ") {
			// "see: moat network list " + name
			line += "x"
		}
		line = strings.TrimRight(line, ".: ")
		if w := strings.Fields(line); len(w) < 2 || hintProse[w[1]] {
			continue
		}
		// A verb glued to a word adds to it (remove%s: " --reverse" or
		// nothing); one on its own is a value. One that stands for a
		// command ("moat network %s") cannot be checked: the caller
		// skips unknown command "x".
		line = gluedVerb.ReplaceAllString(line, "$1")
		out = append(out, formatVerb.ReplaceAllString(line, "x"))
	}
	return out
}

var gluedVerb = regexp.MustCompile(`([a-z])%[-+# 0-9.]*[a-zA-Z]`)

// hintProse are the words after "moat " in sentences that are not
// command lines ("125  run, exec, shell: moat could not run ...").
var hintProse = map[string]bool{"could": true, "without": true, "with": true, "needs": true}
