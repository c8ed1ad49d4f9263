package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/forward"
	"moat.dev/moat/internal/state"
)

// The forwarder: a Docker sandbox's port forwards, held by `moat-docker
// forward DIR PID` for as long as the workload whose init is PID lives
// (dockerrt/forward.go says why there, and how each direction goes).

// forwardLockWait bounds the wait for the forwarder of an earlier start,
// which ends as soon as its workload's init has exited.
const forwardLockWait = 10 * time.Second

type forwarder struct {
	dir, name string
	ctx       context.Context
	log       *slog.Logger
	// rec writes the forwards' audit records (ForwardAuditPath).
	rec *audit.Log

	// mu serialises changes.
	mu sync.Mutex
	// local is the host → guest forwards' listeners, which dial the
	// workload's address on the bridge.
	local *forward.Listeners
	// rev is the reverse forwards.
	rev *forward.Reverse
	// revErr says why reverse forwards are not served (nil: they are).
	revErr error
	wg     sync.WaitGroup // the reverse listener's accept loop and connections
}

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

// sync makes the listeners and the reverse table what es says, and cuts
// the connections of reverse forwards no longer there. f.mu is held.
func (f *forwarder) sync(es []forward.Entry) {
	f.local.Sync(es)
	f.rev.Sync(es)
}

// audit writes a record as the gate writes its own.
func (f *forwarder) audit(r audit.Record) {
	r.Sandbox = f.name
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	f.rec.Write(r)
}

// serveReverse serves the workload's connections to ReverseAddr, every
// port of which the workload's namespace sends to ln (reverseNAT): a port
// a reverse forward lists is carried to the host's loopback, any other
// is reset and audited, as a gVisor sandbox's gateway does.
func (f *forwarder) serveReverse(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed: the forwarder ends
		}
		dst, err := originalDst(c)
		if err != nil || dst.Addr() != dockerrt.ReverseAddr {
			// Not a connection to ReverseAddr that the rule sent here.
			f.log.Debug("reverse: a connection without its original destination", "dst", dst, "err", err)
			reset(c)
			continue
		}
		port := dst.Port()
		hostPort, ok := f.rev.Lookup(port)
		if !ok {
			f.audit(forward.RefusalRecord(dockerrt.ReverseAddr, port, f.name))
			reset(c)
			continue
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			forward.ServeReverse(f.ctx, forward.ReverseConn{Gateway: dockerrt.ReverseAddr, Port: port, HostPort: hostPort,
				// Accepted already: the kernel completed the handshake
				// before the forwarder could dial the host.
				Accept: func() (net.Conn, error) { return c, nil },
				Hold:   f.rev.Hold(port), Audit: f.audit})
			// Joined and closed, or not accepted because the host's port
			// did not answer: reset, as that SYN would be on gVisor.
			reset(c)
		}()
	}
}

// reset closes c with a reset, as a refused port's SYN gets on gVisor.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
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
		status, why := "open", ""
		if !e.Reverse {
			status, why = f.local.Status(e)
		} else if f.revErr != nil {
			status, why = "error", f.revErr.Error()
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
		return forward.ChangeRecord(rec, f.name, ch, f.sync, func(e forward.Entry) error {
			if e.Reverse {
				return f.revErr
			}
			return f.local.Served(e)
		})
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
	if err := os.MkdirAll(filepath.Dir(dockerrt.ForwardAuditPath(dir)), 0o700); err != nil {
		return err
	}
	rec, err := audit.OpenWith(dockerrt.ForwardAuditPath(dir), audit.Options{Logger: log})
	if err != nil {
		return fmt.Errorf("opening the forwards' audit log: %w", err)
	}
	defer rec.Close()
	f := &forwarder{dir: dir, name: r.Name, ctx: ctx, log: log, rec: rec, rev: forward.NewReverse()}
	var d net.Dialer
	f.local = forward.NewListeners(ctx, r.Name, r.WorkloadIP, func(ctx context.Context, port uint16) (net.Conn, error) {
		return d.DialContext(ctx, "tcp4", netip.AddrPortFrom(r.WorkloadIP, port).String())
	}, f.audit, log)
	defer f.local.Close()
	rln, err := reverseListener(pid, r.Runtime == "runsc")
	if err != nil {
		// Host → guest forwards still work; reverse ones say why not.
		f.revErr = err
		log.Warn("reverse forwards are not served", "err", err)
	} else {
		defer rln.Close()
		// In wg, so that its Add for each connection comes before the
		// Wait below, which it outlives only until rln closes.
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.serveReverse(rln)
		}()
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
	if rln != nil {
		rln.Close()
	}
	f.rev.Close()
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
