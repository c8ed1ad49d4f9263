// Package gate is the egress gate: the one place where a sandbox's traffic
// leaves for the outside, decided before anything is dialed.
//
// It exists because a sandbox whose network is "mostly" closed is open: an
// agent with root inside will find the one path nobody filtered (a raw
// socket, DNS to a public resolver, an IP it remembered, an allowed name
// pointed at its own server). So the gate sits outside the guest, in the
// per-sandbox daemon, and every flow is decided here by name, never by the
// address the guest chose alone:
//
//   - DNS (dns.go): the guest's only resolver. A name the policy allows is
//     resolved on the host and its answers remembered as bindings; any other
//     name gets an address from a private pool bound to that name and is
//     never sent upstream, so data hidden in query names goes nowhere.
//   - TCP (tcp.go): every connection is decided before its upstream dial.
//     TLS is decided by its SNI and dialed at what the host resolves for it;
//     plain HTTP by its Host header; other ports by the name bound to the
//     address the guest dialed.
//   - TLS interception (mitm.go): only where reading the requests is
//     needed (a bound secret, method/path rules, inspect = true) the gate
//     terminates TLS with a leaf from the sandbox's CA and carries each
//     request itself, decided and audited one by one; the rest is spliced.
//   - Refusals (refuse.go): a page an agent can read, over plain HTTP and,
//     with the CA, over HTTPS.
//   - Address classes (dial.go): loopback, private, link-local, metadata and
//     the host's own addresses are refused after resolution and again at
//     dial time, unless an explicit address rule opens them.
//   - Audit: one JSON line per decision, and a ledger of denials.
//
// The gate does not know how packets arrive: the netstack front end (the
// TAP of a local sandbox) hands it connections and datagrams, and another
// front end (a sidecar on an internal network) can do the same.
package gate

import (
	"context"
	"crypto/x509"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/policy"
)

// Options configure a Gate.
type Options struct {
	Sandbox string
	// RulesAt is where this gate's allow rules are kept when it is not a
	// moat sandbox's (a gate service tenant's policy file, a cluster
	// template's policy ConfigMap): a refusal page names it instead of
	// the `moat network allow` command, which does not exist there.
	RulesAt   string
	Policy    *policy.Policy // nil: deny everything (fail closed)
	Resolver  *Resolver
	HostAddrs func() []netip.Addr // the host's own addresses, refused like loopback
	Audit     *audit.Log          // may be nil in tests
	Ledger    *audit.Ledger       // may be nil in tests
	Log       *slog.Logger
	Now       func() time.Time
	// DialTimeout bounds one upstream dial. 10 s: longer than any healthy
	// connect, short enough that a black-holed address frees its slot.
	DialTimeout time.Duration
	// PeekTimeout bounds how long the gate waits for a ClientHello or an
	// HTTP request head before it gives up on the connection.
	PeekTimeout time.Duration

	// Certs mints the leaves the gate presents when it terminates TLS
	// (the sandbox's CA). Nil: the gate never terminates TLS; a host that
	// needs it for a secret or request rules is refused, one that only
	// inspect = true asks to read is spliced.
	Certs Certs
	// Credentials are the sandbox's secrets (nil: none).
	Credentials Credentials
	// Inspect terminates TLS to every allowed host ([network] inspect).
	Inspect bool
	// UpstreamRoots verifies the real hosts behind intercepted
	// connections. Nil: the host's system roots.
	UpstreamRoots *x509.CertPool

	// Holds is the interactive gate: undecided destinations wait there
	// for a watcher's answer. Nil: nothing is ever held.
	Holds *Holds
	// Settling, when set, is what a destination no rule decides waits
	// for before it is refused, held or let through in report mode: work
	// that may still add rules (the daemon asking the host's tools for
	// its package registries). It reports whether there was anything to
	// wait for; the gate then decides again. It must return within a
	// bound of its own and when ctx ends.
	Settling func(ctx context.Context) bool
	// Report starts the gate in report mode (see SetReport).
	Report bool
	// MaxConnections bounds the guest's connections open through the
	// gate at once; one beyond it is refused and audited. 0:
	// DefaultMaxConnections.
	MaxConnections int
	// Names, when valid (IPv4), is a range the front end routes to the
	// gate and hands it every connection to, on any port (the gate
	// service's [service] names): DNS answers every A query with an
	// address of this range bound to the name, an allowed name only
	// after it resolved upstream, so that a connection to that address
	// is decided by the name on any port, as a sandbox's pool address
	// is. It replaces 198.18.0.0/15 as the pool, and its addresses are
	// never dialed upstream (they are the gate's own). The name's real
	// addresses are what the gate resolves when it dials.
	Names netip.Prefix
	// MCP are the declared remote MCP servers: requests to their URLs
	// are decided call by call (mcp.go). Their hosts are always
	// intercepted.
	MCP []MCPServer
	// Trace adds the audit record's rejected_by and steps fields (which
	// check looked at a flow, what it said, how long it took). Off in
	// sandboxes for now, whose records are compared byte for byte
	// against golden files; the gate service turns it on.
	Trace bool
}

