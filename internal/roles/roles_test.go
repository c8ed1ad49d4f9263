package roles

import (
	"slices"
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
		if got := RoleMain(args); got != exitUsage {
			t.Errorf("RoleMain(%q) = %d, want %d", args, got, exitUsage)
		}
	}
}

// A daemon runs only for a moat of its own build, which says so in
// BuildEnv.
func TestSameBuild(t *testing.T) {
	own := MoatVersion()
	if err := SameBuild(own); err != nil {
		t.Errorf("SameBuild(own build %q) = %v, want nil", own, err)
	}
	for _, tc := range []struct{ cli, want string }{
		{"", "started by moat"},
		{own + "-other", "build " + own + "-other"},
	} {
		err := SameBuild(tc.cli)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SameBuild(%q) = %v, want an error saying %q", tc.cli, err, tc.want)
		}
	}
	if err := SameBuild(own + "-other"); err == nil || !strings.Contains(err.Error(), "scripts/setup.sh") {
		t.Errorf("sameBuild of another build = %v, want it to say how to install both", err)
	}
}

// The keeper starts on one processor unless the user chose a number, and
// says that the choice was moat's, so that its children do not inherit it.
func TestKeeperEnviron(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
	}{
		{[]string{"PATH=/bin"}, []string{"PATH=/bin", "GOMAXPROCS=1", keeperProcsEnv + "=1"}},
		{[]string{"PATH=/bin", "GOMAXPROCS=2"}, []string{"PATH=/bin", "GOMAXPROCS=2"}},
		{[]string{"GOMAXPROCS="}, []string{"GOMAXPROCS="}},
	} {
		if got := KeeperEnviron(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("KeeperEnviron(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
