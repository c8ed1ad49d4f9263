package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
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
	if err := d.copyFiles(ctx); err != nil {
		return err
	}
	hooks := d.o.Hooks
	if len(hooks.OnCreate) == 0 && len(hooks.OnUp) == 0 {
		return nil
	}
	rec, err := d.record()
	if err != nil {
		return err
	}
	env, err := d.hookEnv(rec)
	if err != nil {
		return err
	}
	out := &hookOut{ready: d.o.Ready, log: d.logOut()}
	defer d.updateRecord(func(r *state.Record) error { r.Hook = ""; return nil })
	run := func(phase string, i int, cmd string) (int, error) {
		d.updateRecord(func(r *state.Record) error {
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
		if err := d.updateRecord(func(r *state.Record) error { r.SetUp = true; return nil }); err != nil {
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
// placeholders and the [env] entries expanded with the host variables the
// starting CLI handed over (the daemon's own environment has none of the
// user's).
func (d *daemon) hookEnv(rec *state.Record) (map[string]string, error) {
	env := map[string]string{}
	for k, v := range rec.Placeholders {
		env[k] = v
	}
	for _, e := range d.o.Env {
		if e.Pass {
			if v, ok := d.handedEnv(e.Name); ok {
				env[e.Name] = v
			}
			continue
		}
		v, err := config.ExpandEnv(e.Value, d.handedEnv)
		if err != nil {
			return nil, fmt.Errorf("[env] %s: %v", e.Name, err)
		}
		env[e.Name] = v
	}
	return env, nil
}

// hooks runs the hooks until they finish or the sandbox stops (the
// keeper ends the link, or a stop was asked for). An on_create failure
// stops the sandbox and is returned.
func (d *daemon) hooks(ctx context.Context) error {
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
		d.requestStop(state.StopError, err)
		return err
	case <-d.keeper.done:
	case <-d.stopCh:
	}
	cancel()
	<-done
	return errStopped
}

// errStopped is a start cut short by a stop.
var errStopped = errors.New("the sandbox stopped while starting")

// copyFiles writes the [[files]] into the guest, each at every start: a
// key or a config file edited on the host reaches the guest at the next
// start. The source is read here, on the host (at most
// config.MaxCopyFile bytes, a regular file, never inside moat's state),
// and written in the guest by root through sudo, owned by the agent user,
// so a target outside the agent's home works too. A file that cannot be
// copied fails the start: a hook or agent expecting it would fail later,
// further from the cause.
func (d *daemon) copyFiles(ctx context.Context) error {
	for i, f := range d.o.Files {
		data, err := d.copies[i].data, d.copies[i].err
		if err != nil {
			return err
		}
		var out bytes.Buffer
		// Missing directories are made by the agent user where it may
		// (its home), so ~/.config stays its own; by root elsewhere.
		script := `d=$(dirname "$1"); sudo -n -u agent mkdir -p "$d" 2>/dev/null || mkdir -p "$d" || exit 1
umask 077; cat > "$1" && chmod "$2" "$1" && chown agent:agent "$1"`
		code, err := d.proxy.Exec(ctx, session.Options{
			Argv:  []string{"sudo", "-n", "/bin/sh", "-c", script, "sh", f.Target, fmt.Sprintf("%04o", f.Mode)},
			Stdin: bytes.NewReader(data), Stdout: &out, Stderr: &out,
		})
		if err == nil && code != 0 {
			err = fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(out.String()))
		}
		if err != nil {
			return fmt.Errorf("copying %s to %s in the guest (files from %s): %v", f.Source, f.Target, f.Origin, err)
		}
		d.log.Info("file copied into the guest", "source", f.Source, "target", f.Target, "bytes", len(data))
	}
	return nil
}

// copySource is a [[files]] source as read at the start, before the
// gate process's jail, which cannot open it.
type copySource struct {
	data []byte
	err  error
}

// readCopies reads the [[files]] sources for copyFiles.
func (d *daemon) readCopies() {
	d.copies = make([]copySource, len(d.o.Files))
	for i, f := range d.o.Files {
		d.copies[i].data, d.copies[i].err = readCopySource(f, d.o.Dir)
	}
}

// readCopySource reads a [[files]] source after checking it.
func readCopySource(f config.CopyFile, stateDir string) ([]byte, error) {
	where := fmt.Sprintf("%s (files from %s)", f.Source, f.Origin)
	real, err := filepath.EvalSymlinks(f.Source)
	if err != nil {
		return nil, fmt.Errorf("%s: %w; create it or remove the entry", where, err)
	}
	if home := filepath.Dir(filepath.Dir(stateDir)); within(real, home) {
		return nil, fmt.Errorf("%s resolves into moat's state (%s); copy something else", where, home)
	}
	st, err := os.Stat(real)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file; [[files]] copies files (share a directory with [[shares]])", where)
	}
	if st.Size() > config.MaxCopyFile {
		return nil, fmt.Errorf("%s is %d bytes, over the %d-byte limit of [[files]]; share it with [[shares]] instead", where, st.Size(), config.MaxCopyFile)
	}
	fh, err := os.Open(real)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, config.MaxCopyFile+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", where, err)
	}
	if len(data) > config.MaxCopyFile {
		return nil, fmt.Errorf("%s grew over the %d-byte limit of [[files]] while being read", where, config.MaxCopyFile)
	}
	return data, nil
}

// within reports whether p is dir or inside it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}