// Gate is one sandbox's egress gate. Its policy is swapped atomically;
// everything else is safe for concurrent use.
type Gate struct {
	o      Options
	log    *slog.Logger
	policy atomic.Pointer[policy.Policy]
	pool   *Pool
	binds  *Bindings
	dns    *DNSServer
	m      *mitm     // nil without Certs: nothing is intercepted
	local  *mcpLocal // nil without host-local MCP servers (mcplocal.go)

	// hostMu guards hostAddrs, refreshed at most every hostAddrsTTL.
	hostMu    sync.Mutex
	hostAddrs []netip.Addr
	hostAt    time.Time

	// report: what the policy denies goes through, audited would_deny.
	report atomic.Bool

	// Counters for status and benchmarks.
	allowed atomic.Int64
	denied  atomic.Int64

	// flows counts the open connections against MaxConnections;
	// capLogged is when a refusal beyond it was last logged (unix ns).
	flows     atomic.Int64
	capLogged atomic.Int64

	// unrecorded: the audit log was failing at the last decision (the
	// daemon's log says so once per episode).
	unrecorded atomic.Bool

	// flowPrefix and flows number the carried connections, whose start
	// and end records share a flow id: random per gate, so ids from
	// before a restart of the daemon do not meet the new ones.
	flowPrefix string
	flowSeq    atomic.Uint64
}

// hostAddrsTTL: the host's addresses change rarely (DHCP, VPN up/down);
// re-reading them once a second costs nothing and closes the window.
const hostAddrsTTL = time.Second

// New builds a gate.
func New(o Options) *Gate {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.PeekTimeout == 0 {
		o.PeekTimeout = 10 * time.Second
	}
	if o.MaxConnections <= 0 {
		o.MaxConnections = DefaultMaxConnections
	}
	g := &Gate{o: o, log: o.Log, pool: NewPool(o.Now), binds: NewBindings(o.Now),
		flowPrefix: strconv.FormatUint(rand.Uint64()>>32, 36)}
	if o.Names.IsValid() {
		g.pool = NewPoolIn(o.Names, o.Now)
	}
	if o.Policy != nil {
		g.policy.Store(o.Policy)
	}
	g.report.Store(o.Report)
	// A typed nil in an interface is not nil: a caller that passes a nil
	// *tlsca.CA means "no CA", not "a CA that panics".
	if isNil(o.Credentials) {
		g.o.Credentials = nil
	}
	if !isNil(o.Certs) {
		g.m = g.newMITM()
	} else {
		g.o.Certs = nil
	}
	g.local = g.newMCPLocal()
	g.dns = NewDNSServer(DNSOptions{
		Decide:   g.decideDNSName,
		Resolver: o.Resolver,
		Pool:     g.pool,
		PoolAll:  o.Names.IsValid(),
		Bindings: g.binds,
		Audit:    g.auditDNS,
		Now:      o.Now,
		Refused:  func(a netip.Addr) bool { _, sp := g.special(a, 0); return sp },
	})
	return g
}

