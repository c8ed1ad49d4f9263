package gate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/peek"
	"moat.dev/moat/internal/policy"
)

// TCPFlow is one guest connection attempt, handed over by a front end
// while the guest's SYN still waits for an answer.
type TCPFlow struct {
	Src, Dst netip.AddrPort
	// Accept completes the guest's handshake and returns its end.
	Accept func() (net.Conn, error)
	// Refuse answers the SYN with a reset: the guest fails at once.
	Refuse func()
	// Named says the front end does not know where the client meant to
	// go: Dst is the gate's own listening address, which the client
	// reached because the gate's DNS answered a name with it (the gate
	// service on host sockets). Such a flow is decided by the name it
	// carries (SNI or Host) and nothing else: Dst's address class,
	// address rules and names bound to Dst do not apply, and a flow
	// that carries no name is refused. Every port is read as 80 and 443
	// are; the upstream is dialed on Dst's port.
	Named bool
}

// DefaultMaxConnections bounds the connections one sandbox may hold open
// through the gate at once when Options.MaxConnections is unset: far
// above what a build or an agent opens (npm peaks in the low hundreds).
// The daemon sets its own, from the memory it may use (threat model 30).
const DefaultMaxConnections = 1024

// maxPeek bounds the bytes read before a decision: a ClientHello is a few
// hundred bytes (a few KiB with post-quantum key shares), a request head a
// few KiB.
const maxPeek = 64 << 10

// HandleTCP decides one connection and, if allowed, carries it to the
// upstream until either side closes. It returns when the flow is over.
func (g *Gate) HandleTCP(ctx context.Context, f TCPFlow) {
	if g.flows.Add(1) > int64(g.o.MaxConnections) {
		g.flows.Add(-1)
		f.Refuse()
		g.overCap(f.Dst)
		return
	}
	defer g.flows.Add(-1)
	if err := g.unaudited(); err != nil {
		f.Refuse()
		r := g.denyRecord("tcp", f.Dst, unrecordedReason(err))
		r.RejectedBy = audit.StepAudit
		g.audit(r)
		return
	}

	dst := f.Dst
	t := &tcpTrace{start: g.o.Now(), src: f.Src, named: f.Named, rec: audit.Record{Proto: "tcp", Dst: dst.String()}}
	if !g.pool.Contains(dst.Addr()) && !f.Named {
		class, sp := g.special(dst.Addr(), dst.Port())
		g.step(t, audit.StepAddressClass, !sp, t.start)
		if sp {
			f.Refuse()
			t.rec = g.specialRecord("tcp", dst, class)
			g.deny(t)
			return
		}
	}
	switch {
	case f.Named, dst.Port() == 443, dst.Port() == 80:
		c, err := f.Accept()
		if err != nil {
			return
		}
		g.peeked(ctx, c, dst, t)
	default:
		g.bound(ctx, f, t)
	}
}

// overCap refuses a connection beyond MaxConnections: an audit line for
// each, a daemon log line at most every capLogEvery (a guest opening
// connections in a loop would repeat it thousands of times a second).
func (g *Gate) overCap(dst netip.AddrPort) {
	r := g.denyRecord("tcp", dst, audit.TooManyConnections(g.o.MaxConnections))
	r.RejectedBy = audit.StepCapacity
	g.audit(r)
	now := time.Now().UnixNano()
	if last := g.capLogged.Load(); now-last > int64(capLogEvery) && g.capLogged.CompareAndSwap(last, now) {
		g.log.Warn("gate: refusing connections beyond the sandbox's limit; raise [network] max_connections if the guest needs more",
			"max_connections", g.o.MaxConnections, "dst", dst.String())
	}
}

// capLogEvery spaces the daemon's log lines about refused connections.
const capLogEvery = 10 * time.Second

// tcpTrace accumulates one flow's audit record.
type tcpTrace struct {
	start time.Time
	src   netip.AddrPort // the guest's end
	rec   audit.Record
	dec   policy.Decision // the name's decision, when a name decided
	sni   string          // the ClientHello's name, when it had one in the clear
	// request is set when request rules, not the name, refused a plain
	// HTTP request: its page offers a request rule.
	request bool
	// wouldDeny: report mode let through what the policy denies.
	wouldDeny bool
	// granted: a watcher's answer let the connection through without a
	// rule ("once", "hour"), so its requests are let through too.
	granted bool
	// named: the front end knows no original destination (TCPFlow.Named).
	named bool
	// steps is the trace of checks, for Options.Trace.
	steps []audit.Step
}

