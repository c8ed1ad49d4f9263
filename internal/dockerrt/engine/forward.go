package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/forward"
	"moat.dev/moat/internal/state"
)

// The forwarder: a Docker sandbox's port forwards, held by `moat-docker
// forward DIR PID` for as long as the workload whose init is PID lives
// (dockerrt/forward.go says why there, and how each direction goes).

// forwardDialTimeout bounds one dial of either side, as a gVisor
// daemon's: a port on the bridge or the host's loopback answers at once
// or not at all.
const forwardDialTimeout = 5 * time.Second

// forwardLockWait bounds the wait for the forwarder of an earlier start,
// which ends as soon as its workload's init has exited.
const forwardLockWait = 10 * time.Second

// fkey is a forward's listening side: no two forwards of a direction
// share a port.
type fkey struct {
	reverse bool
	port    uint16
}

type forwarder struct {
	dir, name string
	workload  netip.Addr // dialed for host → guest
	// listenIn listens on addr inside the workload's network namespace
	// (nil: a sandbox on runsc made before the reverse link).
	listenIn func(addr string) (net.Listener, error)
	ctx      context.Context
	log      *slog.Logger

	// mu serialises changes and guards the listeners.
	mu     sync.Mutex
	open   map[fkey]*forward.Held
	failed map[fkey]string
	wg     sync.WaitGroup // accept loops and their connections
}

func keyOf(e forward.Entry) fkey { return fkey{e.Reverse, e.ListenPort()} }

// entries are the forwards in force: the record's snapshot of the
// configuration's, then the runtime ones.
func (f *forwarder) entries() ([]forward.Entry, config.Forwards, *state.Record, error) {
	rec, err := state.Load(f.dir)
	if err != nil {
		return nil, config.Forwards{}, nil, err
	}
	cfg, err := rec.Snapshot()
	if err != nil {
		return nil, config.Forwards{}, nil, err
	}
	return forward.Entries(cfg.Forwards, rec.Forwards), cfg.Forwards, rec, nil
}

// sync makes the listeners what es says: it closes those no longer
// there (and their connections) and listens for new ones and for ones
// that failed before. f.mu is held.
func (f *forwarder) sync(es []forward.Entry) {
	want := map[fkey]forward.Entry{}
	for _, e := range es {
		want[keyOf(e)] = e
	}
	for k, h := range f.open {
		if e, ok := want[k]; !ok || e.Forward != h.Entry.Forward {
			h.Close()
			delete(f.open, k)
		}
	}
	clear(f.failed)
	for k, e := range want {
		if _, ok := f.open[k]; ok {
			continue
		}
		h, err := f.listen(e)
		if err != nil {
			f.failed[k] = err.Error()
			f.log.Warn("forward not listening", "forward", e.Spec(), "reverse", e.Reverse, "err", err)
			continue
		}
		f.open[k] = h
	}
}

// listen starts one forward: host → guest on the host, guest → host in
// the workload's namespace.
func (f *forwarder) listen(e forward.Entry) (*forward.Held, error) {
	var ln net.Listener
	var err error
	if e.Reverse {
		if f.listenIn == nil {
			return nil, errNoReverseLink
		}
		addr := netip.AddrPortFrom(dockerrt.ReverseAddr, e.Guest).String()
		if ln, err = f.listenIn(addr); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("port %d of %s is taken by a program in the sandbox; stop it, or pick another: moat forward add --reverse %s %d:%d",
					e.Guest, dockerrt.ReverseAddr, f.name, e.Host, forward.NextPort(e.Guest))
			}
			return nil, fmt.Errorf("listening on %s in the workload for the forward to host port %d: %w", addr, e.Host, err)
		}
	} else {
		addr := net.JoinHostPort(e.ListenAddress(), strconv.Itoa(int(e.Host)))
		if ln, err = net.Listen("tcp", addr); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("host port %d is already in use on %s; stop what listens there (ss -ltnp 'sport = :%d' shows it) or pick another host port: moat forward add %s %d:%d",
					e.Host, e.ListenAddress(), e.Host, f.name, forward.NextPort(e.Host), e.Guest)
			}
			return nil, fmt.Errorf("listening on %s for the forward to guest port %d: %w", addr, e.Guest, err)
		}
	}
	h := forward.NewHeld(e, ln)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.accept(h)
	}()
	f.log.Info("forward listening", "listen", ln.Addr().String(), "spec", e.Spec(), "reverse", e.Reverse)
	return h, nil
}

// target is where a forward's connections go: the workload's port on
// the bridge, or, for a reverse forward, only ever the host's IPv4
// loopback on the port the user listed (the forward's whole reach).
func (f *forwarder) target(e forward.Entry) string {
	if e.Reverse {
		return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), e.Host).String()
	}
	return netip.AddrPortFrom(f.workload, e.Guest).String()
}

func (f *forwarder) accept(h *forward.Held) {
	for {
		c, err := h.Ln.Accept()
		if err != nil {
			return // closed: the forward was removed or the forwarder ends
		}
		if !h.Track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer h.Untrack(c)
			d := net.Dialer{Timeout: forwardDialTimeout}
			o, err := d.DialContext(f.ctx, "tcp4", f.target(h.Entry))
			if err != nil {
				// Nothing listens there: the client sees its connection
				// closed at once.
				f.log.Debug("forward: dialing", "to", f.target(h.Entry), "err", err)
				c.Close()
				return
			}
			if !h.Track(o) {
				o.Close()
				c.Close()
				return
			}
			defer h.Untrack(o)
			forward.Join(c, o)
		}()
	}
}

