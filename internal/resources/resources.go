// Package resources keeps one sandbox from taking the host down: it applies
// the sandbox's CPU, memory and pids limits through a cgroup, decides
// whether a new sandbox fits in the host's RAM (admission), and moves each
// sandbox's memory soft limit with the host's memory pressure (elastic
// memory).
//
// Why gVisor's runsc/cgroup package. It is what runsc itself uses, it
// handles cgroup v1 (and v1/v2 hybrids) and pure v2 behind one interface,
// it serialises a group to JSON so another process (the shim) can join the
// very same group, and it is already in the build at the pinned gVisor
// version: no second cgroup library to keep in step. Letting runsc create
// the cgroup from the OCI spec alone was the alternative; it was rejected
// because runsc's group would outlive a SIGKILLed daemon (runsc --detach
// removes it only on `runsc delete`), the shim that is PID 1 of the
// sandbox's PID namespace would be outside it, and the daemon would have no
// handle to move the soft limit or read usage. So moat creates and owns the
// group, the shim joins it first thing (everything it starts, runsc's
// sandbox and gofer, is then inside), and runsc is pointed at the same
// group through linux.cgroupsPath instead of --ignore-cgroups: it finds the
// group already there, so it neither changes nor removes it, but reads its
// limits to size the guest (--cpu-num from the CPU quota, --total-memory
// from the memory ceiling), which is how `nproc` and /proc/meminfo inside
// show the limits.
//
// Where the group lives. On pure cgroup v2, at /sys/fs/cgroup/moat/<id>,
// like the cgroupfs driver of runc and Docker: a child of the daemon's own
// group is impossible there (a group with processes cannot delegate
// controllers). On v1 and hybrids, at moat/<id> under the daemon's own group
// in each hierarchy, which keeps the sandbox inside whatever the invoking
// user was confined to. <id> is the sandbox name and a hash of its state
// directory, so two MOAT_HOMEs never share a group.
//
// The daemon's group. The daemon holds what the guest makes it hold (the
// gate's buffers for the guest's connections: 600 downloads the guest
// never read grew one to 2.7 GiB), so it is bounded too, in a group of its
// own beside the sandbox's (<id>.daemon, made next to it, with only a
// memory limit: Limits.DaemonBytes, daemon_memory_max or DaemonLimit).
// The daemon moves in once the reaper runs, before the shim starts; the
// reaper joins it too, and every helper the daemon starts is born inside.
// The shim stays in the sandbox's group: it is PID 1 of the guest's PID
// namespace, its few MiB never grow with anything the guest does, and it
// must be there for runsc (on v1, linux.cgroupsPath "." is the shim's own
// group). A sibling with its own limit, rather than the daemon inside the
// sandbox's accounting (memory_max meaning the whole sandbox), because
// one must not starve the other: inside, a guest at its ceiling would
// drive the kernel's reclaim and OOM killer onto the daemon, whose death
// takes the sandbox down, and memory.high would throttle the gate with the
// guest; the daemon's buffers would come out of the guest's memory_max,
// while runsc sizes the guest (MemTotal) from the very same limit; and on
// v2 the daemon could not be in the group's leaf beside the guest anyway
// (a parent group for both would change the sandbox's group's path,
// which records on disk name). The cost: admission counts two limits per
// sandbox (admit.go). At the daemon's limit the kernel reclaims, then its
// OOM killer takes the daemon (by far the largest process in the group);
// the shim's parent-death signal then stops the guest, so the guest is
// never left without its gate, and the reaper writes why into the
// sandbox's record, where `moat status` shows it. The Go runtime's own
// soft limit (GoMemLimit) makes the collector work harder well before.
//
// A killed daemon's group. The shim's parent-death signal takes the
// sandbox down with a SIGKILLed daemon, but an empty cgroup is not removed
// by the kernel, and nothing of the daemon's can run after SIGKILL. So the
// daemon starts a reaper right after creating the group: the same binary
// (`moat __reaper DIR PID`), its child, in the daemon's group (never the
// sandbox's, which it must remove; it leaves the daemon's for the group it
// was born in before it removes that one) and its own session. The reaper
// holds the read end of a pipe whose write end only the daemon holds
// (close-on-exec, so no shim or runsc inherits it): end of file there
// means the daemon is gone, however it went. The reaper then waits, at
// most 10 s, for the group to empty, SIGKILLs whatever is still inside,
// removes the group and its record, and exits. Its parent-death signal
// (SIGTERM, from a thread the daemon locks for the reaper's life) is the
// second way it learns of the daemon's death, checked against a changed
// parent pid, so a reaper cannot outlive its daemon for long even if the
// pipe were somehow held open. A daemon that stops cleanly removes the
// sandbox's group itself, dismisses its reaper with one byte on the pipe,
// then leaves and removes its own group (after a failed removal it only
// leaves, and the reaper retries both once the daemon has exited). The
// group lock (cgroup.lock in the state dir) orders the two: Create takes
// it, the reaper inherits the same open file (so it stays held after the
// daemon's death until the reaper is done), and the next daemon's Create
// waits for it, so a reaper never removes a group that a new daemon just
// made under the same name. A systemd-style scope was the alternative;
// it needs systemd, which this kind of host (and many containers) lacks.
// `moat up` still removes a group recorded by a sandbox with no daemon and
// no reaper (the reaper itself killed, say).
//
// The soft limit is memory.high on v2 (the kernel throttles and reclaims
// above it) and memory.soft_limit_in_bytes on v1 (reclaimed first under
// global pressure). The hard limit, memory.max / memory.limit_in_bytes, is
// the ceiling while runsc sizes the guest, then the ceiling plus a headroom
// in which the daemon's OOM guard kills the guest's largest process
// (oom.go); only past it does the kernel's OOM killer act, inside the group
// only, so the daemon, in its own group, is untouched either way. On v2 the
// baseline is also memory.low, so the kernel protects it from reclaim.
//
// The decisions (admission, the elastic target) are pure functions in
// admit.go and elastic.go; the cgroup and /proc I/O is in the _linux.go
// files beside them.
package resources

