package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunscPrecompiledFilters: the runsc moat runs installs the sentry's
// and the gofer's seccomp filters from programs compiled into it
// (scripts/setup.sh, internal/tools/runscfilters), at a start and at a
// resume, instead of compiling them then. runsc says which in its debug
// log (MOAT_DEBUG_RUNSC).
func TestRunscPrecompiledFilters(t *testing.T) {
	name := "seccomp-e2e"
	dir := project(t, name)
	env := []string{"MOAT_DEBUG_RUNSC=1"}
	run := func(args ...string) {
		t.Helper()
		if r := moat(t, dir, env, args...); r.code != 0 {
			t.Fatalf("moat %v: exit %d\nstderr: %s", args, r.code, r.stderr)
		}
	}
	run("up")
	run("suspend", name)
	run("resume", name)

	logs := filepath.Join(moatHome, "state", "sandboxes", name, "runsc-logs")
	for _, cmd := range []string{"boot", "gofer"} {
		files, _ := filepath.Glob(filepath.Join(logs, "*."+cmd+".txt"))
		// One for the start and one for the resume.
		if len(files) < 2 {
			t.Errorf("%d runsc %s logs in %s, want one for the start and one for the resume", len(files), cmd, logs)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			log := string(data)
			if i := strings.Index(log, "No precompiled program found"); i >= 0 {
				t.Errorf("runsc %s compiled its seccomp filter (%s): %s\nbuild runsc with ./scripts/setup.sh", cmd, f, line(log, i))
			} else if !strings.Contains(log, "Loaded precompiled seccomp instructions") {
				t.Errorf("runsc %s's log %s says nothing of its seccomp filter", cmd, f)
			}
		}
	}
}

// line is the line of s around index i.
func line(s string, i int) string {
	start := strings.LastIndexByte(s[:i], '\n') + 1
	end := strings.IndexByte(s[i:], '\n')
	if end < 0 {
		return s[start:]
	}
	return s[start : i+end]
}
