// Package helperproc runs the binaries beside moat that hold an SDK moat
// does not link (moat-docker, moat-kube; docs/architecture.md, "Moat's
// binaries"), one operation per process, and reads their answer: the
// result on stdout, the lines of stderr that begin with the binary's
// error prefix as its error message, every other stderr line passed on to
// the user as it comes, and the exit code as the error's class.
package helperproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Binary is one such binary and how moat runs it.
type Binary struct {
	Name    string        // "moat-docker": in messages, and Name+": " begins its error lines
	Path    string        // beside moat
	Stderr  io.Writer     // its other stderr lines, as they come; nil: dropped
	Env     []string      // its environment; nil: moat's own
	Grace   time.Duration // from SIGTERM, when the caller gives up, to SIGKILL
	Classes map[int]error // the sentinel each exit code stands for
}

// Error is a failed operation: its message, and the class its exit code
// names, which errors.Is matches.
type Error struct {
	Binary, Op string
	Code       int
	Msg        string
	Class      error
}

func (e *Error) Error() string {
	if e.Msg != "" {
		return e.Msg
	}
	return fmt.Sprintf("%s %s failed (exit status %d) and said nothing on stderr; what it printed is above", e.Binary, e.Op, e.Code)
}

func (e *Error) Unwrap() error { return e.Class }

// Err is the error of op ending with code and msg.
func (b Binary) Err(op string, code int, msg string) *Error {
	return &Error{Binary: b.Name, Op: op, Code: code, Msg: msg, Class: b.Classes[code]}
}

// Command is `NAME op args...`. On the caller's deadline the binary is
// asked to stop (SIGTERM), so that it can undo what it half made, and is
// killed Grace later.
func (b Binary) Command(ctx context.Context, op string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, b.Path, append([]string{op}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = b.Grace
	cmd.Env = b.Env
	return cmd
}

// Run starts cmd (from Command, its stdin set by the caller), hands its
// stdout to stdout (nil: none expected, and dropped) while its stderr is
// relayed, and returns its error: an *Error when it exited non-zero, else
// what stdout returned.
func (b Binary) Run(ctx context.Context, cmd *exec.Cmd, op string, stdout func(io.Reader) error) error {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stderr = errW
	if err := cmd.Start(); err != nil {
		errR.Close()
		errW.Close()
		return fmt.Errorf("running %s: %w", b.Path, err)
	}
	errW.Close()
	msgc := make(chan string, 1)
	go func() { msgc <- b.relay(errR); errR.Close() }()
	var serr error
	if stdout != nil {
		serr = stdout(out)
	}
	io.Copy(io.Discard, out) // what the reader left: the child must not block
	msg := <-msgc
	if werr := cmd.Wait(); werr != nil {
		var ee *exec.ExitError
		if !errors.As(werr, &ee) {
			return fmt.Errorf("running %s %s: %w", b.Path, op, werr)
		}
		if ctx.Err() != nil && msg == "" {
			return fmt.Errorf("%s %s: %w", b.Name, op, ctx.Err())
		}
		return b.Err(op, ee.ExitCode(), msg)
	}
	return serr
}

// relay passes the binary's stderr on, line by line, and returns its
// error message: the lines with its prefix, without it.
func (b Binary) relay(r io.Reader) string {
	w := b.Stderr
	if w == nil {
		w = io.Discard
	}
	prefix := b.Name + ": "
	var msg []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			msg = append(msg, m)
			continue
		}
		fmt.Fprintln(w, sc.Text())
	}
	io.Copy(io.Discard, r) // a line past the buffer: the child must not block
	return strings.Join(msg, "\n")
}
