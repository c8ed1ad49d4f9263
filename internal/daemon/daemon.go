// Package daemon is the per-sandbox daemon: the one process that owns a
// sandbox for its whole life. It starts the guest through the runtime's
// shim, serves the guest's only network interface with the netstack, proxies
// sessions to the guest agent, answers the control API and stops the guest
// cleanly on SIGTERM or a stop request.
//
// The daemon holds daemon.lock for as long as it lives; readers take "the
// lock is free" to mean "the daemon is gone", which is how a crash (even
// SIGKILL) shows up as crashed rather than running.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/keys"
	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/session"
	"moat.dev/moat/internal/sshagent"
	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/tlsca"
	"moat.dev/moat/internal/userns"
)

// ReadyFD is the fd on which a daemon started by the CLI reports "ok" or the
// reason it could not start; the CLI waits on it instead of polling.
const ReadyFD = 3

// bootTimeout bounds how long the guest agent may take to answer.
const bootTimeout = 60 * time.Second

// Options are the daemon's inputs.
type Options struct {
	Dir      string // the sandbox's state directory
	Runsc    string // path of runsc
	Moat     string // path of the moat binary
	Plan     *runtime.Plan
	Guest    *guestspec.Spec
	Log      *slog.Logger
	LogOut   io.Writer      // what Log writes to, for hook output; nil: stderr
	Ready    io.WriteCloser // may be nil
	ImageRef string
	Network  NetworkOptions
	// Secrets are the configuration's [secrets]; the values are read on
	// the host at start and held in memory only.
	Secrets map[string]config.Secret
	// SecretEnv are the values of the secrets' variables, handed over by
	// the CLI on a pipe (see ReadHandover), never in the environment.
	SecretEnv map[string]string
	// Hooks run in the guest before the sandbox is reported running
	// (hooks.go); Env is the configuration's [env], for their sessions.
	Hooks config.Hooks
	Env   []config.EnvVar
	// Files are copied into the guest at every start, before the hooks.
	Files []config.CopyFile
	// IdleTimeout stops the sandbox after that long idle (idle.go); 0: never.
	IdleTimeout time.Duration
	// IdleAction is [sandbox] idle_action: what the idle timeout does
	// (suspend_idle.go).
	IdleAction string
	// SSHAgentKeys are the host agent's keys the guest may list and sign
	// with ([ssh_agent] keys); none: the guest has no agent.
	SSHAgentKeys []string
	// SSHAgentConfirm asks the watcher before each signature.
	SSHAgentConfirm bool
	// Limits are applied through the sandbox's own cgroup (resources.go);
	// nil runs the sandbox without one.
	Limits *resources.Limits
	// MoatVersion is recorded with each suspend's image
	// (checkpoint.Manifest).
	MoatVersion string
	// Standby makes the keeper a standby (standby.go); StartEnv is the
	// environment it was started with, which a "go" is compared to.
	Standby  bool
	StartEnv []string
}