// SetPolicy swaps the policy. Established connections are not touched:
// they were allowed when they were made.
func (g *Gate) SetPolicy(p *policy.Policy) { g.policy.Store(p) }

// SetReport turns report mode on or off. In report mode a connection or
// request the policy denies goes through anyway and is audited as
// would_deny, so a run shows what enforcing would cut. What is refused
// for the sandbox's safety rather than by policy stays refused: the
// refused address classes, a pool address with no name, TLS without a
// name, domain fronting, secrets in the clear, and UDP.
func (g *Gate) SetReport(on bool) { g.report.Store(on) }

// Report reports whether the gate is in report mode.
func (g *Gate) Report() bool { return g.report.Load() }

// Policy is the policy in force (nil: none, everything is denied).
func (g *Gate) Policy() *policy.Policy { return g.policy.Load() }

// DNS is the gate's DNS server, for the front end to feed.
func (g *Gate) DNS() *DNSServer { return g.dns }

// Bindings exposes the name bindings (pre-resolution adds to them).
func (g *Gate) Bindings() *Bindings { return g.binds }

// Counts returns how many flows were allowed and denied since start.
func (g *Gate) Counts() (allowed, denied int64) { return g.allowed.Load(), g.denied.Load() }

// livePolicy is the policy decisions use now: none, which denies
// everything, while the audit log cannot be written (threat model 28: a full
// disk), since nothing may go through that is not recorded.
func (g *Gate) livePolicy() *policy.Policy {
	if g.unaudited() != nil {
		return nil
	}
	return g.policy.Load()
}

// unrecordedReason is the reason a flow is refused for while the audit
// log fails (err is why it fails).
func unrecordedReason(err error) audit.Reason { return audit.Unrecorded(err) }

// unaudited is why decisions cannot be recorded now, or nil.
func (g *Gate) unaudited() error {
	if g.o.Audit == nil {
		return nil
	}
	err := g.o.Audit.Failing()
	// A write only when the state changes: this runs on every decision.
	if failing := err != nil; g.unrecorded.Load() != failing && g.unrecorded.CompareAndSwap(!failing, failing) && g.log != nil {
		if failing {
			g.log.Error("the audit log cannot be written: the gate lets nothing through until it can", "err", err)
		} else {
			g.log.Info("the audit log is written again: the gate decides as before")
		}
	}
	return err
}

func (g *Gate) decideName(name string, port uint16) policy.Decision {
	p := g.livePolicy()
	if p == nil {
		return policy.Decision{Verdict: policy.Deny}
	}
	return p.Name(name, port)
}

func (g *Gate) decideAddr(ip netip.Addr, port uint16) policy.Decision {
	p := g.livePolicy()
	if p == nil {
		return policy.Decision{Verdict: policy.Deny}
	}
	return p.Addr(ip, port)
}

func (g *Gate) decideDNSName(name string) (bool, string, string) {
	d := g.decideName(name, 0)
	rule, layer := ruleOf(d)
	return d.Verdict == policy.Allow, rule, layer
}

func ruleOf(d policy.Decision) (rule, layer string) {
	if d.Rule == nil {
		return "", ""
	}
	return d.Rule.Entry, d.Rule.Layer.String()
}

// host returns the host's own addresses, cached briefly.
func (g *Gate) host() []netip.Addr {
	if g.o.HostAddrs == nil {
		return nil
	}
	g.hostMu.Lock()
	defer g.hostMu.Unlock()
	if now := g.o.Now(); now.Sub(g.hostAt) > hostAddrsTTL {
		g.hostAddrs, g.hostAt = g.o.HostAddrs(), now
	}
	return g.hostAddrs
}

// special reports whether ip may not be dialed: it is in a refused class
// and no explicit address rule opens it. The returned reason names the
// class for the audit line.
func (g *Gate) special(ip netip.Addr, port uint16) (policy.AddrClass, bool) {
	if g.o.Names.IsValid() && g.pool.Contains(ip) {
		// The gate's own range: a dial there comes back to the gate.
		// No address rule opens it.
		return policy.ClassHost, true
	}
	class, sp := policy.Special(ip, g.host())
	if !sp {
		return "", false
	}
	if p := g.livePolicy(); p != nil {
		if _, ok := p.OpensSpecial(ip, port, class); ok {
			return "", false
		}
	}
	return class, true
}

