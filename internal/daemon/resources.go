package daemon

import (
	"context"
	"fmt"
	"os"
	"time"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/state"
)

// elasticEvery is how often the elastic loop samples: PSI's avg10 is a
// 10 s window, so sampling twice per window follows it without chasing
// noise, at a few small file reads per sample.
const elasticEvery = 5 * time.Second

// startGroup makes the sandbox's cgroup and puts it in the shim's plan. It
// returns the group's removal, to run once the shim has exited.
func (d *daemon) startGroup() (func(), error) {
	if d.o.Limits == nil {
		return func() {}, nil
	}
	g, err := resources.Create(d.o.Dir, *d.o.Limits)
	if err != nil {
		return nil, err
	}
	b, err := g.JSON()
	if err != nil {
		g.Remove(d.o.Dir)
		g.Release()
		return nil, err
	}
	// The reaper removes the group if this daemon is killed (see the
	// resources package doc); it must exist before anything joins it.
	reaper, err := g.StartReaper(d.o.Moat, d.o.Dir, os.Stderr)
	if err != nil {
		g.Remove(d.o.Dir)
		g.Release()
		return nil, err
	}
	d.group = g
	d.o.Plan.Cgroup, d.o.Plan.CgroupsPath, d.o.Plan.PidsMax = b, g.RunscPath(), d.o.Limits.PidsMax
	return func() {
		// The OOM killer acts on the host's view: the guest's memory is
		// the sentry's, so at the ceiling it is the sandbox as a whole
		// that goes. Say so in the record, where status shows it, before
		// the group and its counters are gone.
		if s, err := g.Stats(); err == nil && s.OOMKills > 0 {
			note := fmt.Sprintf("out of memory: the sandbox reached its memory ceiling (memory_max %s) and the kernel's OOM killer stopped it (%d OOM kills); raise memory_max or use less memory",
				resources.FormatMiB(d.o.Limits.CeilingBytes), s.OOMKills)
			d.log.Warn("sandbox OOM-killed at its ceiling", "oom_kills", s.OOMKills)
			state.Update(d.o.Dir, func(r *state.Record) error {
				if r.Error == "" {
					r.Error = note
				} else {
					r.Error += "; " + note
				}
				return nil
			})
		}
		if err := g.Remove(d.o.Dir); err != nil {
			// The reaper retries once this daemon has exited.
			d.log.Warn("removing the sandbox's cgroup; its reaper retries", "err", err)
		} else {
			reaper.Dismiss()
		}
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
		s, err := d.group.Stats()
		if err != nil {
			d.log.Warn("sampling the sandbox's memory", "err", err)
			continue
		}
		l := d.o.Limits
		g := resources.GuestSample{SomeAvg10: s.SomeAvg10, UsageBytes: s.UsageBytes,
			BaselineBytes: l.BaselineBytes, CeilingBytes: l.CeilingBytes, SoftBytes: s.SoftBytes}
		d.hostLevel.Store(int32(resources.HostLevel(h)) + 1)
		if want := resources.Target(h, g); want != min(s.SoftBytes, l.CeilingBytes) {
			if err := d.group.SetSoft(want); err != nil {
				d.log.Warn("setting the soft memory limit", "err", err)
				continue
			}
			d.log.Info("soft memory limit moved", "from_mib", min(s.SoftBytes, l.CeilingBytes)/resources.MiB,
				"to_mib", want/resources.MiB, "host", resources.HostLevel(h).String(), "usage_mib", s.UsageBytes/resources.MiB)
		}
	}
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
	return &control.Resources{
		CPUs: l.CPUs, CPUSeconds: float64(s.CPUNanos) / 1e9,
		MemoryUsageBytes: s.UsageBytes, MemoryLimitBytes: min(s.SoftBytes, l.CeilingBytes),
		MemoryBaselineBytes: l.BaselineBytes, MemoryCeilingBytes: l.CeilingBytes,
		MemoryPressure: s.SomeAvg10, HostPressure: d.hostLevelText(),
		OOMKills: s.OOMKills, LimitHits: s.LimitHits, Pids: s.Pids, PidsMax: l.PidsMax,
	}
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