type daemon struct {
	o       Options
	log     *slog.Logger
	stack   *netstack.Stack
	net     *network
	proxy   *session.Proxy // every session's way to the guest agent
	fork    *forkKeys      // a fork's parent keys until its guest takes its own (fork.go)
	ca      *tlsca.CA      // mints the leaves of intercepted hosts
	creds   *credentials   // the secrets, swapped whole when a preset adds some
	fwd     *forwards      // port forwards (forward.go); nil until the stack runs
	sess    idleGate       // attached sessions, and the idle stop's word
	signs   signGrants     // keys a watcher let sign for this run
	tools   hostTools      // the host's package tools, asked for discovery (network.go)
	shimPID atomic.Int64
	started time.Time

	// Every goroutine the process starts runs as one of its tasks, and
	// ctx, which ends as the process shuts down, is their way to stop;
	// shutdown waits for them (tasks.go).
	tasks  tasks
	ctx    context.Context
	cancel context.CancelFunc

	group     *resources.Group // the sandbox's cgroup; nil without Options.Limits
	shimFiles []*os.File       // the shim's fds after its socket when it removes the groups (resources.Handover)
	hostLevel atomic.Int32     // the elastic loop's last resources.Level, for status
	guard     oomGuard         // the guest's OOM kills (resources.go)

	// idleMu guards the idle watchdog's last sample, for status.
	idleMu       sync.Mutex
	lastSample   idleSample
	lastSampleAt time.Time
	idleSince    time.Time

	stopOnce   sync.Once
	stopReason string
	stopError  string // what failed, for a stop for state.StopError
	stopCh     chan struct{}
	booted     chan struct{} // closed once the sandbox is set up and running

	// The keeper's side of the gate process (keeper.go).
	gate      *link // to the gate process
	gatePID   int
	gateIDs   gateIDs
	shim      *shimConn
	guestGo   chan struct{} // closed once the gate process has started the guest
	shimReady chan struct{} // closed once the record says the sandbox starts and d.shim is set
	goOnce    sync.Once
	sb        *standbyState // a standby's, else nil (standby.go)
	parked    chan struct{} // a standby's: closed once the gate process asked for the guest and the shim is ready
	standbyGo chan struct{} // a standby's: closed on its word to go
	agentUp   sync.Once     // the OOM guard starts once the guest agent answers
	bootOnce  sync.Once

	// The gate process's side (gateproc.go): its link to the keeper and
	// its copy of the record, which only the keeper writes.
	keeper *link
	recMu  sync.Mutex
	rec    *state.Record
	copies []copySource // the [[files]] sources (hooks.go)
}

// Run is the daemon's main: it returns when the sandbox has stopped.
func Run(o Options) error {
	d := newDaemon(o)
	err := d.run()
	if err != nil && d.o.Ready != nil {
		fmt.Fprintf(d.o.Ready, "error: %v\n", err)
		d.o.Ready.Close()
	}
	return err
}