func (g *Gate) audit(r audit.Record) {
	if !g.o.Trace {
		r.RejectedBy, r.Steps = "", nil
	}
	r.Sandbox = g.o.Sandbox
	if r.Time.IsZero() {
		r.Time = g.o.Now().UTC()
	}
	if r.Verdict == audit.Deny || r.Verdict == audit.WouldDeny {
		// A would_deny counts as denied: it is what enforcing would cut.
		g.denied.Add(1)
		if g.o.Ledger != nil {
			g.o.Ledger.Add(r)
		}
	} else {
		g.allowed.Add(1)
	}
	if g.o.Audit != nil {
		g.o.Audit.Write(r)
	}
}

// auditStart records a connection the gate is about to carry, as soon as
// it is decided and dialed: verdict, destination, rule, upstream. Its
// end is a second record (auditEnd) with the same flow id, so a
// connection that ends while its end cannot be written (a full disk)
// keeps its decision on record.
func (g *Gate) auditStart(t *tcpTrace) {
	t.rec.Time = g.o.Now().UTC()
	t.rec.Flow = g.flowPrefix + "-" + strconv.FormatUint(g.flowSeq.Add(1), 10)
	r := t.rec
	r.Phase = audit.PhaseStart
	g.audit(r)
}

// auditEnd records the end of a connection auditStart recorded: the same
// fields with bytes and duration. It counts nothing: the decision was
// counted at its start.
func (g *Gate) auditEnd(t *tcpTrace) {
	r := t.rec
	r.Phase, r.Sandbox = audit.PhaseEnd, g.o.Sandbox
	if g.o.Audit != nil {
		g.o.Audit.Write(r)
	}
}

func (g *Gate) auditDNS(e DNSEvent) {
	r := audit.Record{Proto: "dns", Dst: "gateway:53", Name: e.Name, NameFrom: audit.FromDNS,
		Verdict: e.Verdict, Rule: e.Rule, Layer: e.Layer, Reason: audit.DNSAnswered(e.QType)}
	if e.Pool {
		r.Reason = audit.DNSPooled(e.QType)
	}
	if e.Front {
		r.Reason = audit.DNSFront(e.QType, e.Verdict == audit.Allow)
	}
	if e.Err != "" {
		r.Reason = audit.DNSFailed(e.QType, e.Err)
	}
	if e.Verdict == audit.Deny {
		// A denied name is a denial worth counting only once it is
		// connected to; DNS denials go to the audit log, not the ledger,
		// or every lookup of a blocked tracker would fill it.
		if g.o.Audit != nil {
			r.Sandbox, r.Time = g.o.Sandbox, g.o.Now().UTC()
			if g.o.Trace {
				r.RejectedBy = audit.StepPolicy
			}
			g.o.Audit.Write(r)
		}
		return
	}
	g.audit(r)
}

// Refuses is the packet path's cheap check for a SYN: a destination in a
// refused address class is denied (and audited) before any goroutine or
// forwarder slot is spent on it.
func (g *Gate) Refuses(dst netip.AddrPort) bool {
	if g.pool.Contains(dst.Addr()) {
		return false
	}
	class, sp := g.special(dst.Addr(), dst.Port())
	if sp {
		g.audit(g.specialRecord("tcp", dst, class))
	}
	return sp
}

// specialRecord is the denial of a destination in a refused address
// class, naming the name the guest looked up for it if there is one (an
// allowed name that resolves to a metadata address, say).
func (g *Gate) specialRecord(proto string, dst netip.AddrPort, class policy.AddrClass) audit.Record {
	r := g.denyRecord(proto, dst, audit.RefusedClass(string(class)))
	r.RejectedBy = audit.StepAddressClass
	if names := g.namesOf(dst.Addr()); len(names) > 0 {
		r.Name, r.NameFrom = names[0].Name, names[0].Source
	}
	return r
}

