package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
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
		if err := WriteReference(referenceDir, false); err != nil {
			t.Fatal(err)
		}
	}
	tmp := t.TempDir()
	if err := WriteReference(tmp, false); err != nil {
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
