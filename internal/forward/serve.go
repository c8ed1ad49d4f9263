package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
)

// Serving the forwards in force: what the gVisor sandbox's daemon
// (internal/daemon) and the Docker runtime's forwarder
// (internal/dockerrt/engine) both do, so that a forward listens, fails,
// carries and is audited the same on either. They differ only in how
// they reach the guest (the daemon through its netstack, the forwarder
// over the bridge) and in how a guest's connection to the gateway
// reaches them, which they pass in.

// DialTimeout bounds one dial of either side: the guest's port or the
// host's loopback port answer at once or not at all; 5 s only covers a
// guest too busy to answer its SYN promptly.
const DialTimeout = 5 * time.Second

// ListenHost listens on the host for the host → guest forward e of the
// sandbox named sandbox; a port in use is an error that says what to do.
func ListenHost(e Entry, sandbox string) (net.Listener, error) {
	addr := net.JoinHostPort(e.ListenAddress(), strconv.Itoa(int(e.Host)))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("host port %d is already in use on %s; stop what listens there (ss -ltnp 'sport = :%d' shows it) or pick another host port: moat forward add %s %d:%d",
				e.Host, e.ListenAddress(), e.Host, sandbox, NextPort(e.Host), e.Guest)
		}
		return nil, fmt.Errorf("listening on %s for the forward to guest port %d: %w", addr, e.Guest, err)
	}
	return ln, nil
}

// Listeners holds the host → guest forwards' listeners and their
// connections: Sync opens and closes them as the forwards in force
// change; every connection accepted is dialed to the guest with Dial,
// carried, and audited when it ends.
type Listeners struct {
	ctx     context.Context
	sandbox string
	guest   netip.Addr // the guest's address, as records name it
	dial    func(ctx context.Context, guestPort uint16) (net.Conn, error)
	audit   func(audit.Record)
	log     *slog.Logger

	// mu guards the listeners.
	mu     sync.Mutex
	open   map[uint16]*Held  // by host port
	failed map[uint16]string // host port → why it does not listen
	wg     sync.WaitGroup    // accept loops and their connections
}

// NewListeners makes an empty set of listeners for the sandbox named
// sandbox, whose guest is at guest; dial reaches a guest port, rec (nil:
// none) receives each connection's record. ctx ends every dial.
func NewListeners(ctx context.Context, sandbox string, guest netip.Addr, dial func(ctx context.Context, guestPort uint16) (net.Conn, error), rec func(audit.Record), log *slog.Logger) *Listeners {
	if rec == nil {
		rec = func(audit.Record) {}
	}
	return &Listeners{ctx: ctx, sandbox: sandbox, guest: guest, dial: dial, audit: rec, log: log,
		open: map[uint16]*Held{}, failed: map[uint16]string{}}
}

// Sync makes the listeners what es says (its host → guest entries): it
// closes those no longer there, and their connections, and listens for
// new ones and for ones that failed before. A host port that cannot be
// listened on is kept with its error (Status), not returned: one busy
// port does not stop the others.
func (l *Listeners) Sync(es []Entry) {
	want := map[uint16]Entry{}
	for _, e := range es {
		if !e.Reverse {
			want[e.Host] = e
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for port, h := range l.open {
		if e, ok := want[port]; !ok || e.Forward != h.Entry.Forward {
			h.Close()
			delete(l.open, port)
		}
	}
	clear(l.failed)
	for port, e := range want {
		if _, ok := l.open[port]; ok {
			continue
		}
		ln, err := ListenHost(e, l.sandbox)
		if err != nil {
			l.failed[port] = err.Error()
			l.log.Warn("forward not listening", "forward", e.Spec(), "err", err)
			continue
		}
		h := NewHeld(e, ln)
		l.open[port] = h
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.accept(h)
		}()
		l.log.Info("forward listening", "listen", ln.Addr().String(), "guest_port", e.Guest)
	}
}

// Failed is why the host → guest forward on hostPort does not listen.
func (l *Listeners) Failed(hostPort uint16) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg, ok := l.failed[hostPort]
	return msg, ok
}