// DenyDatagram audits a UDP datagram the front end drops (anything but DNS
// to the gateway: QUIC, DNS to a public resolver, plain UDP).
func (g *Gate) DenyDatagram(dst netip.AddrPort, reason audit.Reason) {
	g.audit(g.denyRecord("udp", dst, reason))
}

// Echo decides an ICMP echo request to dst: answered only when the
// destination is allowed (by its bound name or an address rule).
func (g *Gate) Echo(dst netip.Addr) bool {
	rec := audit.Record{Proto: "icmp", Dst: dst.String()}
	names := g.namesOf(dst)
	ok := false
	if class, sp := g.special(dst, 0); sp && !g.pool.Contains(dst) {
		rec.Reason = audit.RefusedClass(string(class))
		rec.RejectedBy = audit.StepAddressClass
	} else {
		for _, n := range names {
			d := g.decideName(n.Name, 0)
			if d.Verdict == policy.Allow {
				rec.Name, rec.NameFrom = n.Name, n.Source
				rec.Rule, rec.Layer = ruleOf(d)
				ok = true
				break
			}
		}
		if !ok && len(names) == 0 {
			d := g.decideAddr(dst, 0)
			rec.Rule, rec.Layer = ruleOf(d)
			ok = d.Verdict == policy.Allow
		}
	}
	if ok {
		rec.Verdict = audit.Allow
	} else {
		rec.Verdict = audit.Deny
		if rec.Reason == "" {
			rec.Reason = audit.ReasonNoRule
		}
		if len(names) > 0 {
			rec.Name, rec.NameFrom = names[0].Name, names[0].Source
		}
	}
	g.audit(rec)
	return ok
}

// boundName is a name the gate connects to an address, and why.
type boundName struct {
	Name   string
	Source audit.NameSource
}

// namesOf lists the names bound to ip: the pool's, then live bindings.
func (g *Gate) namesOf(ip netip.Addr) []boundName {
	var out []boundName
	if n, ok := g.pool.Name(ip); ok {
		out = append(out, boundName{n, audit.FromPool})
	}
	for _, b := range g.binds.Names(ip) {
		out = append(out, boundName{b.Name, b.Source})
	}
	return out
}

func (g *Gate) denyRecord(proto string, dst netip.AddrPort, reason audit.Reason) audit.Record {
	return audit.Record{Proto: proto, Dst: dst.String(), Verdict: audit.Deny, Reason: reason}
}

// Preresolve resolves the exact names of written allow rules and binds their
// answers (source "resolved"), so a guest that reaches an allowed host by
// an address it learnt elsewhere is still matched to the name. Run it
// periodically: CDNs move.
func (g *Gate) Preresolve(ctx context.Context) {
	p := g.policy.Load()
	if p == nil || g.o.Resolver == nil {
		return
	}
	var names []string
	for _, r := range p.Rules() {
		// Only the rules a person wrote (user, project, runtime): the
		// named lists are long, mostly unused by any one sandbox, and
		// their names are resolved when the guest looks them up.
		if r.Action == policy.Allow && r.Name != "" && !r.Wildcard && r.Layer > policy.LayerNamed {
			names = append(names, r.Name)
		}
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, n := range names {
		if g.decideName(n, 0).Verdict != policy.Allow {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			addrs, ttl, err := g.o.Resolver.LookupA(lctx, n)
			if err != nil || len(addrs) == 0 {
				return
			}
			g.binds.Add(n, addrs, SourceResolved, g.o.Now().Add(max(ttl, preresolveEvery)+time.Minute))
		}()
	}
	wg.Wait()
}

// preresolveEvery is how often allow rules are resolved again.
const preresolveEvery = 5 * time.Minute

// RunPreresolve resolves allow rules now and every preresolveEvery until
// ctx ends.
func (g *Gate) RunPreresolve(ctx context.Context) {
	t := time.NewTicker(preresolveEvery)
	defer t.Stop()
	for {
		g.Preresolve(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// allowEntry is the [network] allow entry for name and port.
func allowEntry(name string, port uint16) string { return policy.AllowEntry(name, netip.Addr{}, port) }

func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}