// newDaemon is a daemon before its start: the keeper's, or the gate
// process's (which never uses guestGo and shimReady).
func newDaemon(o Options) *daemon {
	d := &daemon{o: o, log: o.Log, stopCh: make(chan struct{}), booted: make(chan struct{}), guestGo: make(chan struct{}), shimReady: make(chan struct{}),
		parked: make(chan struct{}), standbyGo: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	return d
}

// The steps of the keeper's clean-up, in the order they run. Whatever
// ends the daemon, a start that failed at any point or a stop, ends it
// through the same steps; a step runs only if its part was set up, and
// one that fails is logged and does not keep the next from running. The
// guest goes first (nothing of the sandbox may run without its gate),
// the record is written once nothing of it runs, and the lock, which
// readers take to mean "the daemon is gone", is released last.
const (
	stepGuest  = iota // the shim and runsc: SIGTERM and their grace for a stop, SIGKILL for a failure
	stepGate          // the gate process: its link closed, it flushes its audit and exits
	stepShim          // our end of the shim's socket
	stepRecord        // the record says stopped, why, and what failed
	stepTasks         // the keeper's goroutines end and are waited for
	stepGroup         // the sandbox's and the daemon's cgroups
	stepLock          // daemon.lock
	stepCount
)

var stepNames = [stepCount]string{"stopping the guest", "stopping the gate process", "closing the shim's socket",
	"recording the stop", "waiting for the keeper's goroutines", "removing the cgroups", "releasing the daemon lock"}

// teardown is what the start has set up so far, by step.
type teardown [stepCount]func() error

func (t *teardown) run(log *slog.Logger) {
	for i, undo := range t {
		if undo == nil {
			continue
		}
		if err := undo(); err != nil {
			log.Warn("cleaning up: "+stepNames[i], "err", err)
		}
	}
}

// ending is how the sandbox stopped, which the clean-up acts on.
type ending struct {
	reason   string // state.Stop*, for the record
	cause    error  // what failed, for the record; nil for a stop that was asked for
	graceful bool   // the guest gets SIGTERM and its grace, not SIGKILL
}

// writePID writes the keeper's pid into the state dir's file name. A
// failure is not a reason to refuse the start: the lock says the daemon
// lives; only a stop whose control call fails signals the pid.
func (d *daemon) writePID(name string) {
	if err := os.WriteFile(filepath.Join(d.o.Dir, name), []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o600); err != nil {
		d.log.Warn("writing "+name, "err", err)
	}
}

// recordStart records that the sandbox starts as st (starting or
// resuming), with this keeper as its daemon.
func (d *daemon) recordStart(st string) error {
	return d.updateRecord(func(r *state.Record) error {
		r.State, r.StopReason, r.Error = st, "", ""
		r.DaemonPID, r.Started = os.Getpid(), d.started
		return nil
	})
}

func (d *daemon) run() error {
	t0 := time.Now()
	// A standby holds its own lock until its word to go (standby.go);
	// either kind refuses to start beside the other.
	lock, pidFile := state.DaemonLock(d.o.Dir), daemonPIDFile
	if d.o.Standby {
		lock, pidFile = state.StandbyLock(d.o.Dir), filepath.Base(standbyPID(d.o.Dir))
	}
	release, ok, err := state.TryLock(lock)
	if err != nil {
		return err
	}
	if !ok {
		if d.o.Standby {
			return errors.New("the sandbox has a standby already")
		}
		return errors.New("another daemon already runs this sandbox")
	}
	switch {
	case d.o.Standby && state.DaemonAlive(d.o.Dir):
		release()
		return errors.New("the sandbox is running: nothing to stand by for")
	case !d.o.Standby && state.StandbyAlive(d.o.Dir):
		release()
		return errors.New("the sandbox has a standby, which moat ends or tells to go before a start; try again")
	}
	// From here every exit is one path: the ending says how the sandbox
	// stopped, and the teardown undoes what the start got to.
	end := ending{reason: state.StopError}
	var undo teardown
	defer func() {
		undo.run(d.log)
		d.log.Info("sandbox stopped", "reason", end.reason)
	}()
	undo[stepLock] = func() error { release(); return nil }
	if !d.o.Standby {
		// A standby writes the record only from its word to go.
		undo[stepRecord] = func() error { return d.setStopped(end.reason, end.cause) }
	}
	undo[stepTasks] = func() error {
		d.cancel()
		if left := d.tasks.wait(keeperTasksWait); len(left) > 0 {
			return fmt.Errorf("still running after %v: %s", keeperTasksWait, strings.Join(left, ", "))
		}
		return nil
	}
	// fail ends a start that failed: the record says why.
	fail := func(err error) error {
		end.cause = err
		return err
	}
	d.writePID(pidFile)

	// The sandbox's cgroup (resources.go) before prepare writes the plan,
	// which the shim joins it by; removed once the shim is gone.
	removeGroup, err := d.startGroup()
	if err != nil {
		return fail(err)
	}
	undo[stepGroup] = func() error { removeGroup(); return nil }
	ids, err := d.prepareGate()
	if err != nil {
		return fail(err)
	}
	d.started = time.Now()
	rec, err := state.Load(d.o.Dir)
	if err != nil {
		return fail(err)
	}
	// Boot or restore (suspend.go), decided before the shim's plan is
	// written, which says which; recorded once the processes are started.
	startAs := d.startState(rec)
	if d.o.Standby {
		if startAs != state.StateResuming {
			return fail(errors.New("the sandbox has no whole suspended image to stand by with"))
		}
		if d.sb, err = newStandbyState(d.o.StartEnv, d.o.SecretEnv, rec); err != nil {
			return fail(err)
		}
		d.o.Plan.Standby = true // the shim creates runsc's sandbox before the word
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	defer signal.Stop(sigs)

	// Each boot phase's share of boot_ms, for the log line below.
	phases := []any{"setup_ms", d.started.Sub(t0).Milliseconds()}
	mark := func(name string) func() {
		t := time.Now()
		return func() { phases = append(phases, name, time.Since(t).Milliseconds()) }
	}
	// The gate process sets itself up (and locks itself down) while the
	// keeper readies the writable layer and the shim mounts the root
	// filesystem and creates tap0; the gate process's "go" takes tap0 and
	// starts the guest: a policy that does not compile stops the start
	// before any guest exists.
	done := mark("gate_ms")
	gp, err := d.startGate(ids)
	if err != nil {
		return fail(err)
	}
	undo[stepGate] = gp.stop
	d.gate = gp.link
	if err := d.prepareShim(); err != nil {
		return fail(err)
	}
	shim, err := d.startShim()
	if err != nil {
		return fail(err)
	}
	undo[stepShim] = shim.Close
	undo[stepGuest] = func() error { return d.stopGuest(shim, end.graceful) }
	// The record says the sandbox starts only now: its write (an fsync)
	// runs while the two processes just started load, where before it
	// delayed both. Neither can start the guest sooner: the gate process
	// reads the record after its first call, "handover", and asks for the
	// guest with "go", and the keeper answers neither before this
	// (shimReady). A standby writes it on its word to go.
	if !d.o.Standby {
		if err := d.recordStart(startAs); err != nil {
			return fail(err)
		}
	}
	d.shim = shim
	close(d.shimReady)
	if d.o.Standby {
		if err := d.standBy(gp, shim, sigs, &undo, &end); err != nil {
			if errors.Is(err, errDismissed) {
				end.reason = "standby dismissed"
				return nil
			}
			return fail(err)
		}
		phases = []any{"standby", true}
		done = mark("gate_ms")
	}
	daemonLog := filepath.Join(d.o.Dir, "daemon.log")
	select {
	case <-d.guestGo:
	case <-gp.done:
		return fail(d.gateExited(gp, "before the guest started"))
	case s := <-sigs:
		return fail(fmt.Errorf("stopped by %v while starting", s))
	case <-d.stopCh:
		// The gate process failed its set-up (and said why), or a stop
		// came first.
		why := d.stopError
		if why == "" {
			why = "stopped while starting"
		}
		return fail(errors.New(why))
	}
	done()
	done = mark("boot_ms")
	select {
	case <-d.booted:
	case <-shim.done:
		end.reason, end.cause = state.StopCrash, fmt.Errorf("guest exited while starting: %v (see %s)", shim.err, daemonLog)
		return fmt.Errorf("guest exited while starting: %v", shim.err)
	case <-gp.done:
		return fail(d.gateExited(gp, "while starting"))
	case s := <-sigs:
		return fail(fmt.Errorf("stopped by %v while starting", s))
	case <-d.stopCh:
		return d.stopAsked(&end)
	}
	done()
	d.log.Info("keeper: sandbox running", append([]any{"start_ms", time.Since(d.started).Milliseconds()}, phases...)...)
	if d.o.Ready != nil {
		// The gate process says "ok" on its copy; the CLI sees the pipe
		// end once both are closed. A standby's is the connection its
		// word came on, which only the keeper has.
		if d.o.Standby {
			fmt.Fprintln(d.o.Ready, "ok")
		}
		d.o.Ready.Close()
		d.o.Ready = nil
	}
	d.tasks.Go("elastic memory", func() { d.elastic(d.ctx) })

	select {
	case <-shim.done:
		// The guest went away on its own: PID 1 exited, or runsc died.
		d.log.Warn("guest exited unexpectedly", "err", shim.err)
		end.reason, end.cause = state.StopCrash, fmt.Errorf("guest exited: %v", shim.err)
		return nil
	case <-gp.done:
		// Fail closed: a guest without its gate has no network and no
		// sessions; it goes too.
		d.log.Error("the gate process exited; stopping the sandbox", "err", gp.err)
		end.graceful = true
		end.cause = fmt.Errorf("the gate process exited: %v; see %s", gp.err, daemonLog)
		return nil
	case sig := <-sigs:
		d.log.Info("stopping on signal", "signal", sig)
		d.stopReason = state.StopHost
		if sig == unix.SIGTERM {
			d.stopReason = state.StopUser
		}
	case <-d.stopCh:
	}
	d.stopAsked(&end)
	return nil
}

// gateExited is the failure a start is whose gate process exited: the
// reason it gave when it asked for the stop before it exited (a policy
// that does not compile), else its exit.
func (d *daemon) gateExited(gp *gateProc, when string) error {
	select {
	case <-d.stopCh:
		if d.stopError != "" {
			return errors.New(d.stopError)
		}
	default:
	}
	return fmt.Errorf("the gate process exited %s: %v; see %s", when, gp.err, filepath.Join(d.o.Dir, "daemon.log"))
}

// stopAsked ends a sandbox whose stop was asked for (d.stopReason): the
// record says stopping until the clean-up has stopped the guest, with its
// grace, then the gate process, which flushes its audit as its link ends.
// It returns the failure a stop for an error is.
func (d *daemon) stopAsked(end *ending) error {
	if err := d.updateRecord(func(r *state.Record) error { r.State = state.StateStopping; return nil }); err != nil {
		d.log.Warn("recording the stop", "err", err)
	}
	end.reason, end.cause, end.graceful = d.stopReason, nil, true
	if d.stopReason == state.StopError {
		end.cause = errors.New(d.stopError)
	}
	return end.cause
}

// prepareGate makes what the gate process needs before it starts: the
// guest's directory (it writes the guest's files there, gateproc.go), its
// ids and its audit directory. It returns the ids.
func (d *daemon) prepareGate() (gateIDs, error) {
	guestDir := d.o.Plan.GuestDir
	// 0755: the guest's agent user reads ca.pem (NODE_EXTRA_CA_CERTS)
	// and guest.json through /.moat; the host key inside stays 0600, and
	// on the host the sandbox's state dir (0700) keeps everyone else out.
	if err := os.MkdirAll(guestDir, 0o755); err != nil {
		return gateIDs{}, fmt.Errorf("creating guest dir: %w", err)
	}
	if err := os.Chmod(guestDir, 0o755); err != nil {
		return gateIDs{}, fmt.Errorf("creating guest dir: %w", err)
	}
	ids, err := d.allocGateIDs()
	if err != nil {
		return gateIDs{}, err
	}
	if err := prepareAuditDir(d.o.Dir, ids); err != nil {
		return gateIDs{}, err
	}
	os.Remove(control.Socket(d.o.Dir))
	return ids, nil
}

// prepareShim clears what a crashed run left of runsc, readies the
// writable layer and writes the shim's plan.
func (d *daemon) prepareShim() error {
	// No runsc of ours can be alive (we hold the daemon lock and its
	// namespaces died with the last daemon), so its state is stale.
	os.RemoveAll(runtime.RunscRoot(d.o.Dir))
	os.MkdirAll(runtime.RunscRoot(d.o.Dir), 0o700)
	if err := runtime.PrepareDisk(d.o.Plan, d.log); err != nil {
		return err
	}
	return runtime.WritePlan(filepath.Join(d.o.Dir, "shim.json"), d.o.Plan)
}

// startShim starts the shim in new mount and network namespaces, with a
// parent-death signal unless it is to remove the groups (shimFiles),
// when it outlives a killed daemon for that. The shim execs runsc, so done reports runsc's
// exit. The shim mounts the root filesystem and creates tap0 while the
// daemon starts the gate; it sends tap0's fd (shimConn.tap) and starts the
// guest only on the daemon's word (shimConn.startGuest). shimConn.done is
// closed once it has exited.
func (d *daemon) startShim() (*shimConn, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating shim socket: %w", err)
	}
	ours := os.NewFile(uintptr(pair[0]), "shim-ours")
	theirs := os.NewFile(uintptr(pair[1]), "shim-theirs")

	// The shim, runsc and the guest's console write into a pipe that the
	// daemon copies into runsc.log, within its bound (logs.go).
	logf, logDone, err := d.runscLog()
	if err != nil {
		ours.Close()
		theirs.Close()
		return nil, err
	}
	s := &shimConn{f: ours, log: filepath.Join(d.o.Dir, "runsc.log"), done: make(chan struct{})}
	started := make(chan error, 1)
	d.tasks.Go("shim: waiting", func() {
		// Pdeathsig fires when the thread that forked the child exits, not
		// the process: this goroutine keeps its thread for the child's
		// whole life, and never unlocks it.
		goruntime.LockOSThread()
		cmd := exec.Command(d.o.Moat, "__shim", filepath.Join(d.o.Dir, "shim.json"))
		// The shim and runsc need nothing of the user's environment, so
		// they get none of it: whatever the user exported stays out of
		// processes that live as long as the sandbox. The shim runs on
		// one processor: it mostly waits, and each processor the Go
		// runtime starts with holds memory of its own for the sandbox's
		// life (about 0.3 MiB; setting it after the start does not give
		// that back: docs/benchmarks.md). runsc gets an environment of
		// its own from the shim, without it (runtime.Shim).
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GOMAXPROCS=1"}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.ExtraFiles = append([]*os.File{theirs}, d.shimFiles...)
		// A shim that removes the groups outlives this daemon for that,
		// and stops the guest itself (runtime.Shim's heir).
		pdeath := syscall.SIGKILL
		if len(d.shimFiles) > 0 {
			pdeath = 0
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:   syscall.CLONE_NEWPID,
			Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET,
			Pdeathsig:    pdeath,
		}
		// Rootless: in a user namespace mapping the user's subordinate
		// ids (internal/userns), made first so that the PID, mount and
		// network namespaces belong to it; the shim waits for its maps.
		var err error
		if os.Geteuid() != 0 {
			var cfg *userns.Config
			if cfg, err = userns.Current(userns.KeepIDs); err == nil {
				err = cfg.Start(cmd)
			}
		} else {
			err = cmd.Start()
		}
		theirs.Close()
		logf.Close() // the shim's copy is the pipe's only writer now: its end is the log's
		if err == nil {
			d.shimPID.Store(int64(cmd.Process.Pid))
		}
		started <- err
		if err != nil {
			return
		}
		err = cmd.Wait()
		// runsc's last words before the exit is reported; bounded, as a
		// process that escaped the namespace would keep the pipe open.
		select {
		case <-logDone:
		case <-time.After(2 * time.Second):
		}
		s.err = err
		close(s.done)
	})
	if err := <-started; err != nil {
		ours.Close()
		return nil, fmt.Errorf("starting shim: %w", err)
	}
	return s, nil
}

// shimConn is the daemon's end of the socket pair to its shim.
type shimConn struct {
	f    *os.File
	log  string
	done chan struct{} // closed once the shim (runsc, the guest) has exited
	err  error         // how it exited; read once done is closed
}

// tap receives tap0's fd from the shim.
func (s *shimConn) tap() (int, error) {
	buf := make([]byte, 16)
	oob := make([]byte, unix.CmsgSpace(4))
	s.f.SetReadDeadline(time.Now().Add(30 * time.Second))
	rc, err := s.f.SyscallConn()
	if err != nil {
		return -1, err
	}
	var n, oobn int
	var rerr error
	rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
		return rerr != unix.EAGAIN
	})
	if rerr != nil || n == 0 {
		return -1, fmt.Errorf("shim did not send the tap device (%v); see %s", rerr, s.log)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return -1, fmt.Errorf("parsing tap fd message: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return -1, fmt.Errorf("parsing tap fd: %v", err)
	}
	return fds[0], nil
}