// Status is a host → guest entry's status for `moat forward list`:
// listening, error (with why) or stopped.
func (l *Listeners) Status(e Entry) (status, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if msg, ok := l.failed[e.Host]; ok {
		return "error", msg
	}
	if h, ok := l.open[e.Host]; ok && h.Entry.Forward == e.Forward {
		return "listening", ""
	}
	return "stopped", ""
}

// Close closes every listener and connection and waits for them.
func (l *Listeners) Close() {
	l.mu.Lock()
	for port, h := range l.open {
		h.Close()
		delete(l.open, port)
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *Listeners) accept(h *Held) {
	for {
		c, err := h.Ln.Accept()
		if err != nil {
			return // closed: the forward was removed or the listeners close
		}
		if !h.Track(c) {
			c.Close()
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer h.Untrack(c)
			l.carry(h, c)
		}()
	}
}

// carry dials the guest for c, accepted on h, and joins them.
func (l *Listeners) carry(h *Held, c net.Conn) {
	start := time.Now()
	rec := ForwardRecord(h.Entry, l.guest, start)
	ctx, cancel := context.WithTimeout(l.ctx, DialTimeout)
	g, err := l.dial(ctx, h.Entry.Guest)
	cancel()
	if err != nil {
		// Nothing listens on the guest's port (yet): the host's client
		// sees its connection closed at once.
		l.log.Debug("forward: dialing the guest", "guest_port", h.Entry.Guest, "err", err)
		c.Close()
		rec.Reason = audit.ForwardFailed(err)
		l.audit(rec)
		return
	}
	if !h.Track(g) {
		g.Close()
		c.Close()
		return
	}
	defer h.Untrack(g)
	// Bytes up are the guest's, as in every record.
	rec.BytesDown, rec.BytesUp = Join(c, g)
	rec.DurationMS = time.Since(start).Milliseconds()
	l.audit(rec)
}

// ForwardRecord is the audit record of a connection through the host →
// guest forward e to the guest at guest, begun at start.
func ForwardRecord(e Entry, guest netip.Addr, start time.Time) audit.Record {
	return audit.Record{Time: start, Proto: "tcp", Dst: netip.AddrPortFrom(guest, e.Guest).String(), Verdict: audit.Allow,
		Rule: "forward " + e.Spec(), Reason: audit.ReasonForward,
		Upstream: net.JoinHostPort(e.ListenAddress(), strconv.Itoa(int(e.Host)))}
}

// ReverseConn is a guest's connection to a gateway port that a reverse
// forward lists, for ServeReverse.
type ReverseConn struct {
	Gateway  netip.Addr // the address the guest reaches forwards at
	Port     uint16     // the gateway's port
	HostPort uint16     // the host port the forward reaches
	// Accept completes the guest's side: after the host's port answered,
	// so a host service that is down is refused, where the front end
	// can wait (gVisor's netstack); Docker's has accepted it already.
	Accept func() (net.Conn, error)
	// Hold registers the guest's side, to be cut when the forward is
	// removed; ok false: removed already. release forgets it.
	Hold func(net.Conn) (release func(), ok bool)
	// Audit receives the connection's record.
	Audit func(audit.Record)
}

// ServeReverse carries a reverse forward's connection to the host's
// 127.0.0.1:HostPort, only ever the IPv4 loopback and a port the user
// listed (the package doc), and audits it when it ends, or when the host's
// port does not answer.
func ServeReverse(ctx context.Context, r ReverseConn) {
	start := time.Now()
	upstream := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), r.HostPort)
	rec := audit.Record{Time: start, Proto: "tcp", Dst: netip.AddrPortFrom(r.Gateway, r.Port).String(), Verdict: audit.Allow,
		Rule:   "reverse " + Entry{Reverse: true, Forward: state.Forward{Host: r.HostPort, Guest: r.Port}}.Spec(),
		Reason: audit.ReasonReverseForward, Upstream: upstream.String()}
	d := net.Dialer{Timeout: DialTimeout}
	h, err := d.DialContext(ctx, "tcp4", upstream.String())
	if err != nil {
		rec.Reason = audit.ReverseForwardFailed(err)
		r.Audit(rec)
		return
	}
	g, err := r.Accept()
	if err != nil {
		h.Close()
		return
	}
	release, ok := r.Hold(g)
	if !ok {
		g.Close()
		h.Close()
		return
	}
	defer release()
	rec.BytesUp, rec.BytesDown = Join(g, h)
	rec.DurationMS = time.Since(start).Milliseconds()
	r.Audit(rec)
}

