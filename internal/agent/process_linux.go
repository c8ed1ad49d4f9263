package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

const (
	// hangupGrace is how long a hung-up session's leader gets between SIGHUP
	// and SIGKILL: enough for a shell or editor to save history or a swap
	// file, short enough that detaching feels immediate.
	hangupGrace = 500 * time.Millisecond

	// outputIdle is how long output copying continues, after the group has
	// been killed, without any new data. Normally the pipes reach EOF at
	// once; this bound only matters when a process escaped the group
	// (setsid) and still holds them, and must not hold exit-status hostage.
	outputIdle = 500 * time.Millisecond

	// outputMax bounds how long output is still copied after the command
	// exited, when a background process it left keeps writing.
	outputMax = 2 * time.Second
)

// errProcessGone answers signal requests that arrive after the command was
// reaped, when its pid may already belong to someone else.
var errProcessGone = errors.New("process has exited")

type procSpec struct {
	path string
	args []string
	env  []string
	dir  string
	cred *syscall.Credential
	uid  int // owner for the pty slave when cred is set
	gid  int
	pty  *ptyRequest // nil: pipes

	children *Children // nil unless the agent shares PID 1
}

// process is a running session command, the leader of its own process group
// (and, with a PTY, of its own session), plus the goroutines moving its I/O.
type process struct {
	cmd      *exec.Cmd
	pid      int // also the process group id, and the session id with a PTY
	log      *slog.Logger
	children *Children

	ptmx    *os.File   // PTY master; nil with pipes
	stdin   *os.File   // write end of the command's stdin; nil with a PTY
	outputs []*os.File // what output copiers read: ptmx, or stdout and stderr

	output sync.WaitGroup // process → channel; done means all output is sent
	input  sync.WaitGroup // channel → process

	exited       atomic.Bool   // leader reaped; output copiers stop once idle
	exitedAtNano atomic.Int64  // when, for outputMax
	done         chan struct{} // closed when reaped, group killed and output sent
	state        *os.ProcessState

	// mu serialises signalling against reaping: until reaped is set the
	// leader is at worst a zombie, whose pid (and so the group id) the
	// kernel cannot hand out again.
	mu     sync.Mutex
	reaped bool
}

func startProcess(spec procSpec, ch ssh.Channel, log *slog.Logger) (*process, error) {
	cmd := &exec.Cmd{Path: spec.path, Args: spec.args, Env: spec.env, Dir: spec.dir}
	p := &process{cmd: cmd, log: log, children: spec.children, done: make(chan struct{})}
	var err error
	if spec.pty != nil {
		err = p.startPTY(spec)
	} else {
		err = p.startPipes(spec, ch)
	}
	if err != nil {
		return nil, err
	}
	p.pid = cmd.Process.Pid
	if p.ptmx != nil {
		p.output.Go(func() { p.copyOut(ch, p.ptmx) })
		p.input.Go(func() { io.Copy(p.ptmx, ch) })
	}
	go p.wait()
	return p, nil
}

// startPTY opens the pty itself rather than calling pty.StartWithAttrs,
// which does the same Open/Setsize/Start, because it needs the slave's name
// before the child runs: the slave must belong to the session user, or
// programs that reopen their terminal by name (pinentry, script, mesg) fail
// with EACCES.
func (p *process) startPTY(spec procSpec) error {
	ptmx, tty, err := pty.Open()
	if err != nil {
		return fmt.Errorf("opening pty: %w", err)
	}
	defer tty.Close()
	if spec.cred != nil {
		if err := os.Chown(tty.Name(), spec.uid, spec.gid); err != nil {
			p.log.Debug("changing pty owner", "err", err)
		}
	}
	if err := pty.Setsize(ptmx, &spec.pty.size); err != nil {
		ptmx.Close()
		return fmt.Errorf("sizing pty: %w", err)
	}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = tty, tty, tty
	// Setsid+Setctty make the command a session leader with the pty as its
	// controlling terminal, so ^C reaches the foreground job only and job
	// control works. Ctty is the child's fd 0.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Credential: spec.cred}
	if err := p.children.start(p.cmd); err != nil {
		ptmx.Close()
		return err
	}
	p.ptmx = ptmx
	p.outputs = []*os.File{ptmx}
	return nil
}

// startPipes gives the command os.Pipe ends rather than letting exec.Cmd
// copy from io.Writers: exec.Cmd's Wait would then wait for every holder of
// the pipes, so a backgrounded child ("sleep 300 &") would keep the session
// open. Owning the pipes lets us reap, kill the group, then drain.
func (p *process) startPipes(spec procSpec, ch ssh.Channel) error {
	var files []*os.File // every end, closed on failure
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		files = append(files, r, w)
		return r, w, err
	}
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	inR, inW, err1 := pipe()
	outR, outW, err2 := pipe()
	errR, errW, err3 := pipe()
	if err := errors.Join(err1, err2, err3); err != nil {
		closeAll()
		return fmt.Errorf("creating pipes: %w", err)
	}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = inR, outW, errW
	// Setpgid: its own process group, so signals and the final kill reach
	// the command and its children but never the agent.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: spec.cred}
	if err := p.children.start(p.cmd); err != nil {
		closeAll()
		return err
	}
	// The child has its copies; ours would keep stdin open and stop
	// stdout/stderr from ever reaching EOF.
	inR.Close()
	outW.Close()
	errW.Close()
	p.stdin = inW
	p.outputs = []*os.File{outR, errR}
	p.output.Go(func() { p.copyOut(ch, outR) })
	p.output.Go(func() { p.copyOut(ch.Stderr(), errR) })
	p.input.Go(func() {
		io.Copy(inW, ch)
		// Client EOF (or a closed channel) becomes EOF on the command's stdin.
		inW.Close()
	})
	return nil
}