// startGuest tells the shim to start runsc.
func (s *shimConn) startGuest() error {
	if _, err := s.f.Write([]byte{runtime.ShimGo}); err != nil {
		return fmt.Errorf("telling the shim to start the guest: %w; see %s", err, s.log)
	}
	return nil
}

func (s *shimConn) Close() error { return s.f.Close() }

// waitAgent dials the guest's SSH port until the session proxy can
// authenticate to the agent there.
func (d *daemon) waitAgent() error {
	deadline := time.Now().Add(bootTimeout)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		select {
		case <-d.keeper.done:
			return errStopped
		default:
		}
		// A short dial timeout: a SYN sent before the guest's stack is up is
		// dropped, and waiting out TCP's 1 s retransmit would add a second
		// to every boot.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		c, err := d.stack.DialGuest(ctx, 22)
		cancel()
		if err == nil && d.fork != nil {
			if err := d.takeForkIdentity(c); errors.Is(err, errForkUnknown) {
				return err
			} else if err != nil {
				d.log.Warn("fork: the restored guest has not taken this sandbox's identity yet", "err", err)
				time.Sleep(100 * time.Millisecond)
			} else {
				d.fork = nil
			}
			continue
		}
		// The agent is up when the proxy has authenticated to it; that
		// connection then carries the first session, and every other.
		if err == nil && d.proxy.Handshake(c) == nil {
			return nil
		}
		// Until the guest's stack is up each attempt waits out its dial
		// timeout; after, a refused dial returns at once, and a short pause
		// is what bounds how late the agent is noticed.
		time.Sleep(min(time.Duration(attempt+1)*time.Millisecond, 5*time.Millisecond))
	}
	return errors.New("guest agent did not answer within " + bootTimeout.String())
}