// RefusalRecord is the audit record of a guest's connection to a gateway
// port that no reverse forward of sandbox lists: refused, like the gate's
// denials.
func RefusalRecord(gateway netip.Addr, port uint16, sandbox string) audit.Record {
	return audit.Record{Time: time.Now(), Proto: "tcp", Dst: netip.AddrPortFrom(gateway, port).String(), Verdict: audit.Deny,
		Reason: audit.NotReverseForward(port, sandbox)}
}

// Reverse is the reverse forwards in force as a front end serves them:
// the table, swapped whole on each change and read without a lock (on
// the netstack's packet path, in the daemon), and the open connections'
// guest sides, cut when their forward is removed.
type Reverse struct {
	table atomic.Pointer[Table]

	// mu guards conns: the guest sides by gateway port.
	mu    sync.Mutex
	conns map[net.Conn]uint16
}

// NewReverse has no reverse forwards.
func NewReverse() *Reverse {
	r := &Reverse{conns: map[net.Conn]uint16{}}
	r.table.Store(&Table{})
	return r
}

// Lookup is the table's Lookup.
func (r *Reverse) Lookup(gatewayPort uint16) (hostPort uint16, ok bool) {
	return r.table.Load().Lookup(gatewayPort)
}

// Sync makes the table es's reverse entries and cuts the connections of
// those no longer there.
func (r *Reverse) Sync(es []Entry) {
	t := ReverseTable(es)
	r.table.Store(&t)
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, port := range r.conns {
		if _, ok := t.Lookup(port); !ok {
			c.Close()
			delete(r.conns, c)
		}
	}
}

// Hold is ReverseConn.Hold for a connection to port.
func (r *Reverse) Hold(port uint16) func(net.Conn) (func(), bool) {
	return func(g net.Conn) (func(), bool) {
		r.mu.Lock()
		r.conns[g] = port
		r.mu.Unlock()
		release := func() {
			r.mu.Lock()
			delete(r.conns, g)
			r.mu.Unlock()
		}
		if _, ok := r.Lookup(port); !ok {
			// Removed while the host was dialed: Sync swept before it
			// was registered.
			release()
			return nil, false
		}
		return release, true
	}
}

// Close cuts every open connection.
func (r *Reverse) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
		delete(r.conns, c)
	}
}

// ChangeRecord applies ch to rec's runtime forwards, live: sync makes
// the front end serve the forwards then in force, and served says whether
// the forward ch adds does serve (a host port in use); if not, sync
// serves the old ones again and the error is returned, so that rec, which
// the caller writes only on success, never keeps a forward that does not
// work. sandbox is the name error messages' commands use.
func ChangeRecord(rec *state.Record, sandbox string, ch control.ForwardChange, sync func([]Entry), served func(e Entry) error) error {
	cfg, err := rec.Snapshot()
	if err != nil {
		return err
	}
	rt := &state.RuntimeForwards{}
	if rec.Forwards != nil {
		rt.Ports = append(rt.Ports, rec.Forwards.Ports...)
		rt.Reverse = append(rt.Reverse, rec.Forwards.Reverse...)
	}
	old := Entries(cfg.Forwards, rec.Forwards)
	if err := ApplyChange(rt, cfg, sandbox, ch); err != nil {
		return err
	}
	sync(Entries(cfg.Forwards, rt))
	if ch.Op == "add" {
		fw, _, _ := Parse(ch.Spec)
		if err := served(Entry{Reverse: ch.Reverse, Forward: fw}); err != nil {
			sync(old)
			return err
		}
	}
	rec.Forwards = rt
	if len(rt.Ports)+len(rt.Reverse) == 0 {
		rec.Forwards = nil
	}
	return nil
}

// Served is the served function of ChangeRecord for host → guest
// forwards: the error of one that does not listen.
func (l *Listeners) Served(e Entry) error {
	if e.Reverse {
		return nil
	}
	if msg, ok := l.Failed(e.Host); ok {
		return errors.New(msg)
	}
	return nil
}
