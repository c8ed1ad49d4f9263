// Package runtime starts a sandbox's guest under gVisor: it lays out the
// root filesystem, the network namespace with its one TAP device, and the
// OCI bundle, and runs runsc.
//
// The work is split in two so that nothing survives a killed daemon. The
// daemon starts a shim (the same binary) as PID 1 of fresh PID, mount and
// network namespaces. The shim mounts the overlays, creates tap0, hands
// the TAP fd to the daemon, starts the sandbox with `runsc run --detach`
// and stays as the parent of runsc's sandbox and gofer until the sandbox
// exits. If the daemon dies, even by SIGKILL, the PID namespace's other
// processes are killed at once, and the namespaces — with every mount and
// the TAP device in them — go away with their last process, the shim. A
// sandbox without cgroups has the kernel do it: the shim has a
// parent-death SIGKILL, and the namespace's processes die with their PID
// 1. A sandbox with cgroups has its shim do it, because the shim then
// outlives the daemon to remove the groups (resources.Reap): it learns of
// the daemon's death from a pidfd and from its socket's hang-up, kills
// every other process of its namespace, reaps them, and removes the
// groups; whatever stops the shim (a crash, SIGKILL) still takes the
// namespace down with it.
//
// The same holds for the writable layer's disk image (internal/disk): the
// shim attaches it to a loop device that detaches itself once unmounted
// (LO_FLAGS_AUTOCLEAR) and mounts it only in its own mount namespace, so
// the image is unmounted and its loop device freed when the namespace
// goes, however the shim ended. What the shim sets up, and what frees it:
//
//	cgroup             the daemon, or the shim once the daemon is gone
//	/proc, overlays    the mount namespace, with its last process
//	disk image mount   the mount namespace, with its last process
//	loop device        autoclear, when the image's mount goes
//	tap0               the network namespace, with its last process
//	runsc's processes  the PID namespace, with the shim (its PID 1)
package runtime

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"moat.dev/moat/internal/disk"
)

// Share is a host path mounted into the guest.
type Share struct {
	Source string `json:"source"`
	Target string `json:"target"`
	RW     bool   `json:"rw"`
}

// Plan is everything the shim needs, written by the daemon to the sandbox's
// state dir as shim.json before each start.
type Plan struct {
	ID        string   `json:"id"`        // runsc container id
	StateDir  string   `json:"state_dir"` // the sandbox's state directory
	Runsc     string   `json:"runsc"`     // path of the runsc binary
	Moat      string   `json:"moat"`      // path of this binary, mounted read-only at /.moat/moat
	GuestDir  string   `json:"guest_dir"` // host dir mounted read-only at /.moat (guest.json, host key)
	Hostname  string   `json:"hostname"`
	Image     string   `json:"image"`     // "host" or an OCI ref (for logs)
	Layers    []string `json:"layers"`    // OCI image layers, lowest first; empty for the host image
	Env       []string `json:"env"`       // image environment for init
	Workspace string   `json:"workspace"` // project dir, mounted read-write at the same path
	Shares    []Share  `json:"shares"`
	Debug     bool     `json:"debug"` // runsc --debug logs into the state dir
	// Cgroup is the sandbox's cgroup (resources.Group.JSON), which the
	// shim joins before it starts anything; CgroupsPath is what runsc gets
	// as linux.cgroupsPath to find that same group and size the guest
	// from its limits. Without them runsc runs with --ignore-cgroups.
	Cgroup      json.RawMessage `json:"cgroup,omitempty"`
	CgroupsPath string          `json:"cgroups_path,omitempty"`
	// Reap is the groups as the shim removes them if the daemon is
	// killed (resources.Handover); with it, the shim has the daemon's
	// pidfd and the group lock at ShimDaemonFD and ShimLockFD, and no
	// parent-death signal: it stops the guest itself.
	Reap json.RawMessage `json:"reap,omitempty"`
	// PidsMax is also the guest's RLIMIT_NPROC, so a fork bomb of the
	// agent user fails with EAGAIN inside the guest; 0: no limit.
	PidsMax int `json:"pids_max,omitempty"`
	// Platform is runsc's --platform (ChoosePlatform); "" is systrap.
	Platform string `json:"platform,omitempty"`
	// DiskLimit is [sandbox] disk in bytes, 0 when not set (a new image
	// then gets disk.Default); DiskUnlimited is disk = "unlimited": no
	// image, the writable layer directly in the state dir.
	DiskLimit     uint64 `json:"disk_limit,omitempty"`
	DiskUnlimited bool   `json:"disk_unlimited,omitempty"`
	// DiskFrom is the config file that set disk, for errors.
	DiskFrom string `json:"disk_from,omitempty"`
	// DiskTemplates holds the pristine images new ones are copied from
	// (disk.Prepare); "": each is made with mkfs.ext4.
	DiskTemplates string `json:"disk_templates,omitempty"`
	// Disk: PrepareDisk made the image, and the shim mounts it on
	// StateDir/disk to hold upper/, work/ and root/.
	Disk bool `json:"disk,omitempty"`
	// Restore is a checkpoint image (SuspendDir) the shim brings the
	// guest back from, with `runsc restore`, instead of booting it; ""
	// boots it (suspend_linux.go).
	Restore string `json:"restore,omitempty"`
	// Standby: the shim creates runsc's sandbox before the daemon's
	// word, so that a restore is all that is left when it comes
	// (daemon/standby.go).
	Standby bool `json:"standby,omitempty"`
	// Rootless: the shim runs as root of a user namespace an ordinary
	// user made (internal/userns), not as the host's root. Overlays then
	// need userxattr, and what the shim and runsc leave in the state dir
	// belongs to a subordinate id the daemon cannot remove. Set by the
	// shim itself, from how it was started.
	Rootless bool `json:"-"`
}