// list is the forwards in force with their status, as a daemon's.
func (f *forwarder) list() ([]control.Forward, error) {
	es, _, _, err := f.entries()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []control.Forward{}
	for _, e := range es {
		status, why := "listening", ""
		if e.Reverse {
			status = "open"
		}
		if msg, ok := f.failed[keyOf(e)]; ok {
			status, why = "error", msg
		} else if _, ok := f.open[keyOf(e)]; !ok {
			status = "stopped"
		}
		out = append(out, forward.Wire(e, status, why, dockerrt.ReverseAddr))
	}
	return out, nil
}

// change applies a change live and keeps it in the record, which is
// written only once a new forward listens: a port in use is an error
// now, not a forward that silently never works.
func (f *forwarder) change(ch control.ForwardChange) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return state.Update(f.dir, func(rec *state.Record) error {
		cfg, err := rec.Snapshot()
		if err != nil {
			return err
		}
		rt := &state.RuntimeForwards{}
		if rec.Forwards != nil {
			rt.Ports = append(rt.Ports, rec.Forwards.Ports...)
			rt.Reverse = append(rt.Reverse, rec.Forwards.Reverse...)
		}
		old := forward.Entries(cfg.Forwards, rec.Forwards)
		if err := forward.ApplyChange(rt, cfg, f.name, ch); err != nil {
			return err
		}
		f.sync(forward.Entries(cfg.Forwards, rt))
		if ch.Op == "add" {
			fw, _, _ := forward.Parse(ch.Spec)
			k := fkey{ch.Reverse, fw.Host}
			if ch.Reverse {
				k.port = fw.Guest
			}
			if msg, ok := f.failed[k]; ok {
				f.sync(old)
				return errors.New(msg)
			}
		}
		rec.Forwards = rt
		if len(rt.Ports)+len(rt.Reverse) == 0 {
			rec.Forwards = nil
		}
		return nil
	})
}

// handler is the forward endpoints of the control API (internal/control).
func (f *forwarder) handler() http.Handler {
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter) {
		fs, err := f.list()
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, control.Forwards{Schema: control.Schema, Forwards: fs})
	}
	mux.HandleFunc("GET /v1/forwards", func(w http.ResponseWriter, r *http.Request) { answer(w) })
	mux.HandleFunc("POST /v1/forwards", func(w http.ResponseWriter, r *http.Request) {
		var ch control.ForwardChange
		if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&ch); err != nil {
			writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: "reading the forward change: " + err.Error()})
			return
		}
		if err := f.change(ch); err != nil {
			writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
			return
		}
		f.log.Info("forward changed", "op", ch.Op, "reverse", ch.Reverse, "spec", ch.Spec, "address", ch.Address)
		answer(w)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// startForwarder starts `moat-docker forward DIR PID` for the workload
// whose init is pid, detached (a session of its own, its output in
// ForwardLog), unless one serves it already. It is not waited for: it
// ends with the workload.
func startForwarder(dir string, pid int) error {
	if dockerrt.ForwarderServes(dir, pid) {
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(dockerrt.ForwardLog(dir), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self, "forward", dir, strconv.Itoa(pid))
	// Never moat-docker's stdout: moat reads it to its end.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the port forwarder: %w", err)
	}
	return cmd.Process.Release()
}

// Forward is `moat-docker forward DIR PID`: it holds the sandbox's port
// forwards until the workload's init (pid) exits or ctx ends.
func Forward(ctx context.Context, dir string, pid int) error {
	r, err := dockerrt.Load(dir)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("sandbox", r.Name, "component", "forward")
	// The workload's end is the forwarder's: opened first, so a pid
	// reused later cannot keep it.
	exited, err := watchExit(pid)
	if err != nil {
		return fmt.Errorf("watching the workload's init %d: %w", pid, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
			log.Info("the workload's init exited; the forwards end with it", "pid", pid)
			cancel()
		case <-ctx.Done():
		}
	}()
	release, err := lockWithin(ctx, dockerrt.ForwardLock(dir), forwardLockWait)
	if err != nil {
		return err
	}
	defer release()
	if err := state.WriteAtomic(dockerrt.ForwardPID(dir), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		return err
	}
	f := &forwarder{dir: dir, name: r.Name, workload: r.WorkloadIP, ctx: ctx, log: log,
		open: map[fkey]*forward.Held{}, failed: map[fkey]string{}}
	in, ok, err := workloadListener(pid, r.Runtime == "runsc")
	if err != nil && !errors.Is(err, errNoReverseLink) {
		return err
	}
	if ok {
		f.listenIn = in
	}
	sock := dockerrt.ForwardSocket(dir)
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", sock, err)
	}
	os.Chmod(sock, 0o600)
	srv := &http.Server{Handler: f.handler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)

	es, _, _, err := f.entries()
	if err != nil {
		log.Warn("reading the forwards; none started", "err", err)
	} else {
		f.mu.Lock()
		f.sync(es)
		f.mu.Unlock()
	}
	log.Info("forwarder serving", "pid", pid, "forwards", len(es))
	<-ctx.Done()
	srv.Close()
	os.Remove(sock)
	f.mu.Lock()
	for k, h := range f.open {
		h.Close()
		delete(f.open, k)
	}
	f.mu.Unlock()
	f.wg.Wait()
	return nil
}

// lockWithin takes path's flock, waiting at most wait (polled: flock
// has no timeout) for a forwarder of an earlier start to end.
func lockWithin(ctx context.Context, path string, wait time.Duration) (func(), error) {
	deadline := time.Now().Add(wait)
	for {
		release, ok, err := state.TryLock(path)
		if err != nil {
			return nil, err
		}
		if ok {
			return release, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("another forwarder holds %s after %s", path, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
