package secret

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"moat.dev/moat/internal/config"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// ErrUnavailable is matched by every error for a value that could not be
// read: a variable not set, a file missing, a command that failed.
var ErrUnavailable = errors.New("secret value unavailable")

// sourceError says which secret could not be read from where, and what
// to do. It never holds the value or a command's output.
type sourceError struct {
	msg string
	err error // the cause, when there is one (an *fs.PathError, a timeout)
}

func (e *sourceError) Error() string        { return e.msg }
func (e *sourceError) Is(target error) bool { return target == ErrUnavailable }
func (e *sourceError) Unwrap() error        { return e.err }

// commandTimeout bounds a command: source. 10 s: long enough for a
// password manager to talk to its agent or a CLI to refresh a token,
// short enough that a command waiting for input nobody will type (there
// is no stdin) does not hang the start. A variable for tests.
var commandTimeout = 10 * time.Second

const (
	// commandWaitDelay is how long after the command is killed its
	// output pipe may stay open (a grandchild holding it) before the
	// wait gives up.
	commandWaitDelay = time.Second
	// maxValueBytes bounds a value. Tokens are short (a JWT a few KiB);
	// a large value is a mistake (the wrong file), and every value's
	// length is what a streamed response body must hold back.
	maxValueBytes = 64 << 10
	// minValueBytes is the shortest value accepted. Responses are
	// scrubbed of every occurrence of a value; a value of a few
	// characters would occur by chance in any body and be mangled.
	minValueBytes = 8
)

func (d *def) sourceName() string {
	if d.source != "" {
		return d.source
	}
	return "the configuration"
}

// fail builds the error for d: what happened to its source and the way
// out.
func (d *def) fail(cause error, format string, args ...any) error {
	msg := fmt.Sprintf("secret %s: %s ", d.name, d.from) + fmt.Sprintf(format, args...)
	msg += fmt.Sprintf(", or remove [secrets.%s] from %s", d.name, d.sourceName())
	return &sourceError{msg: msg, err: cause}
}

// readValue reads d's value on the host and checks that it can be sent
// in a header and scrubbed.
func (d *def) readValue(ctx context.Context, lookupEnv func(string) (string, bool), remote RemoteRead) (value, error) {
	kind, rest, _ := strings.Cut(d.from, ":")
	var v []byte
	if remote != nil && (kind == "file" || kind == "command") {
		b, err := remote(ctx, d.name)
		if err != nil {
			return nil, &sourceError{msg: err.Error(), err: err}
		}
		kind, v = "remote", b
	}
	switch kind {
	case "remote":
	case "env":
		s, ok := lookupEnv(rest)
		if !ok {
			return nil, d.fail(nil, "is not set on the host; export %s", rest)
		}
		v = []byte(s)
	case "file":
		b, err := readFileLimited(rest)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err // its text repeats the path, which from names already
			}
			return nil, d.fail(err, "cannot be read (%v); fix the file", err)
		}
		v = trimNewline(b)
	case "command":
		b, err := d.runCommand(ctx, rest)
		if err != nil {
			return nil, err
		}
		v = trimNewline(b)
	default:
		return nil, d.fail(nil, "is not a secret source; write \"env:VAR\", \"file:PATH\" or \"command:CMD\"")
	}
	if err := d.checkValue(v); err != nil {
		return nil, err
	}
	return value(v), nil
}

// ReadOne reads the value of the secret name, configured as c, on the
// host, as Resolve would: for a process that reads for another
// (RemoteRead). Its errors are Resolve's.
func ReadOne(ctx context.Context, name string, c config.Secret) ([]byte, error) {
	d := def{name: name, from: c.From, source: c.Source}
	v, err := d.readValue(ctx, func(string) (string, bool) { return "", false }, nil)
	return []byte(v), err
}

func (d *def) checkValue(v []byte) error {
	switch {
	case len(v) == 0:
		return d.fail(nil, "gave an empty value; put the credential there")
	case len(v) > maxValueBytes:
		return d.fail(nil, "gave a value of %d bytes, more than the %d KiB a credential can have; check that it names the credential", len(v), maxValueBytes>>10)
	case len(v) < minValueBytes:
		return d.fail(nil, "gave a value of %d bytes; moat needs at least %d to tell it apart from ordinary text when it scrubs responses", len(v), minValueBytes)
	case bytes.ContainsAny(v, "\x00\r\n"):
		// The value goes into header fields, where a line break would
		// split the request (header injection).
		return d.fail(nil, "gave a value with a line break or NUL inside, which cannot be sent in an HTTP header; put the credential alone on one line")
	}
	return nil
}

// trimNewline drops one trailing newline ("\n" or "\r\n"), the one that
// echo, editors and most CLIs add.
func trimNewline(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

// readFileLimited reads at most one byte more than a value may have, so
// the wrong file (a disk image, a log) is reported as too large without
// being read whole.
func readFileLimited(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxValueBytes+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: p, Err: err}
	}
	return b, nil
}

// runCommand runs cmd with sh -c, with no stdin, stderr discarded and a
// timeout. stderr is dropped rather than logged because nobody can
// promise that a failing credential helper does not print the
// credential; the error says to run the command by hand to see why.
func (d *def) runCommand(ctx context.Context, cmd string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	c := exec.CommandContext(ctx, "sh", "-c", cmd)
	var out capWriter
	c.Stdout = &out
	// Its own process group, so that the timeout kills what sh started
	// too, not only sh.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error {
		if c.Process == nil {
			return nil
		}
		return syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	c.WaitDelay = commandWaitDelay
	err := c.Run()
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		return nil, d.fail(ctx.Err(), "did not finish within %s (it has no input, so it cannot prompt); make it work without a prompt", commandTimeout)
	case ctx.Err() != nil:
		return nil, d.fail(ctx.Err(), "was interrupted (%v)", ctx.Err())
	case out.over:
		return nil, d.fail(nil, "printed more than the %d KiB a credential can have; make it print the credential alone", maxValueBytes>>10)
	case err != nil:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			// ExitError's text is only the status; its output is never
			// captured here.
			return nil, d.fail(nil, "failed (%v; its output is not shown, since it may hold the credential); run it on the host to see why", ee.ProcessState)
		}
		return nil, d.fail(err, "could not be run (%v)", err)
	}
	return out.bytes(), nil
}

var errTooLarge = errors.New("value too large")

// capWriter keeps at most maxValueBytes+1 bytes and remembers that there
// were more, so a runaway command or a huge file cannot fill memory and
// is still reported as too large.
type capWriter struct {
	buf  []byte
	over bool
}

func (w *capWriter) Write(p []byte) (int, error) {
	room := maxValueBytes + 1 - len(w.buf)
	if len(p) > room {
		w.buf = append(w.buf, p[:max(room, 0)]...)
		w.over = true
		// Failing the write closes the pipe, so the command dies of
		// SIGPIPE instead of running on until the timeout.
		return 0, errTooLarge
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// bytes is the kept bytes; a value over the limit keeps one byte too
// many, so checkValue reports it as too large.
func (w *capWriter) bytes() []byte { return w.buf }