// Paths inside a sandbox's state dir. These names are on disk: frozen.
// upper, work and root hold what the guest writes: in the disk image's
// mount when there is one, else in the state dir itself (disk =
// "unlimited", and sandboxes made before disk limits until their first
// start with one). merged holds only mount points.
func (p *Plan) upper() string   { return filepath.Join(p.layerDir(), "upper") }
func (p *Plan) work() string    { return filepath.Join(p.layerDir(), "work") }
func (p *Plan) merged() string  { return filepath.Join(p.StateDir, "merged") }
func (p *Plan) rootDir() string { return filepath.Join(p.layerDir(), "root") }

func (p *Plan) layerDir() string {
	if p.Disk {
		return filepath.Join(p.StateDir, disk.MountName)
	}
	return p.StateDir
}

// RunscRoot is runsc's --root for this sandbox.
func RunscRoot(stateDir string) string { return filepath.Join(stateDir, "runsc") }

// BundleDir holds config.json.
func BundleDir(stateDir string) string { return filepath.Join(stateDir, "bundle") }

// WritePlan stores the plan for the shim.
func WritePlan(path string, p *Plan) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding shim plan: %w", err)
	}
	return os.WriteFile(path, b, 0o600)
}

// ReadPlan loads a plan.
func ReadPlan(path string) (*Plan, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading shim plan: %w", err)
	}
	var p Plan
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("parsing shim plan %s: %w", path, err)
	}
	return &p, nil
}

// runscArgs are RunscArgs for this plan: without --ignore-cgroups when the
// sandbox has its own cgroup.
func (p *Plan) runscArgs(debug bool) []string {
	a := RunscArgs(p.StateDir, p.Platform, debug)
	if p.CgroupsPath == "" {
		return a
	}
	out := a[:0:0]
	for _, f := range a {
		if f != "--ignore-cgroups" {
			out = append(out, f)
		}
	}
	return out
}

// RunscArgs are the global flags every runsc call for this sandbox uses,
// on platform (ChoosePlatform's; "" is systrap).
func RunscArgs(stateDir, platform string, debug bool) []string {
	a := []string{
		"--root=" + RunscRoot(stateDir),
		"--platform=" + cmp.Or(platform, PlatformSystrap),
		"--network=sandbox", // gVisor's netstack owns tap0; the host kernel routes nothing
		"--overlay2=none",   // our own overlay holds the writable layer, so it survives down/up
		"--ignore-cgroups",  // dropped when moat made the sandbox's cgroup (Plan.runscArgs)
		"--host-uds=none",   // no host unix sockets reachable (threat model 8)
		"--allow-suid",      // sudo in the guest: it elevates to root of the guest kernel only
		"--log-format=text",
		// tap0's frames go to the daemon through a local fd: no queueing
		// discipline and no processor goroutines between the socket and
		// the stack (each is a goroutine hand-off, and on a virtualised
		// two-core host every wake-up costs), no checksums (the daemon
		// neither checks nor computes them either).
		"--qdisc=none",
		"--network-processors-per-channel=1",
		"--tx-checksum-offload",
	}
	if debug {
		a = append(a, "--debug", "--debug-log="+filepath.Join(stateDir, "runsc-logs")+"/")
	}
	return a
}
