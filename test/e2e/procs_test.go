package e2e

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The daemon serves on one processor once its sandbox runs, on a host of
// up to 4 CPUs, and leaves a GOMAXPROCS the user set alone.
func TestDaemonServesOnOneProcessor(t *testing.T) {
	if runtime.NumCPU() > 4 {
		t.Skipf("this host has %d CPUs: the daemon keeps them all here", runtime.NumCPU())
	}
	const line = `msg="serving on one processor"`
	logOf := func(name string) func() string {
		return func() string {
			b, _ := os.ReadFile(filepath.Join(moatHome, "state", "sandboxes", name, "daemon.log"))
			return string(b)
		}
	}
	// waitFor polls log until it holds want, for up to 10 s.
	waitFor := func(log func() string, want string) bool {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if strings.Contains(log(), want) {
				return true
			}
		}
		return false
	}

	dir := project(t, "procs-default")
	if r := moat(t, dir, nil, "up", "--name", "procs-default"); r.code != 0 {
		t.Fatalf("moat up: %s", r.stderr)
	}
	t.Cleanup(func() { moat(t, dir, nil, "destroy", "--yes", "procs-default") })
	if !waitFor(logOf("procs-default"), line) {
		t.Fatalf("the daemon never said it serves on one processor:\n%s", logOf("procs-default")())
	}
	// The switch comes after the start, never before it.
	if l := logOf("procs-default")(); strings.Index(l, line) < strings.Index(l, `msg="sandbox running"`) {
		t.Errorf("switched to one processor before the sandbox ran:\n%s", l)
	}

	userDir := project(t, "procs-user")
	if r := moat(t, userDir, []string{"GOMAXPROCS=2"}, "up", "--name", "procs-user"); r.code != 0 {
		t.Fatalf("moat up: %s", r.stderr)
	}
	t.Cleanup(func() { moat(t, userDir, nil, "destroy", "--yes", "procs-user") })
	if !waitFor(logOf("procs-user"), `msg="sandbox running"`) {
		t.Fatalf("no start in the log:\n%s", logOf("procs-user")())
	}
	// The first daemon logged its switch right after its start line; give
	// this one a second to show that it does not.
	time.Sleep(time.Second)
	if strings.Contains(logOf("procs-user")(), line) {
		t.Errorf("with GOMAXPROCS=2 set, the daemon still switched to one processor:\n%s", logOf("procs-user")())
	}
}