// copyOut moves output to the channel until EOF (or EIO, which is how a pty
// master reports that every slave fd is closed). If the client stops
// accepting data, reading continues into io.Discard so the command never
// blocks on a full pipe while it is being torn down.
func (p *process) copyOut(w io.Writer, f *os.File) {
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				w = io.Discard
			}
		}
		if err != nil {
			return
		}
		if p.exited.Load() {
			// Output keeps flowing while it comes, but a background
			// process that outlives the command and keeps writing must
			// not hold the session open: at most outputMax after the exit.
			d := time.Now().Add(outputIdle)
			if limit := time.Unix(0, p.exitedAtNano.Load()).Add(outputMax); d.After(limit) {
				d = limit
			}
			f.SetReadDeadline(d)
		}
	}
}

// wait owns the command: it learns of the leader's exit without reaping it,
// hangs up a PTY session's other processes while the group id is still
// reserved, reaps, and drains output before announcing done.
func (p *process) wait() {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			if err != nil {
				p.log.Warn("waiting for session process", "pid", p.pid, "err", err)
			}
			break
		}
	}
	p.mu.Lock()
	if p.ptmx != nil {
		// A terminal's hang-up: the shell is gone, so is its terminal.
		p.hangUp()
	}
	// With pipes the command's background processes keep running, as
	// after `ssh host cmd` or `docker exec`: a hook may start a service.
	p.reaped = true
	p.mu.Unlock()
	p.cmd.Wait()
	p.state = p.cmd.ProcessState
	p.children.done(p.pid)

	p.exitedAtNano.Store(time.Now().UnixNano())
	p.exited.Store(true)
	for _, f := range p.outputs {
		f.SetReadDeadline(time.Now().Add(outputIdle))
	}
	p.output.Wait()
	close(p.done)
}

// hangUp ends a session the way a terminal's hang-up does: every process
// in the group (and, with a PTY, the session) gets SIGHUP, and SIGCONT so
// that a stopped job sees it. What ignores it (started with nohup) or
// handles it and goes on keeps running; what it kills is gone. The leader
// itself must end, since the client that ran it is gone: it gets SIGKILL
// if it still runs after hangupGrace. Callers hold mu.
//
// Nothing finer is possible inside gVisor, which shows no signal
// dispositions in /proc. When nothing is left, the usual end of a session,
// one scan of /proc is all this costs; inside gVisor a scan takes
// milliseconds.
func (p *process) hangUp() {
	live := p.members()
	if len(live) == 0 {
		return
	}
	p.signalAll(syscall.SIGHUP, live)
	p.signalAll(syscall.SIGCONT, live)
	deadline := time.Now().Add(hangupGrace)
	for slices.Contains(live, p.pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		live = p.members()
	}
	if slices.Contains(live, p.pid) {
		syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// signalAll signals the group and, because job control moves a PTY shell's
// jobs into groups of their own, each of the session's live processes.
func (p *process) signalAll(sig syscall.Signal, live []int) {
	syscall.Kill(-p.pid, sig)
	for _, pid := range live {
		syscall.Kill(pid, sig)
	}
}

// members lists the live (non-zombie) processes whose process group or
// session is the leader's pid. Zombies are excluded: they are already dead,
// and their reaping is init's job once the leader is gone.
//
// Every command's exit pays one scan, and every system call of the guest
// is a trap into gVisor's Sentry, so each stat file is read with three
// calls (open, read, close): os.ReadFile takes nine there, as gVisor's proc
// files can be polled and Go registers each with its poller.
func (p *process) members() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	buf := make([]byte, 4096)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := readStat(pid, buf)
		if err != nil {
			continue // exited while we looked
		}
		state, pgrp, sid, ok := parseStat(stat)
		if ok && state != 'Z' && (pgrp == p.pid || sid == p.pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// readStat reads /proc/PID/stat into buf with one read: the kernel (and
// gVisor) hands the whole line to a read whose buffer holds it, and a line
// longer than buf is reported as an error rather than cut.
func readStat(pid int, buf []byte) ([]byte, error) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == len(buf) {
			return nil, fmt.Errorf("/proc/%d/stat is longer than %d bytes", pid, len(buf))
		}
		return buf[:n], nil
	}
}

// parseStat extracts state, pgrp and session from /proc/PID/stat. The
// command name is parenthesised and may itself contain ") ", so fields are
// counted from the last ')'.
func parseStat(b []byte) (state byte, pgrp, sid int, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[i+1:])) // state ppid pgrp session ...
	if len(f) < 4 || len(f[0]) != 1 {
		return 0, 0, 0, false
	}
	pgrp, err1 := strconv.Atoi(f[2])
	sid, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil {
		return 0, 0, 0, false
	}
	return f[0][0], pgrp, sid, true
}

// signal delivers a client's signal request to the session's process group.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return errProcessGone
	}
	return syscall.Kill(-p.pid, sig)
}

// hangup ends the session because the client went away (hangUp), then
// waits until the command is reaped and its output goroutines are finished.
func (p *process) hangup() {
	p.mu.Lock()
	if !p.reaped {
		p.hangUp()
	}
	p.mu.Unlock()
	<-p.done
}

func (p *process) resize(ws *pty.Winsize) error {
	if p.ptmx == nil {
		return errors.New("session has no pty")
	}
	return pty.Setsize(p.ptmx, ws)
}

// close releases the files the input goroutine writes to, so it cannot stay
// blocked on a command that no longer reads. Only after done.
func (p *process) close() {
	if p.ptmx != nil {
		p.ptmx.Close()
	}
	if p.stdin != nil {
		p.stdin.Close()
	}
}