// stopGuest ends the shim and with it runsc and the guest (the shim is
// PID 1 of their namespace), and waits until they have exited: with
// graceful, SIGTERM and the guest's grace first (runtime.StopGrace), else
// SIGKILL at once, as for a start that failed.
func (d *daemon) stopGuest(s *shimConn, graceful bool) error {
	select {
	case <-s.done:
		return nil
	default:
	}
	pid := int(d.shimPID.Load())
	if pid <= 0 {
		return errors.New("no pid of the shim to signal") // kill(0) would signal our own group
	}
	if graceful {
		if err := unix.Kill(pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
			d.log.Warn("asking the guest to stop", "err", err)
		}
		select {
		case <-s.done:
			return nil
		case <-time.After(runtime.StopGrace + 2*time.Second):
			d.log.Warn("guest did not stop in time; killing")
		}
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("killing the shim (pid %d): %w", pid, err)
	}
	<-s.done
	return nil
}

func (d *daemon) setStopped(reason string, cause error) error {
	return d.updateRecord(func(r *state.Record) error {
		r.State, r.StopReason, r.Stopped, r.DaemonPID = stoppedState(reason), reason, time.Now(), 0
		r.Error = ""
		if cause != nil {
			r.Error = cause.Error()
		}
		return nil
	})
}

