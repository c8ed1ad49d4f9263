package cli

import (
	"strings"
	"testing"
)

// moat-sandbox run by hand, or with a word that is no role, exits 2
// (bad usage) without running anything.
func TestRoleMainRefuses(t *testing.T) {
	for _, args := range [][]string{
		{"moat-sandbox"},
		{"moat-sandbox", "run"},
		{"moat-sandbox", "--help"},
	} {
		if got := RoleMain(args); got != ExitUsage {
			t.Errorf("RoleMain(%q) = %d, want %d", args, got, ExitUsage)
		}
	}
}

// A daemon runs only for a moat of its own build, which says so in
// buildEnv.
func TestSameBuild(t *testing.T) {
	own := moatVersion()
	if err := sameBuild(own); err != nil {
		t.Errorf("sameBuild(own build %q) = %v, want nil", own, err)
	}
	for _, tc := range []struct{ cli, want string }{
		{"", "started by moat"},
		{own + "-other", "build " + own + "-other"},
	} {
		err := sameBuild(tc.cli)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("sameBuild(%q) = %v, want an error saying %q", tc.cli, err, tc.want)
		}
	}
	if err := sameBuild(own + "-other"); err == nil || !strings.Contains(err.Error(), "scripts/setup.sh") {
		t.Errorf("sameBuild of another build = %v, want it to say how to install both", err)
	}
}
