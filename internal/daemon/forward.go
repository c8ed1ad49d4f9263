package daemon

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
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/forward"
	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/state"
)

// Port forwards, both directions, live.
//
// Host → guest: a listener on the host (127.0.0.1 unless the user named an
// address) whose every connection is dialed to the guest's port through
// the netstack, the same way the session proxy reaches the guest agent.
// Guest → host: the netstack's front end asks forwards (a
// netstack.GatewayPorts) at each SYN to the gateway; a listed port is
// dialed on the host's 127.0.0.1, any other is reset and audited.

// forwardDialTimeout bounds one dial of either side: the guest's port or
// the host's loopback port answer at once or not at all; 5 s only covers
// a guest too busy to answer its SYN promptly.
const forwardDialTimeout = 5 * time.Second

// forwards is the daemon's port forwards.
type forwards struct {
	d   *daemon
	ctx context.Context
	log *slog.Logger

	// table is the reverse forwards, swapped whole on each change, read on
	// the netstack's packet path without a lock.
	table atomic.Pointer[forward.Table]

	// mu serialises changes and guards the listeners below.
	mu     sync.Mutex
	local  map[uint16]*forward.Held // listening host → guest forwards, by host port
	failed map[uint16]string        // host → guest forwards that could not listen, why
	wg     sync.WaitGroup           // the accept loops and their connections

	// rmu guards rconns: the open reverse connections' guest sides, by
	// gateway port, cut when their forward is removed.
	rmu    sync.Mutex
	rconns map[net.Conn]uint16
}

// startForwards starts the forwards the sandbox has (its configuration's
// and its runtime ones) and installs the reverse ones in the netstack. A
// host port that cannot be listened on does not stop the sandbox: the
// forward is shown with its error in `moat forward list` and the log.
// The returned function stops them all.
func (d *daemon) startForwards(ctx context.Context) func() {
	f := &forwards{d: d, ctx: ctx, log: d.log.With("component", "forward"),
		local: map[uint16]*forward.Held{}, failed: map[uint16]string{}, rconns: map[net.Conn]uint16{}}
	f.table.Store(&forward.Table{})
	d.fwd = f
	d.stack.SetGateway(f)
	cfg, rec, err := d.forwardConfig()
	if err != nil {
		f.log.Warn("reading the forwards; none started", "err", err)
	} else {
		f.mu.Lock()
		f.sync(forward.Entries(cfg, rec.Forwards))
		f.mu.Unlock()
	}
	return f.stop
}

// forwardConfig reads the configuration's forwards from the snapshot in
// the record, and the record with its runtime forwards.
func (d *daemon) forwardConfig() (config.Forwards, *state.Record, error) {
	rec, err := d.record()
	if err != nil {
		return config.Forwards{}, nil, err
	}
	cfg, err := rec.Snapshot()
	if err != nil {
		return config.Forwards{}, nil, err
	}
	return cfg.Forwards, rec, nil
}

