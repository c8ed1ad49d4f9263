package resources

import (
	"fmt"
	"time"
)

// The guest's OOM kill. All guest memory is gVisor's Sentry's, so when the
// sandbox's cgroup reaches its hard limit the kernel's OOM killer can only
// pick the Sentry, and the whole sandbox dies. moat makes the ceiling the
// guest's and keeps the kernel's limit above it:
//
//   - The cgroup's hard limit starts at the ceiling, which is what runsc
//     reads at start to size the guest (MemTotal = memory_max); once the
//     guest is up, the daemon raises it to the ceiling plus Headroom.
//   - The daemon's guard (daemon/resources.go) watches the group's working
//     set (usage less the file cache the kernel can drop) and, when it
//     reaches the ceiling, has the guest kill its largest process: an SSH
//     global request to the agent, answered in PID 1 (guest.OOMKill), so
//     no fork or exec competes with the runaway allocation for the
//     sandbox's CPU quota (a `sudo moat` session for it took a second).
//     gVisor gives freed guest memory back to the host at once, so the
//     working set falls and the sandbox keeps running.
//   - Below half the ceiling the guard sleeps on the kernel's notifier
//     (ArmAt, Notifier): a v1 memory threshold there, or on v2 a watch on
//     memory.events, which moves when usage passes memory.high (the soft
//     limit, at the ceiling without host pressure): an idle sandbox costs
//     the daemon a sample a minute. Above it the guard samples at
//     GuardWait's pace.
//   - The headroom is what the guest may allocate while the guard notices
//     and the kill runs; on v2 the soft limit (memory.high, at most the
//     ceiling) also throttles a runaway allocation above it, which buys
//     time. Only a guest that outruns all that meets the kernel's OOM
//     killer, as before, and the daemon records that the sandbox died of it.
//
// Measured here (2 cores, systrap): a guest allocates about 200 MB/s per
// CPU (page faults served by the Sentry), and a kill through the agent
// takes 10-120 ms; the peak usage seen in tests stayed 90-160 MiB under
// the hard limit.

// allocPerCPU is the allocation rate the guard plans for: above the
// ~200 MB/s per CPU measured in a guest, so that it samples early enough.
const allocPerCPU = 256 * MiB // bytes per second

// Headroom is how far above the ceiling the cgroup's hard limit sits: a
// second of allocation at allocPerCPU on half the sandbox's CPUs, at
// least 192 MiB (the kill's own session, sudo and the Sentry's and gofer's
// own memory live in it too).
func Headroom(l Limits) uint64 {
	return max(192*MiB, uint64(max(l.CPUs, 1))*allocPerCPU/2)
}

// Guard bounds: the guard never samples more often than guardMin (a read of
// one cgroup file each time) nor less often than guardMax.
const (
	guardMin = 20 * time.Millisecond
	guardMax = time.Second
)

// GuardWait is how long the guard may sleep before its next sample, with
// usageBytes charged now, under a ceiling of ceilingBytes, on cpus CPUs:
// the time the guest needs to allocate the distance at allocPerCPU on every
// CPU, within [guardMin, guardMax]. At or over the ceiling, guardMin.
func GuardWait(usageBytes, ceilingBytes uint64, cpus int) time.Duration {
	if usageBytes >= ceilingBytes {
		return guardMin
	}
	rate := uint64(max(cpus, 1)) * allocPerCPU
	d := time.Duration(float64(ceilingBytes-usageBytes) / float64(rate) * float64(time.Second))
	return min(max(d, guardMin), guardMax)
}

// ArmAt is where the guard arms its threshold notifier and stops sampling
// (where the host can notify: cgroup v1): half the ceiling. Below it an idle
// sandbox costs the daemon nothing; the kernel signals the crossing at once
// (it checks thresholds every 512 KiB charged), and from there the guard
// samples, sooner the nearer the ceiling (GuardWait).
func ArmAt(ceilingBytes uint64) uint64 { return ceilingBytes / 2 }

// DaemonOOMNote is what the sandbox's record says when the kernel's OOM
// killer took its daemon at the daemon group's limit of limitBytes: what
// happened, that nothing passed the gate unchecked, and what to do.
func DaemonOOMNote(name string, limitBytes uint64) string {
	return fmt.Sprintf("out of memory: the sandbox's daemon reached its memory limit (daemon_memory_max %s) and the kernel's OOM killer stopped it; "+
		"the sandbox stopped with it, so nothing left the guest unchecked. Start it again with: moat up %s; "+
		"if it happens again, raise daemon_memory_max under [sandbox] in moat.toml and apply it with: moat up --reconfigure %s",
		FormatMiB(limitBytes), name, name)
}
