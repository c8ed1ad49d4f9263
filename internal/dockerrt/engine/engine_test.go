package engine

import (
	"testing"

	"github.com/docker/docker/api/types/system"
)

// Only runsc registered without --overlay2=none loses a workload's
// writes at its stop, which up warns of.
func TestRuntimeKeepsWrites(t *testing.T) {
	runsc := func(args ...string) system.Info {
		return system.Info{Runtimes: map[string]system.RuntimeWithStatus{
			"runc":  {Runtime: system.Runtime{Path: "runc"}},
			"runsc": {Runtime: system.Runtime{Path: "/usr/bin/runsc", Args: args}},
		}}
	}
	for _, tc := range []struct {
		name    string
		info    system.Info
		runtime string
		want    bool
	}{
		{"runc", runsc(), "runc", true},
		{"runsc with --overlay2=none", runsc("--debug", "--overlay2=none"), "runsc", true},
		{"runsc with no arguments", runsc(), "runsc", false},
		{"runsc with another overlay", runsc("--overlay2=root:memory"), "runsc", false},
	} {
		if got := runtimeKeepsWrites(tc.info, tc.runtime); got != tc.want {
			t.Errorf("%s: runtimeKeepsWrites = %v, want %v", tc.name, got, tc.want)
		}
	}
}
