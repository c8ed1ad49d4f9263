package daemon

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"moat.dev/moat/internal/control"
)

// Idle stop: a forgotten sandbox gives its memory back. Every interval the
// daemon takes a sample; the sandbox is idle only if no session is
// attached, its processes used under a quarter of a core and under 32 KiB
// crossed its network in the interval. A sample that cannot be taken
// counts as busy: a sandbox is never stopped on a guess. After
// idle_timeout of consecutive idle samples the daemon records stop reason
// "idle" and stops; the next run, exec or shell starts it again (and the
// on_up hooks run again).

// Idle thresholds, per sample interval.
const (
	idleCPU      = 0.25     // cores, averaged over the interval
	idleNetBytes = 32 << 10 // both directions
)

// Knobs for tests, which cannot wait a minute per sample. Documented in
// the README; a user has idle_timeout.
const (
	IdleIntervalEnv = "MOAT_IDLE_INTERVAL" // sample interval, default 1m
	IdleTimeoutEnv  = "MOAT_IDLE_TIMEOUT"  // overrides idle_timeout, and may go below its 1m minimum
)

// idleSample is one interval's measurements.
type idleSample struct {
	OK       bool // false: something could not be read; counts as busy
	Sessions int
	CPU      float64 // cores used on average over the interval
	NetBytes uint64  // bytes in both directions over the interval
}

// idle is the rule for one sample.
func (s idleSample) idle() bool {
	return s.OK && s.Sessions == 0 && s.CPU < idleCPU && s.NetBytes < idleNetBytes
}

// idleClock counts how long a sandbox has been idle without a break.
type idleClock struct {
	since time.Time // start of the current idle run; zero when busy
}

// step takes the sample that ended at now and reports whether the sandbox
// has now been idle for at least timeout. The idle run starts at the
// beginning of the first idle interval (now - interval).
func (c *idleClock) step(now time.Time, interval time.Duration, s idleSample, timeout time.Duration) bool {
	if !s.idle() {
		c.since = time.Time{}
		return false
	}
	if c.since.IsZero() {
		c.since = now.Add(-interval)
	}
	return now.Sub(c.since) >= timeout
}

// idleGate orders the idle stop against sessions that start: once the
// daemon has decided to stop, no session may attach (the CLI then waits
// for the stop and starts the sandbox again), and a session that attached
// first keeps the sandbox up.
type idleGate struct {
	mu       sync.Mutex
	sessions int
	closing  bool
}

// enter counts a new session; false means the sandbox is stopping.
func (g *idleGate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return false
	}
	g.sessions++
	return true
}

func (g *idleGate) leave() {
	g.mu.Lock()
	g.sessions--
	g.mu.Unlock()
}

func (g *idleGate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sessions
}

// close marks the sandbox stopping if no session is attached.
func (g *idleGate) close() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sessions > 0 {
		return false
	}
	g.closing = true
	return true
}

// idleSettings are the interval and timeout in force; timeout 0: off.
func (d *daemon) idleSettings() (interval, timeout time.Duration) {
	interval = time.Minute
	if v, err := time.ParseDuration(os.Getenv(IdleIntervalEnv)); err == nil && v > 0 {
		interval = v
	}
	timeout = d.o.IdleTimeout
	if v, err := time.ParseDuration(os.Getenv(IdleTimeoutEnv)); err == nil && v > 0 {
		timeout = v
	}
	return interval, timeout
}

// watchIdle samples until ctx ends or the sandbox has been idle too long,
// then asks for the stop.
func (d *daemon) watchIdle(ctx context.Context) {
	interval, timeout := d.idleSettings()
	if timeout <= 0 {
		return
	}
	var clock idleClock
	cpu0, cpuOK := d.cpu()
	net0 := d.netBytes()
	t := time.NewTicker(interval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cpu1, ok := d.cpu()
			net1 := d.netBytes()
			s := idleSample{OK: ok && cpuOK, Sessions: d.sess.count()}
			if s.OK {
				s.CPU = (cpu1 - cpu0).Seconds() / now.Sub(last).Seconds()
			}
			s.NetBytes = net1 - net0
			cpu0, cpuOK, net0, last = cpu1, ok, net1, now
			clockDue := clock.step(now, interval, s, timeout)
			d.idleMu.Lock()
			d.lastSample, d.lastSampleAt = s, now
			d.idleSince = clock.since
			d.idleMu.Unlock()
			if clockDue && d.sess.close() {
				d.log.Info("stopping an idle sandbox", "idle_for", now.Sub(clock.since).Round(time.Second), "timeout", timeout)
				d.parkIdle(ctx) // suspend_idle.go: suspend, or stop
				return
			}
		}
	}
}

