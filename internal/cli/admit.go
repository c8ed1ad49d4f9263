package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/state"
)

// limitsOf reads a sandbox's limits from its configuration snapshot. A
// snapshot that cannot be read is the zero configuration, which
// FromConfig counts with the default limits (a 4 GiB ceiling), never as
// nothing: admission must not let a sandbox in because another's record
// is damaged (TestLimitsOfDamagedSnapshot).
func limitsOf(r *state.Record) resources.Limits {
	cfg, _ := r.Snapshot()
	return resources.FromConfig(cfg.Sandbox)
}

// holdsMemory says whether a sandbox in the effective state st counts in
// admission: its daemon lives and its guest runs or is about to.
func holdsMemory(st string) bool { return state.Live(st) }

// admit checks, under the host-wide admission lock, that the sandbox in dir
// fits next to the running ones (resources.Admit: each counts its
// memory_max and its daemon's limit), and removes the cgroups
// that killed daemons of stopped sandboxes left. It returns the lock's
// release, which the caller calls once the new daemon has taken its place
// among the running (admitted), or when its start has failed.
func (e *env) admit(dir string) (release func(), err error) {
	lock := resources.LockHost
	if rootless() {
		lock = func() (func(), error) { return resources.LockAt(filepath.Join(e.dirs.State, "admission.lock")) }
	}
	unlock, err := lock()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			unlock()
		}
	}()
	self, err := state.Load(dir)
	if err != nil {
		return nil, err
	}
	recs, err := state.List(e.dirs)
	if err != nil {
		return nil, err
	}
	var running []resources.Running
	for _, r := range recs {
		if r.Name == self.Name {
			continue
		}
		d := e.dirs.Sandbox(r.Name)
		if st, _ := state.Effective(r, d); holdsMemory(st) {
			l := limitsOf(r)
			running = append(running, resources.Running{Name: r.Name, CeilingBytes: l.CeilingBytes, DaemonBytes: l.DaemonBytes})
		} else {
			// No daemon: a group it left is garbage (a live daemon
			// removes its own).
			resources.RemoveStale(d)
		}
	}
	ram, err := resources.HostRAM()
	if err != nil {
		return nil, err
	}
	reserve, err := resources.HostReserve(ram)
	if err != nil {
		return nil, withCode(ExitUsage, err)
	}
	l := limitsOf(self)
	if err := resources.Admit(resources.Running{Name: self.Name, CeilingBytes: l.CeilingBytes, DaemonBytes: l.DaemonBytes}, running, ram, reserve); err != nil {
		return nil, withCode(ExitHost, err)
	}
	return unlock, nil
}

// releaseWhenStarted releases the admission lock once the daemon started
// after since has recorded itself as starting (from then on it counts as
// running for the next admission), or when done closes.
func releaseWhenStarted(dir string, since time.Time, release func(), done <-chan struct{}) {
	defer release()
	deadline := time.After(2 * time.Minute)
	for {
		if r, err := state.Load(dir); err == nil && r.DaemonPID > 0 && !r.Started.Before(since) {
			return
		} else if errors.Is(err, os.ErrNotExist) {
			return
		}
		select {
		case <-done:
			return
		case <-deadline:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// mib prints bytes in MiB for the tables.
func mib(b uint64) string {
	if b == ^uint64(0) {
		return "max"
	}
	return fmt.Sprintf("%dMiB", b/resources.MiB)
}

// resourceColumns are `moat list`'s CPU and MEMORY columns: the CPU quota
// and the CPU time used; memory usage/soft limit/ceiling.
func resourceColumns(r *control.Resources) (cpu, mem string) {
	if r == nil {
		return "-", "-"
	}
	return fmt.Sprintf("%d (%.0fs)", r.CPUs, r.CPUSeconds),
		fmt.Sprintf("%s/%s/%s", mib(r.MemoryUsageBytes), mib(r.MemoryLimitBytes), mib(r.MemoryCeilingBytes))
}

// printResources is `moat status`'s resource lines.
func printResources(out io.Writer, r *control.Resources) {
	if r == nil {
		return
	}
	pressure := "n/a on cgroup v1"
	if r.MemoryPressure >= 0 {
		pressure = fmt.Sprintf("%.2f%%", r.MemoryPressure)
	}
	fmt.Fprintf(out, "cpu:        %d CPUs, %.1fs used\n", r.CPUs, r.CPUSeconds)
	fmt.Fprintf(out, "memory:     %s used, soft limit %s, baseline %s, ceiling %s\n",
		mib(r.MemoryUsageBytes), mib(r.MemoryLimitBytes), mib(r.MemoryBaselineBytes), mib(r.MemoryCeilingBytes))
	fmt.Fprintf(out, "pressure:   sandbox %s, host %s\n", pressure, r.HostPressure)
	fmt.Fprintf(out, "oom kills:  %d in the guest, the sandbox kept running; %d by the host's kernel (hard limit reached %d times)\n", r.GuestOOMKills, r.OOMKills, r.LimitHits)
	if r.LastGuestOOMKill != "" {
		fmt.Fprintf(out, "last oom:   %s\n", r.LastGuestOOMKill)
	}
	fmt.Fprintf(out, "pids:       %d of %d\n", r.Pids, r.PidsMax)
	if r.DaemonMemoryLimitBytes > 0 {
		fmt.Fprintf(out, "daemon:     %s used of %s (its own cgroup: daemon_memory_max)\n", mib(r.DaemonMemoryUsageBytes), mib(r.DaemonMemoryLimitBytes))
	}
}
