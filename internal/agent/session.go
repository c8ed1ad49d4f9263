package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"
)

// cwdEnv is the environment variable the client uses to choose the session's
// working directory. It travels as an env request because SSH has no
// working-directory request, and it is consumed here, never passed on.
const cwdEnv = "MOAT_CWD"

// exitSetupFailed is the exit status when the command never started (bad
// working directory, exec failure); 1, as sshd's child uses when it cannot
// exec the shell.
const exitSetupFailed = 1

// session is one SSH "session" channel: the requests that configure it, then
// at most one process.
type session struct {
	srv *Server
	ch  ssh.Channel
	log *slog.Logger

	env     []string // client env requests as NAME=value, in arrival order
	cwd     string   // from MOAT_CWD; empty means the server default
	pty     *ptyRequest
	command *string // accepted by exec or shell, started once the reply is sent
	proc    *process

	// setupErr is set when exec or shell was accepted but the command could
	// not start; it is reported once the request has been answered.
	setupErr error
}

type ptyRequest struct {
	term string
	size pty.Winsize
}

// serveSession is the channelHandler for "session" channels.
func (s *Server) serveSession(ctx context.Context, nch ssh.NewChannel) {
	if s.Ready != nil {
		select {
		case <-s.Ready:
		case <-ctx.Done():
			nch.Reject(ssh.ConnectionFailed, "the agent is stopping")
			return
		}
	}
	ch, reqs, err := nch.Accept()
	if err != nil {
		s.log().Warn("accepting session channel", "err", err)
		return
	}
	ss := &session{srv: s, ch: ch, log: s.log()}
	ss.serve(ctx, reqs)
}

// serve handles requests until the process exits, the client closes the
// channel, or ctx ends; in the last two cases the process group is killed.
func (ss *session) serve(ctx context.Context, reqs <-chan *ssh.Request) {
	defer func() {
		ss.ch.Close()
		if ss.proc != nil {
			ss.proc.close()
			// The input goroutine ends once the channel is fully closed
			// (the peer's close, or the connection's end); by now both
			// are on their way.
			ss.proc.input.Wait()
		}
	}()
	var exited <-chan struct{} // nil (blocks forever) until a process starts
	for {
		select {
		case req, ok := <-reqs:
			if !ok {
				// Channel closed by the client or connection lost.
				ss.stop()
				return
			}
			ok = ss.handle(req)
			if req.WantReply {
				req.Reply(ok, nil)
			}
			// The command starts after the reply, so that the reply's trip
			// to the client overlaps the start (a fork and exec inside
			// gVisor: 10-20 ms). A command that cannot start is reported
			// as before: on stderr, with exit status 1.
			if ss.command != nil {
				ss.start(*ss.command)
				ss.command = nil
			}
			if ss.setupErr != nil {
				ss.fail()
				ss.drain(reqs)
				return
			}
			if ss.proc != nil {
				exited = ss.proc.done
			}
		case <-exited:
			ss.finish()
			ss.drain(reqs)
			return
		case <-ctx.Done():
			ss.stop()
			return
		}
	}
}

func (ss *session) handle(req *ssh.Request) bool {
	switch req.Type {
	case "env":
		return ss.handleEnv(req.Payload)
	case "pty-req":
		return ss.handlePty(req.Payload)
	case "window-change":
		return ss.handleWindowChange(req.Payload)
	case "exec":
		var m struct{ Command string }
		if ss.proc != nil || ssh.Unmarshal(req.Payload, &m) != nil {
			return false
		}
		ss.command = &m.Command
		return true
	case "shell":
		if ss.proc != nil {
			return false
		}
		ss.command = new(string) // "": a login shell
		return true
	case "signal":
		return ss.handleSignal(req.Payload)
	case "subsystem":
		// sftp (scp, editors' file access): like exec, one process wired
		// to the channel, run as the session's user, so it can touch
		// only what the user can.
		var m struct{ Name string }
		if ss.proc != nil || ssh.Unmarshal(req.Payload, &m) != nil || m.Name != "sftp" || len(ss.srv.SFTPCommand) == 0 {
			return false
		}
		cmd := QuoteArgs(ss.srv.SFTPCommand)
		ss.command = &cmd
		return true
	}
	// auth-agent-req@openssh.com, x11-req and keepalives are refused;
	// OpenSSH clients treat a failure reply as "not available".
	return false
}

