package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/state"
)

// sandbox is the CLI's handle for the sandbox called name: the one place
// that says whether its daemon runs, builds the client that talks to it,
// and decides between telling the daemon and editing the record. Each
// command used to do all three itself, and the copies drifted apart.
type sandbox struct {
	name string
	dir  string // its state directory
}

// sandboxAt is the handle of the sandbox whose state directory is dir.
func sandboxAt(dir string) sandbox { return sandbox{name: filepath.Base(dir), dir: dir} }

// alive says whether the sandbox's daemon runs. The daemon holds its lock
// for as long as it lives and the kernel lets go of it when the process
// dies, so the lock is the one sign that cannot be stale: a control
// socket is left behind by a crash, and may exist before the daemon
// answers on it.
func (s sandbox) alive() bool { return state.DaemonAlive(s.dir) }

// auditPath is the audit log of the sandbox in dir, whose record is rec:
// its gate process's, or, for a Docker sandbox, the one its gate
// container writes for the workload.
func auditPath(dir string, rec *state.Record) string {
	if rec.Runtime == runtimeDocker {
		return dockerrt.AuditPath(dir)
	}
	return state.AuditPath(dir)
}

// socket is the path of the daemon's control socket.
func (s sandbox) socket() string { return control.Socket(s.dir) }

// client is the control client of the sandbox's daemon. It dials on each
// request, so making one costs nothing and proves nothing: ask alive.
func (s sandbox) client() *control.Client { return control.At(s.dir) }

// call makes one request of the daemon, bounded by timeout, whether or
// not it runs (the request's error says so). Every request has a
// deadline: a wedged daemon must not hang the command.
func (s sandbox) call(timeout time.Duration, req func(context.Context, *control.Client) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := req(ctx, s.client())
	// A dial that finds no socket, or nobody on it, says nothing a user
	// can act on by itself: name the sandbox, and where to look.
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		state := "is not running"
		if s.alive() {
			state = "runs but does not answer on " + s.socket()
		}
		return fmt.Errorf("the daemon of sandbox %q %s (%w); see: moat logs %s", s.name, state, err, s.name)
	}
	return err
}

// ask asks the daemon, when it runs, and says whether it answered. It is
// for reads that have a second source (the record, the audit log): a
// daemon that is stopping, wedged, or refuses the request is no reason to
// fail a read the caller can answer itself, so its error is dropped.
func ask[T any](s sandbox, timeout time.Duration, req func(*control.Client, context.Context) (T, error)) (T, bool) {
	var v T
	if !s.alive() {
		return v, false
	}
	err := s.call(timeout, func(ctx context.Context, c *control.Client) (err error) {
		v, err = req(c, ctx)
		return err
	})
	return v, err == nil
}

// change applies a change to the sandbox: through its daemon when it
// runs, which applies it at once and records it, else to its record,
// which the next start reads. Unlike ask, a running daemon that fails is
// an error, never a reason to edit the record instead: the running gate
// does not apply an edit made behind its back (it recompiles when told,
// and its process works from its own copy of the record), and the
// command would say the change was made.
// The daemon's errors get their exit codes from fromDaemon, unless
// live gave them one; record's are returned as they are. A nil live or
// record means that side has nothing to do.
func (s sandbox) change(timeout time.Duration, live func(context.Context, *control.Client) error, record func(*state.Record) error) error {
	if s.alive() {
		if live == nil {
			return nil
		}
		return fromDaemon(s.call(timeout, live))
	}
	if record == nil {
		return nil
	}
	return state.Update(s.dir, record)
}
