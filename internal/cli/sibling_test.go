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

// moat-sandbox is found only when moat can run it: missing, a directory
// or a file without execute permission is refused with its path and the
// fix.
func TestSandboxExe(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe, _ = filepath.EvalSymlinks(exe)
	p := filepath.Join(filepath.Dir(exe), sandboxBinary)
	if _, err := os.Lstat(p); err == nil {
		t.Skipf("%s exists beside the test binary; not touching it", p)
	}
	defer os.RemoveAll(p)
	for _, tc := range []struct {
		name   string
		make   func() error
		refuse string // "": found
	}{
		{"missing", func() error { return nil }, "is missing"},
		{"a directory", func() error { return os.Mkdir(p, 0o755) }, "cannot be run"},
		{"not executable", func() error { return os.WriteFile(p, nil, 0o644) }, "cannot be run"},
		{"executable", func() error { return os.WriteFile(p, nil, 0o755) }, ""},
	} {
		os.RemoveAll(p)
		if err := tc.make(); err != nil {
			t.Skipf("cannot write beside the test binary: %v", err)
		}
		got, err := sandboxExe()
		if tc.refuse == "" {
			if err != nil || got != p {
				t.Errorf("%s: sandboxExe = %q, %v; want %q", tc.name, got, err, p)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.refuse) || !strings.Contains(err.Error(), p) ||
			!strings.Contains(err.Error(), "scripts/setup.sh") || exitCode(err) != ExitHost {
			t.Errorf("%s: sandboxExe = %q, %v (exit %d); want an error saying %q, naming %s and scripts/setup.sh, exit %d",
				tc.name, got, err, exitCode(err), tc.refuse, p, ExitHost)
		}
	}
}
