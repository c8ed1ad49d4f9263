package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/checkpoint"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
)

// Suspend and resume (docs/suspend.md). A suspend is asked of the gate
// process (POST /v1/suspend), which ends the attached sessions, since
// their connections to the CLI cannot outlive the gate; the keeper then
// has the shim checkpoint the guest (runtime.ShimSuspend) and stops the
// sandbox as for a stop, but records it suspended. The next start, of
// whatever command, finds the record suspended and the image whole, and
// has the shim restore the guest instead of booting it; the gate process
// is new (connections to the outside are reset), on_up and [[files]] are
// not run again (the guest is as it was), forwards come back with the
// gate.

// suspendTimeout bounds a checkpoint: it writes the guest's memory, which
// for a guest of several GiB on a loaded disk takes minutes.
const suspendTimeout = 10 * time.Minute

// sessionsEndWait bounds the wait for ended sessions' clients to go.
const sessionsEndWait = 5 * time.Second

// suspendStep is the gate process's "suspend" call: "begin" marks the
// record suspending before the sessions are ended, "save" checkpoints.
// Idle: asked by the idle watch, which the keeper may answer with a stop
// (idleParking).
type suspendStep struct {
	Step string `json:"step"`
	Idle bool   `json:"idle,omitempty"`
}

// suspendBegun is the keeper's answer to "begin": Stop when an idle
// suspend is refused, and why.
type suspendBegun struct {
	Stop bool   `json:"stop,omitempty"`
	Why  string `json:"why,omitempty"`
}

// suspendSaved is the keeper's answer to "save".
type suspendSaved struct {
	ImageBytes int64 `json:"image_bytes"`
}

// startState is the state a start records, and the choice it makes: a
// sandbox suspended (or whose suspend or resume was cut short) with a
// whole image is restored from it; any other start boots afresh, and
// an image it finds is stale from that moment, so it goes.
func (d *daemon) startState(r *state.Record) string {
	switch r.State {
	case state.StateSuspended, state.StateSuspending, state.StateResuming:
		_, whole := runtime.ImageSize(d.o.Dir)
		bin := runtime.GuestBinary(d.o.Dir)
		if _, err := os.Stat(bin); whole && err == nil {
			d.o.Plan.Restore = runtime.SuspendDir(d.o.Dir)
			d.o.Plan.Moat = bin
			d.log.Info("resuming from the checkpoint image", "image", d.o.Plan.Restore)
			return state.StateResuming
		}
		d.log.Warn("the sandbox was suspended but has no whole image; starting it afresh")
	}
	d.o.Plan.Restore = ""
	if err := runtime.RemoveSaved(d.o.Dir); err != nil {
		d.log.Warn("removing a stale checkpoint image", "err", err)
	}
	return state.StateStarting
}

// stoppedState is the state a stop records for reason.
func stoppedState(reason string) string {
	if reason == state.StopSuspend {
		return state.StateSuspended
	}
	return state.StateStopped
}

// serveSuspend is the keeper's side of a suspend.
func (d *daemon) serveSuspend(body json.RawMessage) (any, []*os.File, error) {
	var s suspendStep
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, nil, err
	}
	select {
	case <-d.booted:
	default:
		return nil, nil, errors.New("the sandbox is still starting")
	}
	select {
	case <-d.stopCh:
		return nil, nil, errors.New("the sandbox is stopping")
	default:
	}
	running := func() {
		d.updateRecord(func(r *state.Record) error { r.State = state.StateRunning; return nil })
	}
	switch s.Step {
	case "begin":
		if s.Idle {
			suspend, why := idleParking(d.o.IdleAction, d.stateFreeBytes(), d.guestBytes())
			if !suspend {
				d.log.Info("idle: stopping, not suspending", "why", why)
				return suspendBegun{Stop: true, Why: why}, nil, nil
			}
			d.log.Info("idle: suspending", "why", why)
		}
		return suspendBegun{}, nil, d.updateRecord(func(r *state.Record) error { r.State = state.StateSuspending; return nil })
	case "save":
		t := time.Now()
		if err := d.shim.suspend(suspendTimeout); err != nil {
			running()
			d.log.Warn("suspend failed; the sandbox keeps running", "err", err)
			return nil, nil, err
		}
		// What made the image, for the check before its restore (cli:
		// checkSaved). Without one the image is restored as before.
		if m, err := checkpoint.Host(d.o.MoatVersion, d.o.Runsc, nil); err != nil {
			d.log.Warn("the image has no manifest", "err", err)
		} else if err := checkpoint.Write(runtime.SuspendDir(d.o.Dir), m); err != nil {
			d.log.Warn("the image has no manifest", "err", err)
		}
		size, _ := runtime.ImageSize(d.o.Dir)
		d.log.Info("guest saved; stopping", "suspend_ms", time.Since(t).Milliseconds(), "image_bytes", size)
		// After this answer, which the gate process passes on: the
		// stop closes the link.
		d.tasks.Go("suspend: stopping", func() {
			time.Sleep(50 * time.Millisecond)
			d.requestStop(state.StopSuspend, nil)
		})
		return suspendSaved{ImageBytes: size}, nil, nil
	}
	return nil, nil, fmt.Errorf("no suspend step %q", s.Step)
}

