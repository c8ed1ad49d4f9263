package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/session"
	"moat.dev/moat/internal/state"
)

// Set-up hooks. on_create runs once, after the first start, until it
// succeeds: a failure stops the start, the record stays "not set up", and
// the next start runs on_create again from its first command. on_up runs
// on every start, after on_create; a failure is reported and the sandbox
// runs anyway (a dev server that did not start should not lock the user
// out of the sandbox that would let them fix it). Both run before the
// sandbox is reported running, so a command never races its set-up. Hooks
// must be idempotent: a start that was interrupted runs them again.
//
// Output goes to the CLI that started the sandbox (on the ready pipe, as
// "out: " lines, which it prints on its stderr) and to the daemon's log.

// hookTimeout bounds all hooks of one start: long enough for a dependency
// install, short enough that a hook waiting on input does not keep a
// start pending forever.
const hookTimeout = 30 * time.Minute

// hookOut writes hook output line by line to the log and the ready pipe.
type hookOut struct {
	mu    sync.Mutex
	ready io.Writer // may be nil
	log   io.Writer
	buf   []byte
}

func (h *hookOut) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buf = append(h.buf, p...)
	for {
		i := bytes.IndexByte(h.buf, '\n')
		if i < 0 {
			break
		}
		h.line(string(h.buf[:i]))
		h.buf = h.buf[i+1:]
	}
	return len(p), nil
}

func (h *hookOut) line(s string) {
	fmt.Fprintf(h.log, "hook| %s\n", s)
	if h.ready != nil {
		fmt.Fprintf(h.ready, "out: %s\n", s)
	}
}

func (h *hookOut) flush() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.buf) > 0 {
		h.line(string(h.buf))
		h.buf = nil
	}
}

// runHooks runs the hooks this start needs. An error means on_create
// failed and the sandbox must not be reported running.
func (d *daemon) runHooks(ctx context.Context) error {
	hooks := d.o.Hooks
	if len(hooks.OnCreate) == 0 && len(hooks.OnUp) == 0 {
		return nil
	}
	rec, err := state.Load(d.o.Dir)
	if err != nil {
		return err
	}
	env, err := d.hookEnv(rec)
	if err != nil {
		return err
	}
	out := &hookOut{ready: d.o.Ready, log: os.Stderr}
	defer state.Update(d.o.Dir, func(r *state.Record) error { r.Hook = ""; return nil })
	run := func(phase string, i int, cmd string) (int, error) {
		state.Update(d.o.Dir, func(r *state.Record) error {
			r.Hook = fmt.Sprintf("%s %d/%d", phase, i+1, len(hooks.OnCreate)+len(hooks.OnUp))
			return nil
		})
		out.line(fmt.Sprintf("moat: %s: %s", phase, cmd))
		start := time.Now()
		code, err := d.proxy.Exec(ctx, session.Options{Argv: []string{"/bin/sh", "-c", cmd}, Env: env, Stdout: out, Stderr: out})
		out.flush()
		d.log.Info("hook ran", "phase", phase, "cmd", cmd, "exit", code, "err", err, "ms", time.Since(start).Milliseconds())
		return code, err
	}
	if !rec.SetUp {
		for i, cmd := range hooks.OnCreate {
			code, err := run("on_create", i, cmd)
			if err == nil && code != 0 {
				err = fmt.Errorf("exit status %d", code)
			}
			if err != nil {
				return fmt.Errorf("on_create %q failed (%v); the sandbox is not set up, and its next start runs on_create again from the start", cmd, err)
			}
		}
		if err := state.Update(d.o.Dir, func(r *state.Record) error { r.SetUp = true; return nil }); err != nil {
			return err
		}
	}
	for i, cmd := range hooks.OnUp {
		code, err := run("on_up", len(hooks.OnCreate)+i, cmd)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit status %d", code)
		}
		if err != nil {
			out.line(fmt.Sprintf("moat: on_up %q failed (%v); the sandbox runs anyway", cmd, err))
			return nil
		}
	}
	return nil
}

// hookEnv is a hook's environment: what a session gets, the secrets'
// placeholders and the [env] entries expanded with the environment the
// daemon was started from (the CLI's, without the secrets' variables).
func (d *daemon) hookEnv(rec *state.Record) (map[string]string, error) {
	env := map[string]string{}
	for k, v := range rec.Placeholders {
		env[k] = v
	}
	for _, e := range d.o.Env {
		if e.Pass {
			if v, ok := os.LookupEnv(e.Name); ok {
				env[e.Name] = v
			}
			continue
		}
		v, err := config.ExpandEnv(e.Value, os.LookupEnv)
		if err != nil {
			return nil, fmt.Errorf("[env] %s: %v", e.Name, err)
		}
		env[e.Name] = v
	}
	return env, nil
}

// hooks runs the hooks while still answering what the daemon must: a
// signal or a guest that dies cuts them short and is handled by the
// caller as usual (put back on its channel). An on_create failure stops
// the sandbox and is returned.
func (d *daemon) hooks(ctx context.Context, exited chan error, sigs chan os.Signal) error {
	hctx, cancel := context.WithTimeout(ctx, hookTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.runHooks(hctx) }()
	select {
	case err := <-done:
		if err == nil {
			return nil
		}
		d.log.Warn("set-up failed", "err", err)
		state.Update(d.o.Dir, func(r *state.Record) error { r.State = state.StateStopping; return nil })
		d.stopGuest(exited)
		d.setStopped(state.StopError, err)
		return err
	case err := <-exited:
		cancel()
		<-done
		exited <- err
	case s := <-sigs:
		cancel()
		<-done
		sigs <- s
	case <-d.stopCh:
		cancel()
		<-done
	}
	return nil
}