// step records one check in t's trace: its name, whether it let the flow
// on, and how long it took since since.
func (g *Gate) step(t *tcpTrace, name string, ok bool, since time.Time) {
	if !g.o.Trace {
		return
	}
	t.steps = append(t.steps, stepOf(name, ok, g.o.Now().Sub(since)))
}

func stepOf(name string, ok bool, d time.Duration) audit.Step {
	a := audit.StepAllow
	if !ok {
		a = audit.StepDeny
	}
	return audit.Step{Name: name, Action: a, DurationUS: d.Microseconds()}
}

// traced copies t's trace into its record, naming the step that
// refused the flow if one did.
func (g *Gate) traced(t *tcpTrace) {
	if !g.o.Trace {
		return
	}
	t.rec.Steps = t.steps
	t.rec.RejectedBy = rejectedBy(t.steps)
}

// rejectedBy is the last step that said deny, or "".
func rejectedBy(steps []audit.Step) string {
	for i := len(steps) - 1; i >= 0; i-- {
		if steps[i].Action == audit.StepDeny {
			return steps[i].Name
		}
	}
	return ""
}

// settle is a denied destination's last chance. A destination no rule
// decided is decided again once rules still on their way have come
// (Options.Settling). Then, in report mode, it goes through, audited
// would_deny; otherwise it waits for a watcher's answer, if anyone
// watches (or goes through while "allow everything for an hour" lasts).
// A destination a rule blocks is never held. It reports whether the
// connection may go on; the trace's record says why either way.
func (g *Gate) settle(ctx context.Context, t *tcpTrace, q Question) bool {
	if t.dec.Rule == nil && g.o.Settling != nil && g.o.Settling(ctx) {
		// Decided again by the live policy, which allows nothing while
		// the audit log fails.
		d := g.decideQuestion(q)
		t.dec = d
		t.rec.Rule, t.rec.Layer = ruleOf(d)
		if d.Verdict == policy.Allow {
			t.rec.Reason = ""
			return true
		}
		if d.Rule != nil {
			t.rec.Reason = audit.ReasonBlocked
			return false
		}
	}
	// After any wait: the log may have failed meanwhile.
	if err := g.unaudited(); err != nil {
		// Neither report mode nor a watcher lets through what could not
		// be recorded.
		t.rec.Reason = unrecordedReason(err)
		return false
	}
	if g.report.Load() {
		t.wouldDeny = true
		if t.rec.Reason == "" {
			t.rec.Reason = audit.ReasonNoRule
		}
		return true
	}
	if t.dec.Rule != nil || g.o.Holds == nil {
		return false
	}
	q.Src = t.src
	out := g.o.Holds.Ask(ctx, q)
	if out.Allow {
		// An answer that added a rule (run, always) decides like it;
		// one that did not (once, hour) is named in the record.
		d := g.decideQuestion(q)
		t.dec = d
		t.rec.Rule, t.rec.Layer = ruleOf(d)
		if d.Verdict != policy.Allow {
			t.rec.Rule, t.rec.Layer, t.granted = out.Answer, "interactive", true
		}
		t.rec.Reason = audit.WatcherAllowed(out.Answer)
		if out.By == ByRule {
			t.rec.Reason = audit.ReasonWatcherHour
		}
		return true
	}
	switch out.By {
	case ByWatcher:
		t.rec.Reason = audit.ReasonWatcherDenied
	case ByTimeout:
		t.rec.Reason = audit.HeldTimedOut(g.o.Holds.Timeout())
	case ByOverflow:
		t.rec.Reason = audit.HeldOverflow(g.o.Holds.Max())
	case ByClosed:
		t.rec.Reason = audit.ReasonWatcherLeft
	}
	return false
}

// decideQuestion decides q by its name, or by its address when it has none.
func (g *Gate) decideQuestion(q Question) policy.Decision {
	if q.Name != "" {
		return g.decideName(q.Name, q.Port)
	}
	return g.decideAddr(q.Addr, q.Port)
}

// verdict is an allowed flow's verdict: would_deny when only report mode
// let it through.
func (t *tcpTrace) verdict() audit.Verdict {
	if t.wouldDeny {
		return audit.WouldDeny
	}
	return audit.Allow
}

