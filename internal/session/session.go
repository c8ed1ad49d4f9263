// Package session is the host half of "moat attach" and "moat exec": it runs
// one command in a sandbox over an SSH connection to the guest agent (see
// package agent) and makes it behave like a local process. Its exit code
// becomes ours, ^C and window resizes reach it, and the local terminal is
// always left as we found it.
package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/agent"
)

// ErrConnectionLost means the session ended without the sandbox reporting an
// exit status: the connection dropped, or the sandbox stopped.
var ErrConnectionLost = errors.New("connection to the sandbox was lost")

// ErrNotStarted means the sandbox did not start the command: it refused
// it, or the session ended before it answered.
var ErrNotStarted = errors.New("starting command")

// exitFailed is the exit code returned alongside an error, as ssh(1) exits
// 255 when it cannot tell how the remote command ended.
const exitFailed = 255

// cwdEnv names the env request that sets the working directory; the agent
// consumes it.
const cwdEnv = "MOAT_CWD"

// Options describes one command.
type Options struct {
	Argv []string          // nil or empty: an interactive login shell
	TTY  bool              // request a PTY; use when the local stdin is a terminal
	Dir  string            // working directory in the sandbox; empty: the workspace
	Env  map[string]string // sent as env requests, overriding the sandbox's defaults
	Term string            // TERM for the PTY; default $TERM, else xterm-256color

	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Run runs o's command on c and returns its exit code: the exit status, or
// 128+n when it was killed by signal n. When err is non-nil the code is 255;
// err wraps ErrConnectionLost if the sandbox went away mid-command.
//
// With TTY and a terminal on Stdin, the terminal is in raw mode until Run
// returns. Without TTY, SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to this
// process are forwarded to the command instead of killing us.
//
// The SSH library copies Stdin from a goroutine that Run cannot interrupt;
// when Stdin never reaches EOF (a terminal) that goroutine stays blocked in
// Read after Run returns, which is harmless for a CLI about to exit.
func Run(ctx context.Context, c *ssh.Client, o Options) (exitCode int, err error) {
	if err := ctx.Err(); err != nil {
		return exitFailed, fmt.Errorf("running command: %w", err)
	}
	sess, err := c.NewSession()
	if err != nil {
		return exitFailed, fmt.Errorf("opening session: %w", err)
	}
	defer sess.Close()
	// Setup requests block on replies; closing the session unblocks them.
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()

	if err := sendEnv(sess, o); err != nil {
		return exitFailed, err
	}
	var tty *terminal
	if o.TTY {
		if tty, err = openTerminal(o.Stdin, o.Stdout); err != nil {
			return exitFailed, err
		}
		defer tty.restore()
		w, h := tty.size()
		modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
		if err := sess.RequestPty(termName(o.Term), h, w, modes); err != nil {
			return exitFailed, fmt.Errorf("requesting pty: %w", err)
		}
	}
	sess.Stdin, sess.Stdout, sess.Stderr = o.Stdin, o.Stdout, o.Stderr

	// Subscribe before starting, so a signal that arrives as the command
	// starts is forwarded rather than killing us with the command orphaned.
	sigs := make(chan os.Signal, 8)
	if o.TTY {
		signal.Notify(sigs, syscall.SIGWINCH, syscall.SIGTERM, syscall.SIGHUP)
	} else {
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	}
	defer signal.Stop(sigs)

	if len(o.Argv) == 0 {
		err = sess.Shell()
	} else {
		err = sess.Start(agent.QuoteArgs(o.Argv))
	}
	if err != nil {
		if ctx.Err() != nil {
			return exitFailed, fmt.Errorf("%w: %w", ErrNotStarted, ctx.Err())
		}
		return exitFailed, fmt.Errorf("%w: %w", ErrNotStarted, err)
	}

	waitc := make(chan error, 1)
	go func() { waitc <- sess.Wait() }()
	for {
		select {
		case err := <-waitc:
			if ctx.Err() != nil {
				return exitFailed, fmt.Errorf("running command: %w", ctx.Err())
			}
			return exitStatus(err)
		case sig := <-sigs:
			if code, done := forward(sess, tty, sig.(syscall.Signal)); done {
				<-waitc
				return code, nil
			}
		case <-ctx.Done():
			sess.Close()
			<-waitc
			return exitFailed, fmt.Errorf("running command: %w", ctx.Err())
		}
	}
}

// forward relays one local signal. With a PTY, ^C is a byte the remote
// terminal interprets, so the only signals seen here are a resize or being
// told to stop; stopping closes the session (the agent hangs up the
// command) and reports done with the code a local process killed by sig
// would have.
func forward(sess *ssh.Session, tty *terminal, sig syscall.Signal) (code int, done bool) {
	switch {
	case sig == syscall.SIGWINCH:
		w, h := tty.size()
		sess.WindowChange(h, w)
	case tty != nil:
		sess.Close()
		return 128 + int(sig), true
	default:
		if name, ok := agent.SignalName(sig); ok {
			sess.Signal(name)
		}
	}
	return 0, false
}

// sendEnv sends the session's environment and working directory as env
// requests without waiting for their replies: each reply is a round trip
// through the guest's network stack (about 1 ms on a small systrap host),
// and the agent accepts everything agent.CheckEnv accepts, which is checked
// here first. The requests reach the agent in order, before the exec or
// shell request that follows them.
func sendEnv(sess *ssh.Session, o Options) error {
	type env struct{ Name, Value string }
	var reqs []env
	// Sorted so the requests, and any failure, are the same on every run.
	for _, k := range slices.Sorted(maps.Keys(o.Env)) {
		if err := agent.CheckEnv(k, o.Env[k]); err != nil {
			return fmt.Errorf("setting environment variable %s: %w", k, err)
		}
		reqs = append(reqs, env{k, o.Env[k]})
	}
	if o.Dir != "" {
		if err := agent.CheckEnv(cwdEnv, o.Dir); err != nil {
			return fmt.Errorf("setting working directory: %w", err)
		}
		reqs = append(reqs, env{cwdEnv, o.Dir})
	}
	for _, r := range reqs {
		if _, err := sess.SendRequest("env", false, ssh.Marshal(&r)); err != nil {
			return fmt.Errorf("setting environment variable %s: %w", r.Name, err)
		}
	}
	return nil
}

// exitStatus turns the result of Session.Wait into an exit code.
func exitStatus(err error) (int, error) {
	var ee *ssh.ExitError
	var missing *ssh.ExitMissingError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		if ee.Signal() != "" {
			if n, ok := agent.SignalNumber(ssh.Signal(ee.Signal())); ok {
				return 128 + int(n), nil
			}
		}
		return ee.ExitStatus(), nil
	case errors.As(err, &missing):
		return exitFailed, fmt.Errorf("waiting for command: %w", ErrConnectionLost)
	}
	return exitFailed, fmt.Errorf("copying command output: %w", err)
}

func termName(t string) string {
	if t != "" {
		return t
	}
	if t = os.Getenv("TERM"); t != "" {
		return t
	}
	return "xterm-256color"
}