func (f *forwards) stop() {
	f.d.stack.SetGateway(nil)
	f.mu.Lock()
	for port, lf := range f.local {
		lf.Close()
		delete(f.local, port)
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// sync makes the listeners and the reverse table what es says: it closes
// the listeners of forwards no longer there (and their connections), and
// listens for new ones and for ones that failed before. f.mu is held.
func (f *forwards) sync(es []forward.Entry) {
	want := map[uint16]forward.Entry{}
	for _, e := range es {
		if !e.Reverse {
			want[e.Host] = e
		}
	}
	for port, lf := range f.local {
		if e, ok := want[port]; !ok || e.Forward != lf.Entry.Forward {
			lf.Close()
			delete(f.local, port)
		}
	}
	clear(f.failed)
	for port, e := range want {
		if _, ok := f.local[port]; ok {
			continue
		}
		lf, err := f.listen(e)
		if err != nil {
			f.failed[port] = err.Error()
			f.log.Warn("forward not listening", "forward", e.Spec(), "err", err)
			continue
		}
		f.local[port] = lf
	}
	t := forward.ReverseTable(es)
	f.table.Store(&t)
	f.rmu.Lock()
	for c, port := range f.rconns {
		if _, ok := t.Lookup(port); !ok {
			c.Close()
			delete(f.rconns, c)
		}
	}
	f.rmu.Unlock()
}

// listen starts one host → guest forward.
func (f *forwards) listen(e forward.Entry) (*forward.Held, error) {
	addr := net.JoinHostPort(e.ListenAddress(), strconv.Itoa(int(e.Host)))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("host port %d is already in use on %s; stop what listens there (ss -ltnp 'sport = :%d' shows it) or pick another host port: moat forward add %s %d:%d",
				e.Host, e.ListenAddress(), e.Host, filepath.Base(f.d.o.Dir), forward.NextPort(e.Host), e.Guest)
		}
		return nil, fmt.Errorf("listening on %s for the forward to guest port %d: %w", addr, e.Guest, err)
	}
	lf := forward.NewHeld(e, ln)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.accept(lf)
	}()
	f.log.Info("forward listening", "listen", ln.Addr().String(), "guest_port", e.Guest)
	return lf, nil
}

func (f *forwards) accept(lf *forward.Held) {
	for {
		c, err := lf.Ln.Accept()
		if err != nil {
			return // closed: the forward was removed or the daemon stops
		}
		if !lf.Track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer lf.Untrack(c)
			ctx, cancel := context.WithTimeout(f.ctx, forwardDialTimeout)
			g, err := f.d.stack.DialGuest(ctx, lf.Entry.Guest)
			cancel()
			if err != nil {
				// Nothing listens on the guest's port (yet): the host's
				// client sees its connection closed at once.
				f.log.Debug("forward: dialing the guest", "guest_port", lf.Entry.Guest, "err", err)
				c.Close()
				return
			}
			if !lf.Track(g) {
				g.Close()
				c.Close()
				return
			}
			defer lf.Untrack(g)
			forward.Join(c, g)
		}()
	}
}

// Open is netstack.GatewayPorts.Open: a gateway port is open when a
// reverse forward lists it. Every other is refused, and the refusal is
// audited and counted as a denial, like the gate's.
func (f *forwards) Open(src netip.AddrPort, port uint16) bool {
	if _, ok := f.table.Load().Lookup(port); ok || f.localMCP(port) {
		return true
	}
	f.audit(audit.Record{Proto: "tcp", Dst: gatewayDst(port), Verdict: audit.Deny,
		Reason: audit.NotReverseForward(port, filepath.Base(f.d.o.Dir))})
	return false
}

// Serve is netstack.GatewayPorts.Serve: it dials the host's 127.0.0.1 on
// the forward's host port before completing the guest's handshake, so a
// host service that is down is "connection refused" in the guest too.
func (f *forwards) Serve(src netip.AddrPort, port uint16, accept func() (net.Conn, error)) {
	if f.localMCP(port) {
		// A host-local MCP server's port: the gate reads and decides
		// every request, then dials the host (gate/mcplocal.go).
		if g, err := accept(); err == nil {
			f.d.net.gate.ServeLocalMCP(f.ctx, g, port)
		}
		return
	}
	hostPort, ok := f.table.Load().Lookup(port)
	if !ok {
		return // removed between the SYN and now: reset
	}
	start := time.Now()
	// Only ever the IPv4 loopback and a port the user listed: the
	// forward's whole reach (forward package doc).
	upstream := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), hostPort)
	rec := audit.Record{Time: start, Proto: "tcp", Dst: gatewayDst(port), Verdict: audit.Allow,
		Rule:   "reverse " + forward.Entry{Reverse: true, Forward: state.Forward{Host: hostPort, Guest: port}}.Spec(),
		Reason: audit.ReasonReverseForward, Upstream: upstream.String()}
	dialer := net.Dialer{Timeout: forwardDialTimeout}
	h, err := dialer.DialContext(f.ctx, "tcp4", upstream.String())
	if err != nil {
		rec.Reason = audit.ReverseForwardFailed(err)
		f.audit(rec)
		return
	}
	g, err := accept()
	if err != nil {
		h.Close()
		return
	}
	f.rmu.Lock()
	f.rconns[g] = port
	f.rmu.Unlock()
	if _, ok := f.table.Load().Lookup(port); !ok {
		// Removed while we dialed: sync swept before we registered.
		g.Close()
		h.Close()
	}
	defer func() {
		f.rmu.Lock()
		delete(f.rconns, g)
		f.rmu.Unlock()
	}()
	rec.BytesUp, rec.BytesDown = forward.Join(g, h)
	rec.DurationMS = time.Since(start).Milliseconds()
	f.audit(rec)
}