func (g *Gate) deny(t *tcpTrace) {
	t.rec.Verdict = audit.Deny
	if t.rec.Reason == "" {
		t.rec.Reason = audit.ReasonNoRule
	}
	if g.o.Trace && rejectedBy(t.steps) == "" {
		// Refused before any traced check said no (a peek that timed
		// out, say): the decision step is the policy's.
		g.step(t, audit.StepPolicy, false, g.o.Now())
	}
	g.traced(t)
	t.rec.DurationMS = g.o.Now().Sub(t.start).Milliseconds()
	g.audit(t.rec)
}

func (g *Gate) setDecision(t *tcpTrace, name string, from audit.NameSource, d policy.Decision) {
	t.rec.Name, t.rec.NameFrom = name, from
	t.rec.Rule, t.rec.Layer = ruleOf(d)
	t.dec = d
	if d.Verdict != policy.Allow && d.Rule != nil {
		t.rec.Reason = audit.ReasonBlocked
	}
}

// bound decides a connection on a port the gate does not read (SSH,
// databases, anything server-speaks-first) by the name bound to the
// address, dials, and only then completes the guest's handshake, so a
// refused upstream shows up in the guest as a refused connection.
func (g *Gate) bound(ctx context.Context, f TCPFlow, t *tcpTrace) {
	dst := f.Dst
	at := g.o.Now()
	target, ok := g.decideBound(ctx, dst, t)
	g.step(t, audit.StepPolicy, ok, at)
	if !ok {
		f.Refuse()
		g.deny(t)
		return
	}
	up, err := g.dialTraced(ctx, target, t)
	if err != nil {
		f.Refuse()
		g.finishFailed(t, err)
		return
	}
	c, err := f.Accept()
	if err != nil {
		up.Close()
		return
	}
	g.forward(ctx, c, up, nil, t)
}

// target is what the gate dials: either an address the guest chose that a
// binding or address rule vouches for, or a name the host resolves.
type target struct {
	name string     // resolve this on the host, when set
	addr netip.Addr // else dial this
	port uint16
}

// decideBound decides dst by the names bound to its address, then by
// address rules.
func (g *Gate) decideBound(ctx context.Context, dst netip.AddrPort, t *tcpTrace) (target, bool) {
	if t.named {
		t.rec.Reason = audit.ReasonNotByName
		return target{}, false
	}
	names := g.namesOf(dst.Addr())
	for _, n := range names {
		d := g.decideName(n.Name, dst.Port())
		if d.Verdict == policy.Allow {
			g.setDecision(t, n.Name, n.Source, d)
			if n.Source == audit.FromPool {
				// The guest holds a pool address from when the name was
				// denied; it is allowed now (a live rule change), so
				// dial what the host resolves.
				return target{name: n.Name, port: dst.Port()}, true
			}
			return target{addr: dst.Addr(), port: dst.Port()}, true
		}
	}
	if len(names) > 0 {
		n := names[0]
		g.setDecision(t, n.Name, n.Source, g.decideName(n.Name, dst.Port()))
		if !g.settle(ctx, t, Question{Name: n.Name, Addr: dst.Addr(), Port: dst.Port()}) {
			return target{}, false
		}
		if n.Source == audit.FromPool {
			return target{name: n.Name, port: dst.Port()}, true
		}
		return target{addr: dst.Addr(), port: dst.Port()}, true
	}
	if g.pool.Contains(dst.Addr()) {
		t.rec.Reason = audit.ReasonPoolUnbound
		return target{}, false
	}
	d := g.decideAddr(dst.Addr(), dst.Port())
	g.setDecision(t, "", "", d)
	if d.Verdict == policy.Allow || g.settle(ctx, t, Question{Addr: dst.Addr(), Port: dst.Port()}) {
		return target{addr: dst.Addr(), port: dst.Port()}, true
	}
	return target{}, false
}

