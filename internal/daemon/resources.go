package daemon

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/state"
)

// elasticEvery is how often the elastic loop samples: PSI's avg10 is a
// 10 s window, so sampling twice per window follows it without chasing
// noise, at a few small file reads per sample.
const elasticEvery = 5 * time.Second

// startGroup makes the sandbox's cgroup and puts it in the shim's plan,
// moves the daemon into its own group beside it, and hands both to the
// shim, which removes them if this daemon is killed (see the resources
// package doc). It returns the groups' removal, to run once the shim has
// exited.
func (d *daemon) startGroup() (func(), error) {
	if d.o.Limits == nil {
		return func() {}, nil
	}
	// Rootless where no cgroup can be written: no limits, said plainly
	// (the CLI says it too); RLIMIT_NPROC in the guest needs none.
	if why := resources.NoLimits(); why != "" {
		d.log.Warn("no resource limits", "why", why)
		d.o.Plan.PidsMax = d.o.Limits.PidsMax
		d.o.Limits = nil
		return func() {}, nil
	}
	g, err := resources.Create(d.o.Dir, *d.o.Limits)
	if err != nil {
		return nil, err
	}
	b, err := g.JSON()
	if err == nil {
		// Fail closed: a daemon that cannot be bounded does not start a
		// guest that could grow it without limit.
		err = g.JoinDaemon()
	}
	if err != nil {
		g.Remove(d.o.Dir)
		g.RemoveDaemon(d.o.Dir)
		g.Release()
		return nil, err
	}
	debug.SetMemoryLimit(resources.GoMemLimit(d.o.Limits.DaemonBytes))
	d.log.Info("daemon cgroup joined", "limit_mib", d.o.Limits.DaemonBytes/resources.MiB,
		"go_limit_mib", resources.GoMemLimit(d.o.Limits.DaemonBytes)/resources.MiB)
	d.group = g
	d.o.Plan.Cgroup, d.o.Plan.CgroupsPath, d.o.Plan.PidsMax = b, g.RunscPath(), d.o.Limits.PidsMax
	h, err := g.Handover()
	if err != nil {
		// The shim then keeps its parent-death SIGKILL: the guest still
		// dies with this daemon, and the groups wait for the next start.
		d.log.Warn("the shim cannot remove the cgroups if this daemon is killed; the next moat up or moat destroy would", "err", err)
	} else {
		d.o.Plan.Reap, d.shimFiles = h.Plan, h.Files
	}
	return func() {
		// The OOM killer acts on the host's view: the guest's memory is
		// the sentry's, so at the ceiling it is the sandbox as a whole
		// that goes. Say so in the record, where status shows it, before
		// the group and its counters are gone.
		if s, err := g.Stats(); err == nil && s.OOMKills > 0 {
			note := fmt.Sprintf("out of memory: the sandbox reached its memory ceiling (memory_max %s) and the kernel's OOM killer stopped it (%d OOM kills); raise memory_max or use less memory",
				resources.FormatMiB(d.o.Limits.CeilingBytes), s.OOMKills)
			d.log.Warn("sandbox OOM-killed at its ceiling", "oom_kills", s.OOMKills)
			d.updateRecord(func(r *state.Record) error {
				if r.Error == "" {
					r.Error = note
				} else {
					r.Error += "; " + note
				}
				return nil
			})
		}
		if err := g.Remove(d.o.Dir); err != nil {
			d.log.Warn("removing the sandbox's cgroup; the next moat up or moat destroy retries", "err", err)
		}
		if err := g.RemoveDaemon(d.o.Dir); err != nil {
			d.log.Warn("removing the daemon's cgroup; the next moat up or moat destroy retries", "err", err)
		}
		h.Close()
		g.Release()
	}, nil
}

