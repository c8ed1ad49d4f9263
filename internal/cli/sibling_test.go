package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A companion binary missing from moat's directory is named, with the
// path moat looked at and how to build it; one that is there is found.
func TestSibling(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe, _ = filepath.EvalSymlinks(exe)
	name := "moat-sibling-test-" + filepath.Base(t.TempDir())
	want := filepath.Join(filepath.Dir(exe), name)
	_, err = sibling(name)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "scripts/setup.sh") || exitCode(err) != ExitHost {
		t.Fatalf("sibling of a missing binary: %v (exit %d); want it to name %s and scripts/setup.sh, exit %d", err, exitCode(err), want, ExitHost)
	}
	if err := os.WriteFile(want, nil, 0o755); err != nil {
		t.Skipf("cannot write beside the test binary to check the found case: %v", err)
	}
	defer os.Remove(want)
	if got, err := sibling(name); err != nil || got != want {
		t.Errorf("sibling = %q, %v; want %q", got, err, want)
	}
}