// peeked reads the first bytes of a connection to 443 or 80, decides by
// the SNI or Host they carry, and carries the connection on.
func (g *Gate) peeked(ctx context.Context, c net.Conn, dst netip.AddrPort, t *tcpTrace) {
	at := g.o.Now()
	buf, kind, err := g.readHead(c)
	g.step(t, audit.StepPeek, err == nil, at)
	if err != nil {
		c.Close()
		t.rec.Reason = audit.ReasonFor(err)
		g.deny(t)
		return
	}
	var tg target
	var ok bool
	at = g.o.Now()
	switch kind {
	case headTLS:
		tg, ok = g.decideTLS(ctx, buf, dst, t)
		g.step(t, audit.StepPolicy, ok, at)
		if !ok {
			g.refuseTLSLegibly(ctx, c, buf, dst, t)
			return
		}
		if tg.name != "" {
			if why, must := g.interceptWhy(tg.name, t.dec); why != "" {
				if g.m != nil {
					g.intercept(ctx, c, buf, tg, dst, t, why)
					return
				}
				if must {
					// A secret or request rules depend on reading this
					// host's requests, and the gate cannot: refuse
					// rather than let them through unread.
					g.step(t, audit.StepInspection, false, g.o.Now())
					t.rec.Reason = audit.NeedsInspection(why)
					refuseTLS(c)
					g.deny(t)
					return
				}
			}
		}
	case headHTTP:
		var req peek.Request
		tg, req, ok = g.decideHTTP(ctx, buf, dst, t)
		g.step(t, audit.StepPolicy, ok, at)
		if ok {
			at = g.o.Now()
			ok = g.plainRequestAllowed(req, dst, t)
			if t.rec.Reason == audit.ReasonSecretInClear {
				g.step(t, audit.StepSecrets, ok, at)
			} else if t.dec.Inspect {
				g.step(t, audit.StepRequestRules, ok, at)
			}
		}
		if !ok {
			g.refuseHTTP(c, req, dst, t)
			g.deny(t)
			return
		}
		buf = forceClose(buf, req)
	default:
		// Neither TLS nor HTTP on 443/80 (SSH over 443, say): decided
		// like any other port, by the name bound to the address.
		tg, ok = g.decideBound(ctx, dst, t)
		g.step(t, audit.StepPolicy, ok, at)
		if !ok {
			c.Close()
			g.deny(t)
			return
		}
	}
	up, err := g.dialTraced(ctx, tg, t)
	if err != nil {
		c.Close()
		g.finishFailed(t, err)
		return
	}
	g.forward(ctx, c, up, buf, t)
}

type headKind int

const (
	headOther headKind = iota
	headTLS
	headHTTP
)

// errPeek* are the reasons a connection is refused before a decision.
var (
	errPeekTimeout = errors.New("no ClientHello or request head in time")
	errPeekLarge   = errors.New("ClientHello or request head too large")
)

// readHead reads until the bytes so far parse as a whole ClientHello or
// request head, or are clearly neither.
func (g *Gate) readHead(c net.Conn) ([]byte, headKind, error) {
	c.SetReadDeadline(g.o.Now().Add(g.o.PeekTimeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 0, 2048)
	tmp := make([]byte, 16<<10)
	for {
		n, err := c.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if len(buf) > 0 {
			switch {
			case peek.LooksLikeTLS(buf):
				_, perr := peek.ParseClientHello(buf)
				if perr == nil {
					return buf, headTLS, nil
				}
				if !errors.Is(perr, peek.ErrNeedMore) {
					return buf, headTLS, fmt.Errorf("malformed ClientHello: %v", perr)
				}
			case peek.LooksLikeHTTP(buf):
				_, perr := peek.ParseHTTPHead(buf)
				if perr == nil || !errors.Is(perr, peek.ErrNeedMore) {
					// Errors are judged by decideHTTP, which answers
					// with a legible 400/403.
					return buf, headHTTP, nil
				}
			case len(buf) >= 8:
				return buf, headOther, nil
			}
		}
		if len(buf) > maxPeek {
			return nil, 0, errPeekLarge
		}
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				if len(buf) > 0 && len(buf) < 8 && !peek.LooksLikeTLS(buf) && !peek.LooksLikeHTTP(buf) {
					return buf, headOther, nil
				}
				return nil, 0, errPeekTimeout
			}
			return nil, 0, fmt.Errorf("guest closed before a decision: %v", err)
		}
	}
}

// decideTLS decides a connection by its ClientHello's SNI. The upstream is
// what the host resolves for the SNI, never the address the guest chose:
// an allowed SNI sent to an attacker's address reaches the allowed host.
func (g *Gate) decideTLS(ctx context.Context, buf []byte, dst netip.AddrPort, t *tcpTrace) (target, bool) {
	hello, err := peek.ParseClientHello(buf)
	if err != nil {
		t.rec.Reason = audit.MalformedHello(err)
		return target{}, false
	}
	if hello.SNI == "" || hello.ECH {
		what := audit.ReasonNoSNI
		if hello.ECH {
			what = audit.ReasonECH
			t.rec.Name, t.rec.NameFrom = hello.SNI, audit.FromSNI
		}
		return g.byAddressRule(dst, t, what)
	}
	t.sni = hello.SNI
	d := g.decideName(hello.SNI, dst.Port())
	g.setDecision(t, hello.SNI, audit.FromSNI, d)
	if d.Verdict != policy.Allow && !g.settle(ctx, t, Question{Name: hello.SNI, Addr: dst.Addr(), Port: dst.Port()}) {
		return target{}, false
	}
	return target{name: hello.SNI, port: dst.Port()}, true
}

