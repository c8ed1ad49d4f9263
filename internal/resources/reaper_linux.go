package resources

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/state"
)

// The reaper removes the group of a daemon that was killed (see the
// package doc). It is the moat binary's hidden role `__reaper DIR`.

// ReaperCommand is the hidden subcommand that runs Reap.
const ReaperCommand = "__reaper"

// The reaper's inherited fds: the read end of the daemon's pipe and the
// group lock the daemon took in Create.
const (
	reaperPipeFD = 3
	reaperLockFD = 4
)

// doneByte is what the daemon writes on the pipe when it has removed the
// group itself: the reaper then leaves without touching anything.
const doneByte = 'd'

// Bounds of the reaper's work after the daemon is gone. The shim's
// parent-death signal empties the group in well under a second; emptyWait
// is for a loaded host, and what is still there after it is killed.
const (
	emptyWait = 10 * time.Second
	killWait  = 5 * time.Second
)

// lockWait bounds how long Create waits for a previous daemon's reaper:
// longer than the reaper's own bounds (emptyWait, killWait, and the cgroup
// library's 5 s of rmdir retries).
const lockWait = 30 * time.Second

// lockFile is the group lock in the sandbox's state directory. Whoever
// holds it owns the group's directories: the daemon from Create on, and
// its reaper, which shares the very same lock (the fd is inherited, so one
// open file description) and holds it after the daemon is gone until the
// group is removed.
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

// Reaper is the daemon's handle on its reaper process.
type Reaper struct {
	w    *os.File // the pipe's write end: only the daemon holds it
	pid  int
	done chan struct{}
	err  error // how the reaper ended, once done is closed
}

// StartReaper starts `moat __reaper` (moat is the binary's path) for the
// group, as a child of the calling daemon: outside the sandbox's group (it
// stays in the daemon's), in its own session (a signal to the daemon's
// process group does not reach it), with stderr to log. Call it once the
// group exists and before anything joins it.
func (g *Group) StartReaper(moat, stateDir string, log *os.File) (*Reaper, error) {
	r, w, err := os.Pipe() // both O_CLOEXEC: no other child ever holds w
	if err != nil {
		return nil, fmt.Errorf("creating the reaper's pipe: %w", err)
	}
	started := make(chan error, 1)
	rp := &Reaper{w: w, done: make(chan struct{})}
	go func() {
		defer close(rp.done)
		// The parent-death signal fires when the thread that forked the
		// child exits: this goroutine keeps its thread for the reaper's
		// whole life and never unlocks it, so the signal means the
		// daemon's death and nothing else.
		goruntime.LockOSThread()
		cmd := exec.Command(moat, ReaperCommand, stateDir, strconv.Itoa(os.Getpid()))
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		cmd.Stderr = log
		cmd.ExtraFiles = []*os.File{r, g.lock}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGTERM}
		err := cmd.Start()
		r.Close()
		if err == nil {
			rp.pid = cmd.Process.Pid
		}
		started <- err
		if err == nil {
			rp.err = cmd.Wait()
		}
	}()
	if err := <-started; err != nil {
		w.Close()
		return nil, fmt.Errorf("starting the cgroup reaper: %w", err)
	}
	return rp, nil
}

// Dismiss tells the reaper that the daemon removed the group itself; it
// then exits without touching anything. Bounded: a reaper that does not
// exit within 2 s is left to finish on its own.
func (rp *Reaper) Dismiss() {
	if rp == nil {
		return
	}
	rp.w.Write([]byte{doneByte})
	rp.w.Close()
	select {
	case <-rp.done:
	case <-time.After(2 * time.Second):
	}
}