// elastic moves the group's soft limit with the host's memory pressure
// (resources.Target) until ctx ends.
func (d *daemon) elastic(ctx context.Context) {
	if d.group == nil {
		return
	}
	every := elasticEvery
	if v, err := time.ParseDuration(os.Getenv(resources.EnvTestTick)); err == nil && v > 0 {
		every = v
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h, err := resources.SampleHost()
		if err != nil {
			d.log.Warn("sampling host memory pressure", "err", err)
			continue
		}
		usage, soft, some := d.group.MemSample()
		l := d.o.Limits
		g := resources.GuestSample{SomeAvg10: some, UsageBytes: usage,
			BaselineBytes: l.BaselineBytes, CeilingBytes: l.CeilingBytes, SoftBytes: soft}
		d.hostLevel.Store(int32(resources.HostLevel(h)) + 1)
		if want := resources.Target(h, g); want != min(soft, l.CeilingBytes) {
			if err := d.group.SetSoft(want); err != nil {
				d.log.Warn("setting the soft memory limit", "err", err)
				continue
			}
			d.log.Info("soft memory limit moved", "from_mib", min(soft, l.CeilingBytes)/resources.MiB,
				"to_mib", want/resources.MiB, "host", resources.HostLevel(h).String(), "usage_mib", usage/resources.MiB)
		}
	}
}

// oomGuard is what the OOM guard has done, for status.
type oomGuard struct {
	mu    sync.Mutex
	kills int
	last  string
}

// killGap is the least time between two guest OOM kills, and killSettle
// how long after a kill the guard waits for the killed process's memory
// to show as given back before it judges the guest still over its
// ceiling. gVisor gives it back within milliseconds on a quiet host, but
// on a loaded one the next samples still counted it, and the guard killed
// an innocent process (CI did). Within killSettle a second kill needs the
// working set to have dropped by half the victim's size first: the kill
// took effect, and what is left over the ceiling is someone else's. The
// headroom above the ceiling covers the wait.
const (
	killGap    = 100 * time.Millisecond
	killSettle = 2 * time.Second
)

// guardOOM keeps the guest's memory ceiling inside the sandbox (see the
// resources package's oom.go): it raises the cgroup's hard limit to the
// ceiling plus resources.Headroom, then samples the group's usage, sooner
// the nearer it is to the ceiling, and when the working set has reached
// the ceiling kills the guest's largest process. Until ctx ends.
func (d *daemon) guardOOM(ctx context.Context) {
	if d.group == nil {
		return
	}
	l := d.o.Limits
	hard := l.CeilingBytes + resources.Headroom(*l)
	if err := d.group.SetHard(hard); err != nil {
		// The ceiling stays the kernel's: the sandbox dies whole at it.
		d.log.Warn("raising the cgroup's hard limit above the ceiling; the guest's OOM kills will stop the whole sandbox", "err", err)
		return
	}
	d.log.Info("guest OOM guard on", "ceiling_mib", l.CeilingBytes/resources.MiB, "hard_limit_mib", hard/resources.MiB)
	// The benchmark's knob: "off" (the hard limit stays raised, nothing
	// samples), or a fixed sampling period.
	knob := os.Getenv(resources.EnvTestGuard)
	if knob == "off" {
		return
	}
	fixed, _ := time.ParseDuration(knob)
	// Below half the ceiling the guard sleeps on the kernel's notifier
	// (v1: the threshold at half the ceiling; v2: memory.events, which
	// moves when usage passes the soft limit or the hard limit), waking
	// at least once a minute; without one it samples at GuardWait's pace
	// throughout.
	arm := resources.ArmAt(l.CeilingBytes)
	n, err := d.group.NotifyAt(arm)
	if err == nil {
		// Closing it ends a wait on it at once: the guard stops with ctx,
		// not up to a minute later.
		defer context.AfterFunc(ctx, n.Close)()
		defer n.Close()
	} else {
		d.log.Warn("no memory notifier; the OOM guard samples instead", "err", err)
		n = nil
	}
	t := time.NewTimer(0)
	defer t.Stop()
	var lastKill time.Time
	var atKill, victim uint64 // the working set the last kill was for, and the victim's size
	fired := false            // the notifier's last wait ended by its firing
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		u := d.group.Usage()
		if n != nil && fixed == 0 && u < arm {
			if fired {
				// It fired and usage is still below: before the next
				// wait, GuardWait's time (what the guest needs to reach
				// the ceiling from here), so that a notifier that keeps
				// firing (v2's memory.events while host pressure holds
				// the soft limit down) costs no more than sampling.
				select {
				case <-ctx.Done():
					return
				case <-time.After(resources.GuardWait(u, l.CeilingBytes, l.CPUs)):
				}
			}
			fired = n.Wait(time.Minute)
			t.Reset(0)
			continue
		}
		if u >= l.CeilingBytes && time.Since(lastKill) >= killGap {
			ws := d.group.WorkingSet()
			settling := !lastKill.IsZero() && time.Since(lastKill) < killSettle && ws+victim/2 > atKill
			if ws >= l.CeilingBytes && !settling {
				victim = d.oomKill(ctx, ws)
				lastKill, atKill = time.Now(), ws
				u = d.group.Usage()
			}
		}
		if fixed > 0 {
			t.Reset(fixed)
			continue
		}
		t.Reset(resources.GuardWait(u, l.CeilingBytes, l.CPUs))
	}
}

