package cli

import (
	"fmt"
	"io"
	"path/filepath"
	"time"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/sentinel"
	"moat.dev/moat/internal/state"
)

// baseline records what the host-run files of the workspace are now (see
// internal/sentinel): at create, and when a user accepts the changes.
func baseline(dir, workspace string) error {
	s, err := sentinel.Take(workspace)
	if err != nil {
		return fmt.Errorf("recording the workspace's git hooks and editor files: %w", err)
	}
	return sentinel.Save(s, func(b []byte) error {
		return state.WriteAtomic(filepath.Join(dir, sentinel.File), b, 0o600)
	})
}

// workspaceChanges lists the host-run files of the workspace that changed
// since the baseline. A sandbox made before moat kept baselines gets one
// now, and reports nothing until the next change.
func workspaceChanges(dir, workspace string) ([]sentinel.Change, error) {
	old, ok, err := sentinel.Load(filepath.Join(dir, sentinel.File))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, baseline(dir, workspace)
	}
	cur, err := sentinel.Take(workspace)
	if err != nil {
		return nil, err
	}
	return sentinel.Diff(old, cur), nil
}

func printChanges(out io.Writer, name string, ch []sentinel.Change) {
	if len(ch) == 0 {
		return
	}
	fmt.Fprintf(out, "changed:    files the host runs (git hooks, git config, editor tasks) changed since the sandbox was made:\n")
	for _, c := range ch {
		fmt.Fprintf(out, "              %s (%s)\n", c.Path, c.What)
	}
	fmt.Fprintf(out, "            review them before git or your editor runs them, then: moat status %s --accept-changes\n", name)
}

// printActivity prints traffic, idleness and the gate's state.
func printActivity(out io.Writer, a *control.Activity, g *control.GateStatus) {
	if a != nil {
		fmt.Fprintf(out, "network:    %s in and out since start\n", humanBytes(a.NetBytes))
		switch {
		case a.IdleTimeout == 0:
			fmt.Fprintf(out, "idle stop:  off\n")
		case a.LastSample.IsZero():
			fmt.Fprintf(out, "idle stop:  after %s idle (not sampled yet)\n", a.IdleTimeout)
		case a.Busy != "":
			fmt.Fprintf(out, "idle stop:  after %s idle; busy now (%s)\n", a.IdleTimeout, a.Busy)
		default:
			fmt.Fprintf(out, "idle stop:  after %s idle; idle for %s\n", a.IdleTimeout, a.IdleFor.Round(time.Second))
		}
	}
	if g != nil {
		fmt.Fprintf(out, "gate:       %s mode, %d watcher(s), %d destination(s) held\n", g.Mode, g.Watchers, g.Holds)
		if g.AuditFailing != "" {
			fmt.Fprintf(out, "audit:      failing, nothing goes through: %s\n", g.AuditFailing)
		}
		if g.AuditLost > 0 {
			fmt.Fprintf(out, "audit:      %d record(s) could not be written; the audit log's dropped records say when\n", g.AuditLost)
		}
	}
}

// humanBytes writes a byte count in the largest binary unit under 1024.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n), 0
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGT"[u-1])
}