import (
	"fmt"

	"moat.dev/moat/internal/config"
)

// MiB is 1<<20 bytes.
const MiB = 1 << 20

// Limits are one sandbox's resource limits.
type Limits struct {
	CPUs          int    // CPU quota in whole CPUs
	BaselineBytes uint64 // soft limit floor: what elastic memory never goes below
	CeilingBytes  uint64 // hard limit: past it, the guest is OOM-killed
	PidsMax       int    // the guest's processes (RLIMIT_NPROC); the host's pids.max is HostPids(PidsMax)
	DaemonBytes   uint64 // the daemon group's memory limit: daemon_memory_max, else DaemonLimit(CeilingBytes)
}

// The daemon group's derived limit is a fixed base plus a share of
// memory_max. The base is the daemon itself: its start (the policy's
// compile, the CA, the guest's first handshakes) and an idle gate, with
// room to spare (docs/resources.md has the measured figures). The share
// is the gate's traffic: its per-sandbox caps (connections, pending DNS,
// held flows) grow with memory_max, so what it may buffer does too.
const (
	daemonBaseBytes = 128 * MiB
	daemonShare     = 16 // memory_max/16: 256 MiB more at the default 4 GiB
)

// DaemonLimit is the daemon group's memory limit for a sandbox whose
// memory_max is ceilingBytes, when daemon_memory_max does not set it.
func DaemonLimit(ceilingBytes uint64) uint64 {
	return daemonBaseBytes + ceilingBytes/daemonShare
}

// GoMemLimit is the Go runtime's soft memory limit (debug.SetMemoryLimit)
// for a daemon whose group is limited to limitBytes: three quarters of
// it, so the collector works harder well before the kernel's limit, and a
// quarter stays for what the kernel charges the group beside the Go heap
// (socket buffers on cgroup v2, the page cache of the logs it writes,
// thread stacks).
func GoMemLimit(limitBytes uint64) int64 { return int64(limitBytes / 4 * 3) }

// FromConfig takes the limits of a configuration's [sandbox]; zero values
// (a snapshot older than these keys) get the built-in defaults.
func FromConfig(s config.Sandbox) Limits {
	d := config.Defaults().Sandbox
	l := Limits{CPUs: s.CPUs, BaselineBytes: s.MemoryBytes, CeilingBytes: s.MemoryMaxBytes, PidsMax: s.PidsMax}
	if l.CPUs <= 0 {
		l.CPUs = d.CPUs
	}
	if l.CeilingBytes == 0 {
		l.CeilingBytes = d.MemoryMaxBytes
	}
	if l.BaselineBytes == 0 {
		l.BaselineBytes = min(d.MemoryBytes, l.CeilingBytes)
	}
	if l.BaselineBytes > l.CeilingBytes {
		l.BaselineBytes = l.CeilingBytes
	}
	if l.PidsMax <= 0 {
		l.PidsMax = d.PidsMax
	}
	l.DaemonBytes = s.DaemonMemoryMaxBytes
	if l.DaemonBytes == 0 {
		l.DaemonBytes = DaemonLimit(l.CeilingBytes)
	}
	return l
}

// cpuPeriodUs is the CFS period: the kernel's default, 100 ms.
const cpuPeriodUs = 100000

// FormatMiB prints bytes as MiB, or GiB when whole.
func FormatMiB(b uint64) string {
	if b >= 1<<30 && b%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", b>>30)
	}
	return fmt.Sprintf("%d MiB", b/MiB)
}