// oomKill has the guest kill its largest process (guest.OOMKill, in the
// agent: a global request on the gate process's connection to it) and
// records it: the daemon's log, the record, status.
func (d *daemon) oomKill(ctx context.Context, workingSet uint64) (victimRSS uint64) {
	if d.gate == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	var k oomKillAnswer
	_, err := d.gate.call(ctx, "oom-kill", nil, &k)
	what := truncate(k.What, 200)
	if err != nil || !k.OK {
		d.log.Warn("the guest reached its memory ceiling and killing its largest process failed", "working_set_mib", workingSet/resources.MiB, "err", err, "reply", what)
		return 0
	}
	victimRSS = k.RSS
	note := fmt.Sprintf("%s: killed %s (memory at the ceiling, memory_max %s)",
		time.Now().Format(time.RFC3339), what, resources.FormatMiB(d.o.Limits.CeilingBytes))
	d.log.Warn("guest process OOM-killed at the memory ceiling", "killed", what, "working_set_mib", workingSet/resources.MiB, "kill_ms", time.Since(start).Milliseconds())
	d.guard.mu.Lock()
	d.guard.kills++
	d.guard.last = note
	d.guard.mu.Unlock()
	d.updateRecord(func(r *state.Record) error {
		r.GuestOOMKills++
		r.LastOOMKill = note
		return nil
	})
	return victimRSS
}

// resourceStatus is the status API's resources, nil without a group.
func (d *daemon) resourceStatus() *control.Resources {
	if d.group == nil {
		return nil
	}
	s, err := d.group.Stats()
	if err != nil {
		return nil
	}
	l := d.o.Limits
	d.guard.mu.Lock()
	kills, last := d.guard.kills, d.guard.last
	d.guard.mu.Unlock()
	r := &control.Resources{
		CPUs: l.CPUs, CPUSeconds: float64(s.CPUNanos) / 1e9,
		MemoryUsageBytes: s.UsageBytes, MemoryLimitBytes: min(s.SoftBytes, l.CeilingBytes),
		MemoryBaselineBytes: l.BaselineBytes, MemoryCeilingBytes: l.CeilingBytes,
		MemoryPressure: s.SomeAvg10, HostPressure: d.hostLevelText(),
		OOMKills: s.OOMKills, LimitHits: s.LimitHits, Pids: s.Pids, PidsMax: l.PidsMax,
		GuestOOMKills: kills, LastGuestOOMKill: last,
	}
	if ds, err := d.group.DaemonStats(); err == nil {
		r.DaemonMemoryUsageBytes, r.DaemonMemoryLimitBytes = ds.UsageBytes, ds.LimitBytes
	}
	return r
}

// hostLevelText is the last sampled host level, "unknown" before the
// first sample.
func (d *daemon) hostLevelText() string {
	v := d.hostLevel.Load()
	if v == 0 {
		return "unknown"
	}
	return resources.Level(v - 1).String()
}
