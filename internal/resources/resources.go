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
// The daemon moves in before the shim starts, and every helper it starts
// from then on is born inside.
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
// its shim then stops the guest, so the guest is never left without its
// gate, and writes why into the sandbox's record, where `moat status`
// shows it. The Go runtime's own soft limit (GoMemLimit) makes the
// collector work harder well before.
//
// A killed daemon's groups. An empty cgroup is not removed by the kernel,
// and nothing of the daemon's runs after SIGKILL, so the shim, which is
// there anyway, outlives the daemon to remove both groups (Handover,
// Reap). A separate reaper process did this before; folding it into the
// shim saves that process's memory (its own anonymous memory and its
// share of the binary's pages; docs/benchmarks.md), which a reaper of its
// own, a smaller program, would have cost about as much as. The daemon
// starts the shim without a parent-death signal and hands it, after its
// socket, a pidfd of the daemon and the group lock (Handover). The shim
// learns of the daemon's death in two independent ways: the pidfd
// becomes readable when the daemon has exited however it went, and the
// daemon's end of the socket, which only the daemon holds (close-on-exec)
// and which it closes only after the shim has exited, hangs up. A
// parent-death signal checked against a changed parent, the reaper's
// second way, cannot serve: the shim is PID 1 of its namespace, to which
// getppid says 0 whoever its parent is, and a PID 1 drops a signal that
// comes before its runtime installed a handler, where a pidfd stays
// readable. The shim
// then at once kills every other process of its PID namespace (the guest
// must never run without its gate; a guest start that races the death is
// refused or killed), reaps them (at most 5 s), leaves the sandbox's
// group for the group the daemon came from (it cannot remove a group it
// is in, and must not stay in the daemon's), writes into the record if
// the kernel's OOM killer took the daemon, waits at most 10 s for the
// sandbox's group to empty, SIGKILLs what is still inside, removes it,
// then the daemon's group once the daemon's last helpers have gone
// (retrying for 5 s), and exits, releasing the lock. A shim that dies
// itself (a crash, SIGKILL) still takes its namespace with it; one that
// root stopped (SIGSTOP) acts on the daemon's death only once continued,
// where the kernel's parent-death SIGKILL would not have waited. A daemon
// that stops cleanly stops the shim first and removes both groups
// itself: no word passes. The group lock (cgroup.lock in the state dir)
// orders a dying sandbox's shim and the next daemon: Create takes it,
// the shim inherits the same open file (so it stays held after the
// daemon's death until the shim is done), and the next daemon's Create,
// and moat destroy, wait for it, so a shim never removes a group that a
// new daemon just made under the same name. A systemd-style scope was the
// alternative to all of it; it needs systemd, which this kind of host
// (and many containers) lacks.
//
// What covers which window. The shim covers a daemon's death from the
// moment it has read its plan until it exits: the guest's start, its
// run, a checkpoint being written (runsc checkpoint is killed with the
// rest and leaves no image: it is renamed into place only when whole), a
// restore, a stop's grace. No process of the sandbox is left to clean up
// after the other windows, only groups, which the next Create (moat up,
// or any start), moat destroy (RemoveStaleWait), and the admission of any
// other sandbox's start (RemoveStale of sandboxes without a daemon)
// remove: a daemon killed between Create and the shim's start, or during
// its own clean-up after the shim has gone; a shim killed together with
// its daemon; a host without pidfd_open (Linux before 5.3), where the
// shim keeps the parent-death SIGKILL and does not reap. A suspended
// sandbox has no process and no group (its stop removed them). Sandboxes
// without groups have nothing to remove: rootless moat where no cgroup
// can be written (NoLimits), whose shim keeps the parent-death SIGKILL,
// and the Docker runtime, whose sandboxes are containers the Docker
// engine runs: no moat daemon, no shim, and no cgroup of moat's.
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
