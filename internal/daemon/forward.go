package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"
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
// dialed on the host's 127.0.0.1, any other is reset and audited. The
// listeners, the carrying and the records are internal/forward's, which
// the Docker runtime's forwarder shares.

// forwards is the daemon's port forwards.
type forwards struct {
	d   *daemon
	ctx context.Context
	log *slog.Logger

	// rev is the reverse forwards, read on the netstack's packet path.
	rev *forward.Reverse

	// mu serialises changes.
	mu sync.Mutex
	// local is the host → guest forwards' listeners, dialed through the
	// netstack.
	local *forward.Listeners
}

// startForwards starts the forwards the sandbox has (its configuration's
// and its runtime ones) and installs the reverse ones in the netstack. A
// host port that cannot be listened on does not stop the sandbox: the
// forward is shown with its error in `moat forward list` and the log.
// The returned function stops them all.
func (d *daemon) startForwards(ctx context.Context) func() {
	f := &forwards{d: d, ctx: ctx, log: d.log.With("component", "forward"), rev: forward.NewReverse()}
	f.local = forward.NewListeners(ctx, filepath.Base(d.o.Dir), netstack.Guest,
		func(ctx context.Context, port uint16) (net.Conn, error) { return d.stack.DialGuest(ctx, port) },
		f.audit, f.log)
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
	f.local.Close()
}

// sync makes the listeners and the reverse table what es says, and cuts
// the connections of reverse forwards no longer there. f.mu is held.
func (f *forwards) sync(es []forward.Entry) {
	f.local.Sync(es)
	f.rev.Sync(es)
}

// Open is netstack.GatewayPorts.Open: a gateway port is open when a
// reverse forward lists it. Every other is refused, and the refusal is
// audited and counted as a denial, like the gate's.
func (f *forwards) Open(src netip.AddrPort, port uint16) bool {
	if _, ok := f.rev.Lookup(port); ok || f.localMCP(port) {
		return true
	}
	f.audit(forward.RefusalRecord(netstack.Gateway, port, filepath.Base(f.d.o.Dir)))
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
	hostPort, ok := f.rev.Lookup(port)
	if !ok {
		return // removed between the SYN and now: reset
	}
	forward.ServeReverse(f.ctx, forward.ReverseConn{Gateway: netstack.Gateway, Port: port, HostPort: hostPort,
		Accept: accept, Hold: f.rev.Hold(port), Audit: f.audit})
}

// localMCP reports whether a host-local MCP server is declared on the
// gateway's port. The configuration refuses a reverse forward on it.
func (f *forwards) localMCP(port uint16) bool {
	return f.d.net != nil && f.d.net.gate.LocalMCPPort(port)
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
	out := []control.Forward{}
	for _, e := range forward.Entries(cfg, rec.Forwards) {
		status, why := "open", ""
		if !e.Reverse {
			status, why = f.local.Status(e)
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
		return forward.ChangeRecord(rec, filepath.Base(f.d.o.Dir), ch, f.sync, f.local.Served)
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
