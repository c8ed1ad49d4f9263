package roles

import (
	"fmt"
	"os"
	"runtime/debug"
)

// Version is moat's version, set at build time with -ldflags
// "-X moat.dev/moat/internal/roles.Version=..." (scripts/setup.sh): here
// rather than in internal/cli so that moat and moat-sandbox carry one.
var Version = "dev"

// MoatVersion is moat's version as saved images record it
// (checkpoint.Manifest) and as moat and its daemon compare it
// (SameBuild): a dev build adds its source revision, so that two dev
// builds of different code do not pass for one.
func MoatVersion() string {
	if Version != "dev" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Version
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return Version
	}
	return Version + "-" + rev + dirty
}

// BuildEnv carries the build of the moat that starts a daemon
// (MoatVersion) to it: the daemon's moat-sandbox must be of the same
// build, since the two hand each other pipes, environment and state files
// in forms that only one build is sure to agree on.
const BuildEnv = "MOAT_BUILD"

// SameBuild refuses a daemon whose moat was another build (cliBuild, from
// BuildEnv; "" when it was not started by moat): a moat-sandbox left from
// an older install beside a new moat, say.
func SameBuild(cliBuild string) error {
	own := MoatVersion()
	if cliBuild == own {
		return nil
	}
	exe, _ := os.Executable()
	if cliBuild == "" {
		return fmt.Errorf("%s %s is started by moat (moat up), never by hand", exe, DaemonRole)
	}
	return fmt.Errorf("%s is build %s, but the moat that started it is build %s; moat and moat-sandbox must come from one build: install them together (sudo scripts/setup.sh builds all of moat's binaries into ./bin of its source tree)", exe, own, cliBuild)
}
