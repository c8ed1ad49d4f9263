package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHost: the version is runsc's first line; a manifest of the same
// binary spares running it; another binary at the same path is run again.
func TestHost(t *testing.T) {
	dir := t.TempDir()
	runsc, calls := filepath.Join(dir, "runsc"), filepath.Join(dir, "calls")
	write := func(version string) {
		t.Helper()
		script := "#!/bin/sh\necho x >> " + calls + "\necho 'runsc version " + version + "'\necho 'spec: 1.2.1'\n"
		tmp := runsc + ".new"
		if err := os.WriteFile(tmp, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, runsc); err != nil { // a new inode, as an install makes
			t.Fatal(err)
		}
	}
	ran := func() int { b, _ := os.ReadFile(calls); return strings.Count(string(b), "x") }
	write("test-1")
	m, err := Host("v1", runsc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.RunscVersion != "runsc version test-1" || m.MoatVersion != "v1" || m.Schema != 1 || m.Arch == "" || m.RunscID == "" {
		t.Fatalf("Host = %+v", m)
	}
	if len(m.CPUFeatures) == 0 {
		t.Error("no CPU features recorded")
	}
	if ran() != 1 {
		t.Fatalf("runsc ran %d times, want once", ran())
	}
	again, err := Host("v1", runsc, &m)
	if err != nil || again.RunscVersion != m.RunscVersion || ran() != 1 {
		t.Fatalf("Host with a manifest of the same runsc = %q, %v; ran runsc %d times, want once in all", again.RunscVersion, err, ran())
	}
	write("test-2")
	other, err := Host("v1", runsc, &m)
	if err != nil || other.RunscVersion != "runsc version test-2" || ran() != 2 {
		t.Fatalf("Host after runsc was replaced = %q, %v (ran %d times); want test-2 read afresh", other.RunscVersion, err, ran())
	}
	if ms := Compare(m, other, Checks{Moat: true, Guest: true}); len(ms) != 1 || ms[0].What != RunscVersion {
		t.Errorf("Compare of the two = %v, want the runsc version only", ms)
	}
	if _, err := Host("v1", filepath.Join(dir, "absent"), nil); err == nil {
		t.Error("Host with no runsc did not fail")
	}
}
