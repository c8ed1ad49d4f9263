package resources

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/runsc/cgroup"

	"moat.dev/moat/internal/state"
)

// The groups of a killed daemon are removed by its shim, which outlives
// it for that (see the package doc): the daemon hands the shim a
// Handover, and the shim, once the daemon is gone and the guest's
// processes with it, calls Reap.

// Bounds of the shim's work after the daemon is gone. The shim kills the
// guest's processes at once; emptyWait is for a loaded host, and what is
// still there after it is killed.
const (
	emptyWait = 10 * time.Second
	killWait  = 5 * time.Second
)

// lockWait bounds how long Create waits for a previous daemon's shim:
// longer than the shim's own bounds (emptyWait, killWait, and the cgroup
// library's 5 s of rmdir retries).
const lockWait = 30 * time.Second

// lockFile is the group lock in the sandbox's state directory. Whoever
// holds it owns the group's directories: the daemon from Create on, and
// its shim, which shares the very same lock (the fd is inherited, so one
// open file description) and holds it after the daemon is gone until the
// groups are removed.
const lockFile = "cgroup.lock"

// lockGroup takes the sandbox's group lock, waiting up to wait for it.
// ok is false when another holder kept it that long.
func lockGroup(stateDir string, wait time.Duration) (f *os.File, ok bool, err error) {
	f, err = os.OpenFile(filepath.Join(stateDir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("opening the sandbox's cgroup lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, true, nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			f.Close()
			return nil, false, fmt.Errorf("taking the sandbox's cgroup lock: %w", err)
		}
		if !time.Now().Before(deadline) {
			f.Close()
			return nil, false, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// handover is Handover.Plan: the groups as the shim needs them to remove
// them. Origin is where the daemon was before it joined its own group
// (JoinDaemon): the shim goes there, out of both groups, to remove them.
type handover struct {
	Sandbox *cgroup.CgroupJSON `json:"sandbox"`
	Daemon  *cgroup.CgroupJSON `json:"daemon,omitempty"`
	Origin  *cgroup.CgroupJSON `json:"origin"`
}

// Handover is what a daemon gives its shim so that the shim removes the
// groups if the daemon is killed.
type Handover struct {
	// Plan goes into the shim's plan (runtime.Plan.Reap).
	Plan []byte
	// Files become the shim's fds after its socket, in this order: a
	// pidfd of the daemon, which becomes readable when the daemon is gone
	// however it went, and the group lock, which the shim holds until
	// the groups are removed.
	Files []*os.File
}

// Handover makes the group's Handover. Call it after JoinDaemon. Close
// it once the shim has exited.
func (g *Group) Handover() (*Handover, error) {
	if g.origin == nil {
		if g.originErr != nil {
			return nil, fmt.Errorf("handing the cgroups to the shim: finding the daemon's own cgroup: %w", g.originErr)
		}
		return nil, errors.New("handing the cgroups to the shim: the daemon has not joined its own group")
	}
	h := handover{Sandbox: &cgroup.CgroupJSON{Cgroup: g.cg}, Origin: &cgroup.CgroupJSON{Cgroup: g.origin}}
	if g.daemon != nil {
		h.Daemon = &cgroup.CgroupJSON{Cgroup: g.daemon}
	}
	b, err := json.Marshal(&h)
	if err != nil {
		return nil, fmt.Errorf("handing the cgroups to the shim: %w", err)
	}
	// pidfd_open is Linux 5.3; without it the shim keeps the parent-death
	// SIGKILL and the next moat up or moat destroy removes the groups.
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return nil, fmt.Errorf("opening a pidfd of the daemon for its shim: %w", err)
	}
	return &Handover{Plan: b, Files: []*os.File{os.NewFile(uintptr(fd), "daemon-pidfd"), g.lock}}, nil
}

// Close closes the daemon's copy of the pidfd; the lock is the group's.
func (h *Handover) Close() {
	if h != nil {
		h.Files[0].Close()
	}
}

// Reap is the shim's work once its daemon is gone and it has killed and
// reaped the guest's processes: it leaves the sandbox's group for the
// daemon's origin, says in the record whether the kernel's OOM killer
// took the daemon, waits (bounded) for the sandbox's group to empty and
// kills what is still inside, and removes both groups and their records.
// plan is Handover.Plan; it logs to w.
func Reap(stateDir string, plan []byte, w io.Writer) error {
	logf := func(format string, a ...any) {
		fmt.Fprintf(w, "time=%s level=INFO msg=%q component=shim\n", time.Now().Format(time.RFC3339Nano), fmt.Sprintf(format, a...))
	}
	var h handover
	if err := json.Unmarshal(plan, &h); err != nil || h.Sandbox == nil || h.Sandbox.Cgroup == nil || h.Origin == nil || h.Origin.Cgroup == nil {
		logf("the daemon is gone; cannot read the cgroups it handed over (%v); the next moat up or moat destroy removes them", err)
		return fmt.Errorf("reading the cgroups the daemon handed over: %v", err)
	}
	// Out of the sandbox's group, which cannot be removed with a process
	// inside, to where the daemon came from: never into the daemon's.
	if _, err := h.Origin.Cgroup.Join(); err != nil {
		logf("the daemon is gone; leaving its sandbox's cgroup: %v (the next moat up or moat destroy removes it)", err)
		return err
	}
	var errs []error
	v2 := cgroup.IsOnlyV2()
	if h.Daemon != nil && h.Daemon.Cgroup != nil {
		// First, while the sandbox's group empties: a daemon the kernel
		// killed at its limit says nothing itself.
		noteDaemonOOM(stateDir, &Group{cg: h.Daemon.Cgroup, v2: v2}, logf)
	}
	errs = append(errs, reapSandbox(stateDir, &Group{cg: h.Sandbox.Cgroup, v2: v2}, logf))
	if h.Daemon != nil && h.Daemon.Cgroup != nil {
		if err := retryRemove(func() error { return removeDaemonGroup(stateDir, h.Daemon.Cgroup) }); err != nil {
			logf("the daemon is gone; %v (the next moat up or moat destroy removes it)", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// noteDaemonOOM writes into the sandbox's record, where `moat status`
// shows it, that the kernel's OOM killer took the daemon at its group's
// limit, if it did. The sandbox stopped with its daemon (its shim killed
// the guest), so the guest had no network past its gate.
func noteDaemonOOM(stateDir string, dg *Group, logf func(string, ...any)) {
	st, err := daemonStats(dg.cg, dg.v2)
	if err != nil || st.OOMKills == 0 {
		return
	}
	logf("the kernel's OOM killer stopped the daemon at its cgroup's limit (%s); the sandbox stopped with it", FormatMiB(st.LimitBytes))
	state.Update(stateDir, func(r *state.Record) error {
		note := DaemonOOMNote(r.Name, st.LimitBytes)
		if r.Error == "" {
			r.Error = note
		} else {
			r.Error += "; " + note
		}
		return nil
	})
}

// reapSandbox waits (bounded) for the sandbox's group to empty, kills
// what is still inside, and removes it and its record.
func reapSandbox(stateDir string, g *Group, logf func(string, ...any)) error {
	start := time.Now()
	left := g.procs()
	logf("the daemon is gone; the guest is stopped, %d process(es) left in its sandbox's cgroup", len(left))
	for len(left) > 0 && time.Since(start) < emptyWait {
		time.Sleep(50 * time.Millisecond)
		left = g.procs()
	}
	if len(left) > 0 {
		logf("the daemon is gone and %d process(es) are still in its sandbox's cgroup after %s; killing them", len(left), emptyWait)
		for _, pid := range left {
			unix.Kill(pid, unix.SIGKILL)
		}
		for k := time.Now(); len(g.procs()) > 0 && time.Since(k) < killWait; {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if err := retryRemove(g.cg.Uninstall); err != nil {
		logf("the daemon is gone; removing its sandbox's cgroup: %v (the next moat up or moat destroy removes it)", err)
		return fmt.Errorf("removing the sandbox's cgroup: %w", err)
	}
	os.Remove(filepath.Join(stateDir, GroupFile))
	logf("the daemon is gone; removed its sandbox's cgroup in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

// procs lists the processes in the group that the caller can see (the
// shim sees those of its own PID namespace, which are all the sandbox's
// group ever holds), over the hierarchies that matter on v1 (a process
// joins them all at once) or the one group of v2.
func (g *Group) procs() []int {
	seen := map[int]bool{}
	var out []int
	for _, c := range []string{"memory", "pids", "cpu"} {
		f, err := os.Open(filepath.Join(g.cg.MakePath(c), "cgroup.procs"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
		for sc.Scan() {
			if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && pid > 0 && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
		f.Close()
	}
	return out
}

// retryRemove removes a group, trying again for a while when it fails: a
// group whose last processes have exited is busy until their zombies are
// reaped, by whichever process adopted them, which on a loaded host can
// take seconds.
func retryRemove(remove func() error) error {
	err := remove()
	for start := time.Now(); err != nil && time.Since(start) < killWait; {
		time.Sleep(50 * time.Millisecond)
		err = remove()
	}
	return err
}