// suspend has the shim checkpoint the guest, and waits up to timeout for
// its answer.
func (s *shimConn) suspend(timeout time.Duration) error {
	if _, err := s.f.Write([]byte{runtime.ShimSuspend}); err != nil {
		return fmt.Errorf("asking the shim to save the guest: %w; see %s", err, s.log)
	}
	rc, err := s.f.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, 4096)
	var n int
	var rerr error
	deadline := time.Now().Add(timeout)
	cerr := rc.Control(func(fd uintptr) {
		for {
			left := time.Until(deadline)
			if left <= 0 {
				rerr = fmt.Errorf("the shim did not save the guest within %v", timeout)
				return
			}
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(pfd, int(left.Milliseconds())+1); errors.Is(err, unix.EINTR) {
				continue
			} else if err != nil {
				rerr = err
				return
			}
			if pfd[0].Revents == 0 {
				continue
			}
			n, rerr = unix.Read(int(fd), buf)
			if errors.Is(rerr, unix.EINTR) || errors.Is(rerr, unix.EAGAIN) {
				continue
			}
			return
		}
	})
	if cerr != nil {
		return cerr
	}
	if rerr != nil {
		return fmt.Errorf("reading the shim's answer: %w; see %s", rerr, s.log)
	}
	if n == 0 {
		return fmt.Errorf("the shim exited while saving the guest; see %s", s.log)
	}
	if answer := string(buf[:n]); answer != runtime.ShimSuspended {
		return fmt.Errorf("saving the guest: %s (see %s)", strings.TrimPrefix(answer, "error: "), s.log)
	}
	return nil
}

// suspendBusy is held by the gate process while a suspend runs.
var suspendBusy atomic.Bool

// handleSuspend is POST /v1/suspend, in the gate process.
func (d *daemon) handleSuspend(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, io.LimitReader(r.Body, 4096))
	refuse := func(code int, msg string) {
		writeJSON(w, code, control.ErrorBody{Schema: control.Schema, Error: msg})
	}
	select {
	case <-d.booted:
	default:
		refuse(http.StatusConflict, "the sandbox is still starting; suspend it once it runs")
		return
	}
	ended, saved, err := d.suspendSandbox(r.Context(), false)
	var refused refusal
	switch {
	case errors.As(err, &refused):
		refuse(http.StatusConflict, err.Error()+"; the sandbox keeps running")
		return
	case err != nil:
		refuse(http.StatusInternalServerError, fmt.Sprintf("suspending: %v; the sandbox keeps running", err))
		return
	}
	d.log.Info("sandbox suspended", "sessions_ended", ended, "image_bytes", saved.ImageBytes)
	writeJSON(w, http.StatusOK, control.SuspendAnswer{Schema: control.Schema, Sessions: ended, ImageBytes: saved.ImageBytes})
}

// refusal is a suspend refused before anything was done.
type refusal struct{ error }

// suspendSandbox ends the sessions and has the keeper save the guest, in
// the gate process; the keeper stops the sandbox once it answers. idle:
// asked by the idle watch (errIdleStop when the keeper decides to stop
// instead).
func (d *daemon) suspendSandbox(ctx context.Context, idle bool) (int, suspendSaved, error) {
	var saved suspendSaved
	if !suspendBusy.CompareAndSwap(false, true) {
		return 0, saved, refusal{errors.New("a suspend of this sandbox is already under way")}
	}
	defer suspendBusy.Store(false)
	ctx, cancel := context.WithTimeout(ctx, suspendTimeout+time.Minute)
	defer cancel()
	var begun suspendBegun
	if _, err := d.keeper.call(ctx, "suspend", suspendStep{Step: "begin", Idle: idle}, &begun); err != nil {
		return 0, saved, refusal{err}
	}
	if begun.Stop {
		return 0, saved, fmt.Errorf("%w: %s", errIdleStop, begun.Why)
	}
	ended := d.endSessions()
	if _, err := d.keeper.call(ctx, "suspend", suspendStep{Step: "save"}, &saved); err != nil {
		d.sess.mu.Lock()
		d.sess.closing = false
		d.sess.mu.Unlock()
		return ended, saved, err
	}
	return ended, saved, nil
}

// stateFreeBytes is the free space of the state's filesystem, for an
// unprivileged writer (0 when it cannot be read: no room).
func (d *daemon) stateFreeBytes() uint64 {
	var st unix.Statfs_t
	if err := unix.Statfs(d.o.Dir, &st); err != nil {
		return 0
	}
	return st.Bavail * uint64(st.Bsize)
}

// guestBytes is the sandbox's memory in use, from its cgroup; 0 when
// unknown.
func (d *daemon) guestBytes() uint64 {
	if r := d.resourceStatus(); r != nil {
		return r.MemoryUsageBytes
	}
	return 0
}

// endSessions ends every attached session, and lets no new one attach:
// the connection to the guest agent that carries them is closed, so the
// agent hangs up each session's processes and each client sees its
// session end (and the CLI, the record suspending, says why). It returns
// how many there were.
func (d *daemon) endSessions() int {
	d.sess.mu.Lock()
	d.sess.closing = true
	n := d.sess.sessions
	d.sess.mu.Unlock()
	if d.proxy != nil {
		d.proxy.Close()
	}
	deadline := time.Now().Add(sessionsEndWait)
	for d.sess.count() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return n
}

// runHooks runs the set-up hooks (hooks), except on a resume: the guest
// then is the one they ran in, with what they started still running.
func (d *daemon) runSetUp(ctx context.Context) error {
	if rec, err := d.record(); err == nil && rec.State == state.StateResuming {
		d.log.Info("resumed from the checkpoint image: on_up and [[files]] not run again")
		return nil
	}
	return d.hooks(ctx)
}
