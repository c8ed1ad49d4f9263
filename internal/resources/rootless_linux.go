package resources

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/runsc/cgroup"
)

// NoLimits says why this process cannot make a sandbox's cgroups, or ""
// when it can. Root always can; an ordinary user (rootless moat) can only
// where the hierarchy Create writes is writable by them: never on cgroup
// v1, whose hierarchies are root's, and on v2 only when its /moat is (a
// delegated subtree elsewhere is not used yet). A sandbox started where it cannot runs without limits, and the
// start, moat status and moat doctor say so in these words; admission
// still counts it with its configured limits.
func NoLimits() string {
	if os.Geteuid() == 0 {
		return ""
	}
	if !cgroup.IsOnlyV2() {
		return "cgroup v1 can be written only by root, so moat without sudo cannot bound the sandbox's memory, CPU and processes; run moat with sudo for limits"
	}
	// Create makes /moat/<id> at the root of the v2 hierarchy.
	dir := filepath.Join(cgroupRoot, "moat")
	if _, err := os.Stat(dir); err != nil {
		dir = cgroupRoot
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		// A delegated subtree (systemd's user@.service) is not used yet:
		// Create makes its groups at the hierarchy's root.
		return fmt.Sprintf("%s is not writable by uid %d, so moat without sudo cannot bound the sandbox's memory, CPU and processes; run moat with sudo for limits", dir, os.Getuid())
	}
	return ""
}

// cgroupRoot is where the v2 hierarchy is mounted.
const cgroupRoot = "/sys/fs/cgroup"