// netBytes is the bytes that crossed the guest's interface, both ways.
func (d *daemon) netBytes() uint64 {
	if d.stack == nil {
		return 0
	}
	var n uint64
	for _, info := range d.stack.Stack().NICInfo() {
		n += info.Stats.Rx.Bytes.Value() + info.Stats.Tx.Bytes.Value()
	}
	return n
}

// cpu is the sandbox's CPU time so far: the keeper's to read.
func (d *daemon) cpu() (time.Duration, bool) {
	if d.keeper == nil {
		return d.sandboxCPU()
	}
	h := d.host()
	return h.CPU, h.CPUOK
}

// clockTick is the kernel's USER_HZ, the unit of /proc/PID/stat times:
// 100 on every Linux architecture moat runs on.
const clockTick = 100

// sandboxCPU is the CPU time used so far by the shim and every process
// under it (runsc's sandbox and gofer, which run the whole guest). ok is
// false when the process tree could not be read.
func (d *daemon) sandboxCPU() (time.Duration, bool) {
	// The sandbox's cgroup holds exactly that tree and counts its CPU in
	// one file: a sample then costs one read, not one per host process.
	if d.group != nil {
		if ns, err := d.group.CPUUsage(); err == nil {
			return time.Duration(ns), true
		}
	}
	root := int(d.shimPID.Load())
	if root <= 0 {
		return 0, false
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	type proc struct {
		ppid  int
		ticks uint64
	}
	procs := map[int]proc{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone since the listing
		}
		ppid, ticks, ok := parseStat(b)
		if ok {
			procs[pid] = proc{ppid, ticks}
		}
	}
	if _, ok := procs[root]; !ok {
		return 0, false
	}
	// Sum over root's subtree: walk each process's ancestry.
	var total uint64
	inTree := map[int]bool{root: true}
	var under func(pid int, depth int) bool
	under = func(pid int, depth int) bool {
		if v, ok := inTree[pid]; ok {
			return v
		}
		p, ok := procs[pid]
		if !ok || pid <= 1 || depth > 64 {
			return false
		}
		v := under(p.ppid, depth+1)
		inTree[pid] = v
		return v
	}
	for pid, p := range procs {
		if under(pid, 0) {
			total += p.ticks
		}
	}
	return time.Duration(total) * time.Second / clockTick, true
}

// parseStat reads ppid and utime+stime from /proc/PID/stat. The command
// name is in parentheses and may hold spaces and parentheses itself, so
// fields are counted from the last ')'.
func parseStat(b []byte) (ppid int, ticks uint64, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// After the name: state(0) ppid(1) ... utime(11) stime(12).
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseUint(f[11], 10, 64)
	st, err3 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return ppid, ut + st, true
}

// activityStatus is the idle watchdog's view, for moat status.
func (d *daemon) activityStatus() *control.Activity {
	_, timeout := d.idleSettings()
	a := &control.Activity{NetBytes: d.netBytes(), IdleTimeout: timeout}
	d.idleMu.Lock()
	defer d.idleMu.Unlock()
	a.LastSample, a.LastCPU = d.lastSampleAt, d.lastSample.CPU
	if !d.idleSince.IsZero() {
		a.IdleFor = time.Since(d.idleSince)
	}
	if !d.lastSampleAt.IsZero() {
		a.Busy = d.lastSample.busyReason()
	}
	return a
}

// busyReason says why a sample was not idle; "" when it was.
func (s idleSample) busyReason() string {
	switch {
	case !s.OK:
		return "could not be measured"
	case s.Sessions > 0:
		return "a session is attached"
	case s.CPU >= idleCPU:
		return "CPU in use"
	case s.NetBytes >= idleNetBytes:
		return "network traffic"
	}
	return ""
}

// gateStatus is the gate's mode and watchers, for moat status.
func (d *daemon) gateStatus() *control.GateStatus {
	if d.net == nil {
		return nil
	}
	g := &control.GateStatus{Mode: "enforce", Watchers: d.net.holds.Watchers(), Holds: len(d.net.holds.Pending()),
		AuditLost: d.net.audit.Lost()}
	if err := d.net.audit.Failing(); err != nil {
		g.AuditFailing = err.Error()
	}
	if d.net.gate.Report() {
		g.Mode = "report"
	}
	return g
}