// CheckEnv says whether the agent accepts an env request. Any name is
// accepted (the sandbox is the user's), but one that cannot be represented
// in an environ entry would make exec fail later. Clients check first and
// send env requests without waiting for the replies.
func CheckEnv(name, value string) error {
	switch {
	case name == "":
		return errors.New("empty variable name")
	case strings.ContainsAny(name, "=\x00"):
		return fmt.Errorf("variable name %q contains '=' or a NUL byte", name)
	case strings.ContainsRune(value, 0):
		return fmt.Errorf("the value of %s contains a NUL byte", name)
	}
	return nil
}

func (ss *session) handleEnv(payload []byte) bool {
	var m struct{ Name, Value string }
	if err := ssh.Unmarshal(payload, &m); err != nil {
		return false
	}
	if CheckEnv(m.Name, m.Value) != nil {
		return false
	}
	if m.Name == cwdEnv {
		ss.cwd = m.Value
		return true
	}
	ss.env = append(ss.env, m.Name+"="+m.Value)
	return true
}

func (ss *session) handlePty(payload []byte) bool {
	var m struct {
		Term                      string
		Cols, Rows, Width, Height uint32
		Modes                     string
	}
	if ss.pty != nil || ss.proc != nil || ssh.Unmarshal(payload, &m) != nil {
		return false
	}
	// Terminal modes are not applied: a fresh Linux pty already has the
	// defaults (ISIG, ICANON, ECHO) every client asks for, and the host
	// CLI puts its own terminal in raw mode.
	ss.pty = &ptyRequest{term: m.Term, size: winsize(m.Cols, m.Rows, m.Width, m.Height)}
	return true
}

func (ss *session) handleWindowChange(payload []byte) bool {
	var m struct{ Cols, Rows, Width, Height uint32 }
	if ss.pty == nil || ssh.Unmarshal(payload, &m) != nil {
		return false
	}
	ss.pty.size = winsize(m.Cols, m.Rows, m.Width, m.Height)
	if ss.proc == nil {
		return true // applied when the process starts
	}
	if err := ss.proc.resize(&ss.pty.size); err != nil {
		ss.log.Debug("resizing pty", "err", err)
		return false
	}
	return true
}

func (ss *session) handleSignal(payload []byte) bool {
	var m struct{ Signal string }
	if ss.proc == nil || ssh.Unmarshal(payload, &m) != nil {
		return false
	}
	sig, ok := SignalNumber(ssh.Signal(m.Signal))
	if !ok {
		return false
	}
	return ss.proc.signal(sig) == nil
}

// start runs command (or a login shell when empty). Failures are recorded
// in setupErr so serve can answer the request before reporting them.
func (ss *session) start(command string) {
	dir, err := ss.workDir()
	if err != nil {
		ss.setupErr = err
		return
	}
	shell := ss.srv.shell()
	spec := procSpec{
		path: shell,
		env:  ss.environ(),
		dir:  dir,
		cred: ss.srv.credential(),
		uid:  ss.srv.UID,
		gid:  ss.srv.GID,
		pty:  ss.pty,

		children: ss.srv.Children,
	}
	if command == "" {
		// A leading '-' in argv[0] is how login(1) and sshd ask a shell to
		// act as a login shell; it works for every sh, unlike "-l".
		spec.args = []string{"-" + filepath.Base(shell)}
	} else {
		spec.args = []string{filepath.Base(shell), "-c", command}
	}
	proc := ss.startDirect(command, spec)
	if proc == nil {
		proc, err = startProcess(spec, ss.ch, ss.log)
	}
	if err != nil {
		ss.setupErr = fmt.Errorf("starting %s: %w", shell, err)
		return
	}
	ss.proc = proc
	ss.log.Debug("session started", "pid", proc.pid, "pty", ss.pty != nil, "shell", command == "", "direct", proc.cmd.Path != shell)
}

// startDirect runs command's program without the shell when the shell
// would add nothing (see direct.go). It returns nil when the command needs
// the shell or the program could not be started, which the shell then
// reports as it always does (command not found, permission denied, a script
// without #!).
func (ss *session) startDirect(command string, shellSpec procSpec) *process {
	argv, ok := directArgv(command)
	if !ok || needsShellEnv(shellSpec.env) {
		return nil
	}
	path := lookPath(argv[0], shellSpec.env)
	if path == "" {
		return nil
	}
	spec := shellSpec
	spec.path, spec.args = path, argv
	spec.env = shellEnviron(shellSpec.env, shellSpec.path, shellSpec.dir, path)
	proc, err := startProcess(spec, ss.ch, ss.log)
	if err != nil {
		ss.log.Debug("starting without the shell", "path", path, "err", err)
		return nil
	}
	return proc
}