// requestStop stops the sandbox: in the keeper directly, in the gate
// process by asking the keeper. cause is what failed, for
// state.StopError.
func (d *daemon) requestStop(reason string, cause error) {
	if d.keeper != nil {
		req := stopRequest{Reason: reason}
		if cause != nil {
			req.Error = cause.Error()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := d.keeper.call(ctx, "stop", req, nil); err != nil {
			d.log.Warn("asking the keeper to stop the sandbox", "err", err)
		}
	}
	d.stopOnce.Do(func() {
		d.stopReason = reason
		if cause != nil {
			d.stopError = cause.Error()
		}
		close(d.stopCh)
	})
}

// listenControl listens on the control socket, 0600, and makes its
// server; the gate process serves it once it runs (srv.Serve).
func (d *daemon) listenControl() (net.Listener, *http.Server, error) {
	sock := control.Socket(d.o.Dir)
	old := unix.Umask(0o077)
	ln, err := net.Listen("unix", sock)
	unix.Umask(old)
	if err != nil {
		return nil, nil, fmt.Errorf("listening on control socket: %w", err)
	}
	os.Chmod(sock, 0o600)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", d.handleStatus)
	mux.HandleFunc("POST /v1/stop", d.handleStop)
	mux.HandleFunc("POST /v1/suspend", d.handleSuspend)
	mux.HandleFunc("GET /v1/ssh", d.handleSSH)
	mux.HandleFunc("GET /v1/network/rules", d.handleRules)
	mux.HandleFunc("POST /v1/network/rules", d.handleChangeRules)
	mux.HandleFunc("GET /v1/network/denials", d.handleDenials)
	mux.HandleFunc("POST /v1/presets", d.handlePreset)
	mux.HandleFunc("POST /v1/secrets/refresh", d.handleSecretsRefresh)
	mux.HandleFunc("GET /v1/watch", d.handleWatch)
	mux.HandleFunc("POST /v1/holds/{id}", d.handleAnswer)
	mux.HandleFunc("POST /v1/policies/reload", d.handleReloadPolicies)
	mux.HandleFunc("GET /v1/forwards", d.handleForwards)
	mux.HandleFunc("POST /v1/forwards", d.handleChangeForward)
	for _, route := range testRoutes {
		route(mux, d)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return ln, srv, nil
}

// testRoutes are routes only a test build serves (escape_moattest.go).
var testRoutes []func(*http.ServeMux, *daemon)

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func (d *daemon) handleStatus(w http.ResponseWriter, r *http.Request) {
	rec, _ := d.record()
	// The daemon's pid is the keeper's, as daemon.pid says.
	st := control.Status{Schema: control.Schema, PID: os.Getppid(), Sessions: d.sess.count(), Image: d.o.ImageRef,
		Platform: d.o.Plan.Platform}
	if d.net != nil {
		st.Denials = d.net.ledger.Total()
		st.Warnings = d.net.policyWarnings()
	}
	h := d.host()
	st.Resources, st.Disk = h.Resources, h.Disk
	st.Activity, st.Gate = d.activityStatus(), d.gateStatus()
	if rec != nil {
		st.Name, st.State, st.Workspace, st.Started = rec.Name, rec.State, rec.Workspace, rec.Started
	}
	writeJSON(w, http.StatusOK, st)
}

func (d *daemon) handleStop(w http.ResponseWriter, r *http.Request) {
	var req control.StopRequest
	json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req)
	reason := req.Reason
	switch reason {
	case state.StopIdle, state.StopHost, state.StopUser:
	default:
		reason = state.StopUser
	}
	writeJSON(w, http.StatusAccepted, map[string]int{"schema": control.Schema})
	d.requestStop(reason, nil)
}

// handleSSH hands the client's connection, after the 101, to the session
// proxy, which speaks SSH with the client and carries its channels to the
// guest agent.
func (d *daemon) handleSSH(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") != control.UpgradeProto {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: "missing Upgrade: " + control.UpgradeProto})
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, control.ErrorBody{Schema: control.Schema, Error: "cannot hijack"})
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	if !d.sess.enter() {
		// Hijacked already: answer by hand.
		b := `{"schema":1,"error":"` + control.ErrStopping + `"}`
		brw.WriteString("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + b)
		brw.Flush()
		conn.Close()
		return
	}
	defer d.sess.leave()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + control.UpgradeProto + "\r\n\r\n")
	brw.Flush()
	d.proxy.Serve(control.Hijacked(conn, brw.Reader))
}

// newProxy makes the session proxy with the sandbox's keys: the client key
// it authenticates with (and accepts from the CLI), and the agent's host
// key, which it checks and presents.
func (d *daemon) newProxy() (*session.Proxy, error) {
	client, err := keys.Client(d.o.Dir)
	if err != nil {
		return nil, err
	}
	host, err := keys.Host(filepath.Join(d.o.Dir, keys.HostKey))
	if err != nil {
		return nil, err
	}
	pc := session.ProxyConfig{
		Dial:   func(ctx context.Context) (net.Conn, error) { return d.stack.DialGuest(ctx, 22) },
		Client: client, Host: host, Log: d.log,
	}
	if len(d.o.SSHAgentKeys) > 0 {
		// The host's agent as the daemon was started with it: the CLI's
		// SSH_AUTH_SOCK, dialled afresh for every channel.
		sock := os.Getenv("SSH_AUTH_SOCK")
		pc.Agent = func() session.AgentConn {
			f := &sshagent.Filter{Sock: sock, Allow: d.o.SSHAgentKeys, Dial: d.dialAgentVia()}
			if d.o.SSHAgentConfirm {
				f.Confirm = d.confirmSign
			}
			return f
		}
	}
	return session.NewProxy(pc), nil
}