// byAddressRule allows a nameless connection only through an address rule.
func (g *Gate) byAddressRule(dst netip.AddrPort, t *tcpTrace, what audit.Reason) (target, bool) {
	if t.named {
		// The address is the gate's own: no address rule can speak
		// for where the client meant to go.
		t.rec.Reason = audit.NamelessToGate(what)
		return target{}, false
	}
	if g.pool.Contains(dst.Addr()) {
		t.rec.Reason = audit.NamelessToPool(what)
		return target{}, false
	}
	d := g.decideAddr(dst.Addr(), dst.Port())
	t.rec.Rule, t.rec.Layer = ruleOf(d)
	if d.Verdict != policy.Allow {
		t.rec.Reason = audit.NamelessNoAddressRule(what, dst.Addr().String())
		return target{}, false
	}
	return target{addr: dst.Addr(), port: dst.Port()}, true
}

// decideHTTP decides a plain HTTP request by its Host.
func (g *Gate) decideHTTP(ctx context.Context, buf []byte, dst netip.AddrPort, t *tcpTrace) (target, peek.Request, bool) {
	req, err := peek.ParseHTTPHead(buf)
	if err != nil {
		t.rec.Reason = audit.BadHead(err)
		return target{}, req, false
	}
	if req.Method == "CONNECT" {
		t.rec.Name, t.rec.NameFrom = req.Host, audit.FromHost
		t.rec.Reason = audit.ReasonConnect
		return target{}, req, false
	}
	if req.Host == "" {
		tg, ok := g.byAddressRule(dst, t, audit.ReasonNoHost)
		return tg, req, ok
	}
	if ip, err := netip.ParseAddr(req.Host); err == nil {
		t.rec.Name, t.rec.NameFrom = req.Host, audit.FromHost
		if ip != dst.Addr() {
			t.rec.Reason = audit.ReasonHostMismatch
			return target{}, req, false
		}
		tg, ok := g.byAddressRule(dst, t, audit.ReasonHostAddress)
		return tg, req, ok
	}
	d := g.decideName(req.Host, dst.Port())
	g.setDecision(t, req.Host, audit.FromHost, d)
	if d.Verdict != policy.Allow && !g.settle(ctx, t, Question{Name: req.Host, Addr: dst.Addr(), Port: dst.Port()}) {
		return target{}, req, false
	}
	return target{name: req.Host, port: dst.Port()}, req, true
}

// forceClose makes a plain-HTTP connection carry one request: the gate
// decided on this request's Host, and a second request on a kept-alive
// connection could name another host at the same address. Upgrades
// (WebSocket) are left alone: after the upgrade the stream is no longer
// HTTP.
func forceClose(buf []byte, req peek.Request) []byte {
	if req.HeaderEnd < 4 || req.HeaderEnd > len(buf) {
		return buf
	}
	head := buf[:req.HeaderEnd]
	if bytes.Contains(bytes.ToLower(head), []byte("\nupgrade:")) {
		return buf
	}
	out := make([]byte, 0, len(buf)+19)
	out = append(out, head[:len(head)-2]...)
	out = append(out, "Connection: close\r\n\r\n"...)
	return append(out, buf[req.HeaderEnd:]...)
}

// dialTraced is dialTarget as a step of t's trace: "address_class" when
// every address was in a refused class, else "dial".
func (g *Gate) dialTraced(ctx context.Context, tg target, t *tcpTrace) (net.Conn, error) {
	at := g.o.Now()
	c, err := g.dialTarget(ctx, tg, t)
	name := audit.StepDial
	var de *dialError
	if errors.As(err, &de) && de.refusedClass != "" {
		name = audit.StepAddressClass
	}
	g.step(t, name, err == nil, at)
	return c, err
}