// workDir resolves and checks the directory the session starts in. A missing
// directory is an error, never a silent fallback: a command run in the wrong
// directory (say, "rm -r build") is worse than one that does not run.
func (ss *session) workDir() (string, error) {
	dir := ss.srv.defaultDir()
	if ss.cwd != "" {
		dir = ss.cwd
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(ss.srv.defaultDir(), dir)
		}
	}
	fi, err := os.Stat(dir)
	if err == nil && !fi.IsDir() {
		err = &fs.PathError{Op: "stat", Path: dir, Err: syscall.ENOTDIR}
	}
	if err != nil {
		return "", fmt.Errorf("using working directory %s: %w", dir, errors.Unwrap(err))
	}
	return dir, nil
}

// environ is the server's base environment, then TERM from pty-req, then
// what the client sent, later entries replacing earlier ones by name.
func (ss *session) environ() []string {
	env := append([]string(nil), ss.srv.Env...)
	if ss.srv.AgentSocket != "" {
		env = append(env, "SSH_AUTH_SOCK="+ss.srv.AgentSocket)
	}
	if ss.pty != nil && ss.pty.term != "" {
		env = append(env, "TERM="+ss.pty.term)
	}
	env = append(env, ss.env...)
	return dedupEnv(env)
}

// dedupEnv keeps the last entry for each name, at the position of the first,
// so a client's PATH replaces the base PATH instead of appearing twice (libc
// getenv would pick the first).
func dedupEnv(env []string) []string {
	index := make(map[string]int, len(env))
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := index[name]; ok {
			out[i] = kv
			continue
		}
		index[name] = len(out)
		out = append(out, kv)
	}
	return out
}

// fail reports setupErr on the client's stderr with exit status 1.
func (ss *session) fail() {
	ss.log.Info("session setup failed", "err", ss.setupErr)
	fmt.Fprintf(ss.ch.Stderr(), "moat: %v\n", ss.setupErr)
	ss.sendExitStatus(exitSetupFailed)
	ss.ch.Close()
}

// finish reports how the process ended. proc.done has closed, so all of its
// output has already been written to the channel.
func (ss *session) finish() {
	ws, _ := ss.proc.state.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		if name, ok := SignalName(ws.Signal()); ok {
			ss.log.Debug("session exited", "pid", ss.proc.pid, "signal", string(name))
			ss.ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
				Signal     string
				CoreDumped bool
				Message    string
				Lang       string
			}{Signal: string(name), CoreDumped: ws.CoreDump()}))
			ss.ch.Close()
			return
		}
		// A signal SSH has no name for still needs a recognisable code.
		ss.sendExitStatus(128 + int(ws.Signal()))
		ss.ch.Close()
		return
	}
	ss.log.Debug("session exited", "pid", ss.proc.pid, "status", ws.ExitStatus())
	ss.sendExitStatus(ws.ExitStatus())
	ss.ch.Close()
}

func (ss *session) sendExitStatus(code int) {
	ss.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
}

// stop kills the process group (if any) because the client is gone, and
// waits until the process has been reaped and its I/O goroutines are done.
func (ss *session) stop() {
	if ss.proc == nil {
		return
	}
	ss.log.Debug("session hung up", "pid", ss.proc.pid)
	ss.proc.hangup()
}

// drain refuses requests that arrive after we closed the channel, until the
// peer's close (or the connection's end) closes reqs. Leaving them unread
// would stall the connection's other channels.
func (ss *session) drain(reqs <-chan *ssh.Request) {
	for req := range reqs {
		if req.WantReply {
			req.Reply(false, nil)
		}
	}
}

func winsize(cols, rows, width, height uint32) pty.Winsize {
	return pty.Winsize{Cols: clamp16(cols), Rows: clamp16(rows), X: clamp16(width), Y: clamp16(height)}
}

func clamp16(v uint32) uint16 {
	return uint16(min(v, 0xffff))
}