// Reap is the reaper's main. It waits until its daemon (pid daemonPID) is
// gone: end of file on the pipe, or the parent-death signal with the parent
// changed. If the daemon dismissed it, it exits at once; otherwise it waits
// (bounded) for the group to empty, kills what is still inside, removes the
// group and its record, and exits, releasing the group lock.
func Reap(stateDir string, daemonPID int) int {
	// First of all: the parent-death signal is SIGTERM, whose default
	// action would end the reaper silently, groups left behind, if the
	// daemon died while the reaper was still joining the daemon's cgroup
	// (a dozen hierarchies on v1, slow on a loaded host).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	pipe := os.NewFile(reaperPipeFD, "reaper-pipe")
	lock := os.NewFile(reaperLockFD, "cgroup-lock")
	defer lock.Close()
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "time=%s level=INFO msg=%q component=reaper\n", time.Now().Format(time.RFC3339Nano), fmt.Sprintf(format, a...))
	}
	// The groups' records, read now: once the daemon is gone, the state
	// directory may be going too (a destroy right after a crash).
	record, recErr := os.ReadFile(filepath.Join(stateDir, GroupFile))
	daemonRecord, _ := os.ReadFile(filepath.Join(stateDir, DaemonGroupFile))
	// Into the daemon's group, like everything moat runs for the sandbox
	// on the host; leave is the way out, to remove it.
	var dg *Group
	leave := func() {}
	if len(daemonRecord) > 0 {
		var err error
		if dg, err = loadGroup(daemonRecord); err != nil {
			logf("%v; staying outside the daemon's cgroup", err)
		} else if back, err := dg.cg.Join(); err != nil {
			logf("joining the daemon's cgroup: %v; staying outside it", err)
		} else {
			leave = back
		}
	}
	// When the daemon's group is at its limit, the kernel's OOM killer
	// must take the daemon, never its reaper, which then says why the
	// sandbox stopped. Lowering the score takes CAP_SYS_RESOURCE, which
	// a container's root may lack; without it the daemon, at its limit
	// several times the reaper's size (the limit is at least 64 MiB), is
	// still the one the kernel picks, so a refusal is not worth a line.
	os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	dismissed := make(chan bool, 1)
	go func() {
		b := make([]byte, 1)
		n, _ := pipe.Read(b)
		dismissed <- n == 1 && b[0] == doneByte
	}()
	for {
		select {
		case d := <-dismissed:
			if d {
				return 0
			}
		case <-sigs:
			// Also a stray SIGTERM from someone else: only a changed
			// parent means the daemon is gone.
			if os.Getppid() == daemonPID {
				continue
			}
		}
		break
	}
	// From here the reaper finishes its work, bounded, whatever else
	// arrives: the daemon's threads exit one by one, and each exit that
	// re-parents the reaper sends the parent-death signal again, the last
	// one (to the new parent) often after the pipe's end of file woke it.
	// With SIGTERM's default action restored, that signal killed the
	// reaper between its first and second step, groups left behind.
	signal.Ignore(unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	code := 0
	if dg != nil {
		// First, while the sandbox's group empties: a daemon the kernel
		// killed at its limit says nothing itself.
		noteDaemonOOM(stateDir, dg, logf)
	}
	if !errors.Is(recErr, os.ErrNotExist) {
		code = reapSandbox(stateDir, record, logf)
	}
	if dg != nil {
		leave()
		if err := retryRemove(func() error { return removeDaemonGroup(stateDir, dg.cg) }); err != nil {
			logf("the daemon is gone; %v (the next moat up or moat destroy removes it)", err)
			code = 1
		}
	}
	return code
}

// noteDaemonOOM writes into the sandbox's record, where `moat status`
// shows it, that the kernel's OOM killer took the daemon at its group's
// limit, if it did. The sandbox stopped with its daemon (the shim's
// parent-death signal), so the guest had no network past its gate.
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

// reapSandbox waits (bounded) for the sandbox's group, recorded in
// record, to empty, kills what is still inside, and removes it and its
// record.
func reapSandbox(stateDir string, record []byte, logf func(string, ...any)) int {
	g, err := loadGroup(record)
	if err != nil {
		logf("the daemon is gone; cannot read its cgroup record: %v", err)
		return 1
	}
	start := time.Now()
	left := g.procs()
	logf("the daemon is gone; %d process(es) left in its sandbox's cgroup", len(left))
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
		return 1
	}
	os.Remove(filepath.Join(stateDir, GroupFile))
	logf("the daemon is gone; removed its sandbox's cgroup in %s", time.Since(start).Round(time.Millisecond))
	return 0
}

// procs lists the processes in the group, over the hierarchies that matter
// on v1 (a process joins them all at once) or the one group of v2.
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
// reaped, by whichever process adopted them (PID 1 once the daemon is
// gone), which on a loaded host can take seconds.
func retryRemove(remove func() error) error {
	err := remove()
	for start := time.Now(); err != nil && time.Since(start) < killWait; {
		time.Sleep(50 * time.Millisecond)
		err = remove()
	}
	return err
}
