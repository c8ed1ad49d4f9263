package reference

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// referenceDir is the committed command reference, from this package.
const referenceDir = "../../docs/commands"

// TestReferenceCurrent fails when the committed command reference is not
// what the commands' help generates now. MOAT_UPDATE_REFERENCE=1 rewrites
// it (scripts/reference.sh).
func TestReferenceCurrent(t *testing.T) {
	if os.Getenv("MOAT_UPDATE_REFERENCE") == "1" {
		os.RemoveAll(referenceDir)
		if err := Write(referenceDir, false); err != nil {
			t.Fatal(err)
		}
	}
	tmp := t.TempDir()
	if err := Write(tmp, false); err != nil {
		t.Fatal(err)
	}
	want := pages(t, tmp)
	got := pages(t, referenceDir)
	var names []string
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if g, ok := got[n]; !ok {
			t.Errorf("docs/commands/%s is missing; run scripts/reference.sh", n)
		} else if !bytes.Equal(g, want[n]) {
			t.Errorf("docs/commands/%s is stale; run scripts/reference.sh", n)
		}
	}
	for n := range got {
		if _, ok := want[n]; !ok {
			t.Errorf("docs/commands/%s documents no command; run scripts/reference.sh", n)
		}
	}
}

func pages(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = b
	}
	return out
}

// TestMoatDoesNotLinkTheGenerator fails when the moat binary links the
// reference's generators again (say, through an import of this package or
// of cobra/doc from internal/cli): each moat process would run their
// package initialisation.
func TestMoatDoesNotLinkTheGenerator(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go command on PATH to list the moat binary's packages")
	}
	out, err := exec.Command(gobin, "list", "-deps", "moat.dev/moat/cmd/moat").Output()
	if err != nil {
		t.Fatalf("go list -deps moat.dev/moat/cmd/moat: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "moat.dev/moat/internal/reference" || strings.HasPrefix(p, "github.com/spf13/cobra/doc") || strings.Contains(p, "md2man") {
			t.Errorf("the moat binary links %s", p)
		}
	}
}