// finishFailed audits an allowed flow whose upstream could not be reached.
func (g *Gate) finishFailed(t *tcpTrace, err error) {
	t.rec.Verdict = t.verdict()
	var de *dialError
	if errors.As(err, &de) && de.refusedClass != "" {
		// Every address the name resolved to is in a refused class: that
		// is a denial (rebinding to a private address, say).
		t.rec.Verdict = audit.Deny
	}
	g.traced(t)
	t.rec.Reason = audit.ReasonFor(err)
	t.rec.DurationMS = g.o.Now().Sub(t.start).Milliseconds()
	g.audit(t.rec)
}

// forward records the flow's start, writes what was peeked, then copies
// both ways until both sides are done, and records the flow's end with its
// byte counts.
func (g *Gate) forward(ctx context.Context, guest, up net.Conn, head []byte, t *tcpTrace) {
	t.rec.Verdict = t.verdict()
	t.rec.Upstream = up.RemoteAddr().String()
	g.traced(t)
	g.auditStart(t)
	var upN, downN int64
	if len(head) > 0 {
		n, err := up.Write(head)
		upN += int64(n)
		if err != nil {
			guest.Close()
			up.Close()
			t.rec.Reason = audit.UpstreamWrite(err)
			t.rec.BytesUp = upN
			t.rec.DurationMS = g.o.Now().Sub(t.start).Milliseconds()
			g.auditEnd(t)
			return
		}
	}
	done := make(chan int64, 1)
	go func() {
		n, _ := splice(up, guest)
		closeWrite(up)
		done <- n
	}()
	downN, _ = splice(guest, up)
	closeWrite(guest)
	select {
	case n := <-done:
		upN += n
	case <-ctx.Done():
	}
	guest.Close()
	up.Close()
	t.rec.BytesUp, t.rec.BytesDown = upN, downN
	t.rec.DurationMS = g.o.Now().Sub(t.start).Milliseconds()
	g.auditEnd(t)
}

// Copy buffers. A flow starts with a small one, so that the thousands of
// mostly idle connections a build can hold cost little, and moves to a
// large one after a read fills the small one: a bulk transfer. Every write
// to the guest's end becomes TCP segments of up to the MTU (64 KiB), and
// every read from the host's socket returns what has queued up; io.Copy's
// 32 KiB would halve the frame size on tap0 and double the reads, and on
// the guest↔gate path each frame costs context switches on both sides.
//
// The large buffer is one full segment. The netstack cuts each write into
// segments on its own (it merges a write into the one before only when all
// of it fits), so a 256 KiB write went out as four full frames and a fifth
// of about 1 KiB: 19.7 frames per MiB on tap0 instead of 16.2. Measured,
// that did not change a download's speed (the bytes cost, not the frames),
// but the Sentry handles fewer frames. It was four segments; one kept the
// download's speed and is what a flow whose guest stopped reading holds
// while its write waits (per direction), a quarter of four.
const (
	spliceSmall = 16 << 10
	spliceLarge = segmentPayload
)

// segmentPayload is the payload of a full segment towards the guest: tap0's
// MTU less the IPv4 and TCP headers and the most TCP options the netstack
// reserves room for (timestamps and SACK blocks: 40 bytes). With fewer
// options a segment holds a few bytes more, and four still carry the
// buffer.
const segmentPayload = TapMTU - 20 - 20 - 40

// TapMTU is the MTU of the guest's tap0 (netstack.MTU). 65520 is the
// largest an Ethernet-framed TAP takes with room for headers; large frames
// are what makes the userspace path fast.
const TapMTU = 65520

var (
	smallBufs = sync.Pool{New: func() any { b := make([]byte, spliceSmall); return &b }}
	largeBufs = sync.Pool{New: func() any { b := make([]byte, spliceLarge); return &b }}
)

// splice copies src to dst until src ends or either fails, like io.Copy
// but with the buffers above (io.Copy would take the net package's own
// 32 KiB path through WriteTo/ReadFrom whatever buffer it is given).
func splice(dst io.Writer, src io.Reader) (int64, error) {
	pool := &smallBufs
	bp := pool.Get().(*[]byte)
	defer func() { pool.Put(bp) }()
	var total int64
	for {
		buf := *bp
		n, rerr := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			total += int64(w)
			if werr != nil {
				return total, werr
			}
			if w != n {
				return total, io.ErrShortWrite
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				return total, nil
			}
			return total, rerr
		}
		if n == len(buf) && pool == &smallBufs {
			pool.Put(bp)
			pool = &largeBufs
			bp = pool.Get().(*[]byte)
		}
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		c.Close()
	}
}