// localMCP reports whether a host-local MCP server is declared on the
// gateway's port. The configuration refuses a reverse forward on it.
func (f *forwards) localMCP(port uint16) bool {
	return f.d.net != nil && f.d.net.gate.LocalMCPPort(port)
}

func gatewayDst(port uint16) string {
	return netip.AddrPortFrom(netstack.Gateway, port).String()
}

// audit writes a record as the gate writes its own: denials also go to
// the ledger behind `moat network denials` and the status's count.
func (f *forwards) audit(r audit.Record) {
	n := f.d.net
	if n == nil {
		return
	}
	r.Sandbox = filepath.Base(f.d.o.Dir)
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	if r.Verdict == audit.Deny && n.ledger != nil {
		n.ledger.Add(r)
	}
	n.audit.Write(r)
}

// list is the forwards in force with their status.
func (f *forwards) list() ([]control.Forward, error) {
	cfg, rec, err := f.d.forwardConfig()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []control.Forward{}
	for _, e := range forward.Entries(cfg, rec.Forwards) {
		status, why := "open", ""
		if !e.Reverse {
			status = "listening"
			if msg, ok := f.failed[e.Host]; ok {
				status, why = "error", msg
			} else if _, ok := f.local[e.Host]; !ok {
				status = "stopped"
			}
		}
		out = append(out, forward.Wire(e, status, why, netstack.Gateway))
	}
	return out, nil
}

// change applies a change live and keeps it in the record: the record is
// written only once a new host → guest forward listens, so a port in use
// is an error now, not a forward that silently never works.
func (f *forwards) change(ch control.ForwardChange) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.d.updateRecord(func(rec *state.Record) error {
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
		if err := forward.ApplyChange(rt, cfg, filepath.Base(f.d.o.Dir), ch); err != nil {
			return err
		}
		f.sync(forward.Entries(cfg.Forwards, rt))
		if ch.Op == "add" && !ch.Reverse {
			fw, _, _ := forward.Parse(ch.Spec)
			if msg, ok := f.failed[fw.Host]; ok {
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

func (d *daemon) handleForwards(w http.ResponseWriter, r *http.Request) {
	if d.fwd == nil {
		writeJSON(w, http.StatusServiceUnavailable, control.ErrorBody{Schema: control.Schema, Error: "the sandbox is still starting; try again"})
		return
	}
	fs, err := d.fwd.list()
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, control.Forwards{Schema: control.Schema, Forwards: fs})
}

func (d *daemon) handleChangeForward(w http.ResponseWriter, r *http.Request) {
	var ch control.ForwardChange
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&ch); err != nil {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: "reading the forward change: " + err.Error()})
		return
	}
	if d.fwd == nil {
		writeJSON(w, http.StatusServiceUnavailable, control.ErrorBody{Schema: control.Schema, Error: "the sandbox is still starting; try again"})
		return
	}
	if err := d.fwd.change(ch); err != nil {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
		return
	}
	d.log.Info("forward changed", "op", ch.Op, "reverse", ch.Reverse, "spec", ch.Spec, "address", ch.Address)
	d.handleForwards(w, r)
}
