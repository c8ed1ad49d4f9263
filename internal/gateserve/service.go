// Package gateserve is moat's egress gate as a network service (`moat gate
// serve`): one long-running process that serves clients which are not
// moat's own sandboxes (containers on an internal network, pods), each
// known by its source address ("tenant"), with the gate's own decision and
// proxy code (internal/gate).
//
// A sandbox's gate gets every packet of its guest from a TAP and knows
// where each connection was going. The service gets connections on
// ordinary host sockets and does not: a client reaches it because it
// resolves names through the service's DNS, which answers every name (for
// a known tenant) with the service's own address. An allowed name is
// resolved upstream first, so a name that does not exist is NXDOMAIN; any
// other name never leaves. The connection that follows arrives at the
// service's port 80 or 443 and is decided by its Host or SNI exactly as in
// a sandbox (gate.TCPFlow.Named): the same MITM with the service's CA, the
// same method/path rules, secret swapping, scrubbing, refusal pages and
// refused address classes at dial time.
//
// Other ports need an address that stands for the name. With
// [service] names, the service owns a range on the clients' network (a
// local route, so it answers ARP for it; names_linux.go), and DNS answers
// each name with an address of the range bound to it, per tenant (the
// tenant's gate's pool: gate.Options.Names). Every TCP connection to the
// range, on any port, reaches one transparent listener with the address
// the client dialed, and is decided as in a sandbox by the name bound
// there (80 and 443 still by Host and SNI); the upstream is what the
// service resolves for the name.
//
// Not covered: traffic that does not use the service's DNS, and UDP other
// than DNS. The network in front must drop everything else (a Docker
// --internal network, a Kubernetes NetworkPolicy): the service decides
// what it is sent, it does not capture.
//
// A client whose source address is no tenant's gets nothing: DNS answers
// REFUSED, connections are reset, and each is recorded in the service's
// own audit log. See docs/gate-service.md.
package gateserve

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/gate"
	"moat.dev/moat/internal/secret"
	"moat.dev/moat/internal/tlsca"
)

// Listeners are the service's sockets, bound before it drops its
// privileges. DNSUDP[i] and DNSTCP[i] are Config.DNS[i].
type Listeners struct {
	DNSUDP      []*net.UDPConn
	DNSTCP      []net.Listener
	HTTP, HTTPS []net.Listener
	Metrics     net.Listener // nil: none
	// Names is the transparent listener every connection to
	// Config.Names is handed to; nil without a names range. ic is what
	// routes the range to it, and lives as long as the listener.
	Names net.Listener
	ic    *interception
	// Control is the control socket's listener (control.go); nil
	// without service.control.
	Control *controlListener
}

// namesListener is where the names range's connections are handed: a
// loopback address no client reaches, on a port the kernel picks.
var namesListener = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 0)

// Listen binds every listener cfg names.
func Listen(cfg *Config) (*Listeners, error) {
	l := &Listeners{}
	fail := func(err error) (*Listeners, error) {
		l.Close()
		return nil, err
	}
	for _, ap := range cfg.DNS {
		u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return fail(fmt.Errorf("listening for DNS on udp %s: %w", ap, err))
		}
		l.DNSUDP = append(l.DNSUDP, u)
		t, err := net.Listen("tcp", ap.String())
		if err != nil {
			return fail(fmt.Errorf("listening for DNS on tcp %s: %w", ap, err))
		}
		l.DNSTCP = append(l.DNSTCP, t)
	}
	for _, x := range []struct {
		aps []netip.AddrPort
		out *[]net.Listener
	}{{cfg.HTTP, &l.HTTP}, {cfg.HTTPS, &l.HTTPS}} {
		for _, ap := range x.aps {
			t, err := net.Listen("tcp", ap.String())
			if err != nil {
				return fail(fmt.Errorf("listening on %s: %w", ap, err))
			}
			*x.out = append(*x.out, t)
		}
	}
	if cfg.Names.IsValid() {
		t, err := transparentListener(namesListener)
		if err != nil {
			return fail(err)
		}
		l.Names = t
		if l.ic, err = intercept(cfg.Names, addrPortOf(t.Addr())); err != nil {
			return fail(err)
		}
	}
	if cfg.Control != "" {
		c, err := listenControl(cfg.Control)
		if err != nil {
			return fail(err)
		}
		l.Control = c
	}
	if cfg.Metrics.IsValid() {
		t, err := net.Listen("tcp", cfg.Metrics.String())
		if err != nil {
			return fail(fmt.Errorf("listening for metrics on %s: %w", cfg.Metrics, err))
		}
		l.Metrics = t
	}
	return l, nil
}

// Close closes every listener.
func (l *Listeners) Close() {
	for _, u := range l.DNSUDP {
		u.Close()
	}
	for _, ls := range [][]net.Listener{l.DNSTCP, l.HTTP, l.HTTPS} {
		for _, t := range ls {
			t.Close()
		}
	}
	if l.Metrics != nil {
		l.Metrics.Close()
	}
	if l.Names != nil {
		l.Names.Close()
	}
	if l.Control != nil {
		l.Control.Close()
	}
	l.ic.Close()
}

// Options configure a Service.
type Options struct {
	Config    *Config
	Listeners *Listeners
	Log       *slog.Logger
	// SystemRoots verify upstreams behind intercepted connections, with
	// each tenant's [network] trust added. Loaded before the jail: it
	// cannot read them after. nil: x509.SystemCertPool now.
	SystemRoots *x509.CertPool
	// HostAddrs are the host's own addresses, refused as upstreams like
	// loopback (a name resolving to the service itself would loop). The
	// jail cannot list interfaces, so they are read once, at start. nil:
	// read now.
	HostAddrs []netip.Addr
	// Resolvers overrides Config.Upstream and /etc/resolv.conf (tests).
	Resolvers []netip.AddrPort
	// Kube overrides the clients [kubernetes] makes from its kubeconfig
	// or the pod's ServiceAccount (tests).
	Kube *KubeClients
	// Drain is how long the connections open when Serve's context ends
	// may go on (tests). 0: drainTimeout.
	Drain time.Duration
}

// drainTimeout is how long a stopping service lets the connections it
// holds finish: a request already sent upstream gets its answer back, so
// a client is not told a request failed that the upstream carried out.
// Under the parent's own 10 s before it kills the jailed child, and the
// DaemonSet's grace period.
const drainTimeout = 5 * time.Second

// Service is a running gate service.
type Service struct {
	cfg      *Config
	l        *Listeners
	log      *slog.Logger
	res      *gate.Resolver
	ca       *tlsca.CA
	roots    *x509.CertPool
	host     []netip.Addr
	unknown  *audit.Log // clients that are no tenant's
	metrics  *metrics
	started  time.Time
	drain    time.Duration // Options.Drain
	reloadMu sync.Mutex    // one reload or push at a time
	// pushed is each tenant's secret values pushed over the control
	// socket (control.go), by tenant and secret: in memory only.
	pushed map[string]map[string][]byte

	// tenants is swapped whole by a reload, or by the Kubernetes
	// source whenever a pod or what it is bound to changes.
	tenants atomic.Pointer[tenantTable]
	// kube is the Kubernetes tenant source; nil without [kubernetes].
	kube *kubeSource
}

// tenant is one tenant's gate and what a reload changes in it.
type tenant struct {
	cfg    Tenant
	gate   *gate.Gate
	creds  *credentials
	audit  *audit.Log
	dnsSem chan struct{} // DNS queries being answered at once
	// fixed is what the gate was built with that a reload cannot change.
	fixed fixedNetwork
	// mcp is the [mcp] servers the gate was built with (mcpKey).
	mcp string
	// gone ends when the tenant is removed (a Kubernetes pod deleted):
	// its open connections are cut. nil: never.
	gone context.Context
	// gateKey is a Kubernetes tenant's name in its gate's records
	// (kube_source.go's gateKey).
	gateKey string
}

// fixedNetwork is the part of a tenant's [network] a gate takes at start.
type fixedNetwork struct {
	inspect        bool
	maxConnections int
	maxDNSQueries  int
}

func fixedOf(n config.Network) fixedNetwork {
	return fixedNetwork{n.Inspect, n.MaxConnections, n.MaxDNSQueries}
}

// tenantTable maps source addresses to tenants.
type tenantTable struct {
	byName  map[string]*tenant
	entries []tableEntry // longest prefix first
	// byAddr is the Kubernetes source's: one pod's address each.
	byAddr map[netip.Addr]*tenant
}

type tableEntry struct {
	p netip.Prefix
	t *tenant
}

func newTable(ts []*tenant) *tenantTable {
	tt := &tenantTable{byName: map[string]*tenant{}}
	for _, t := range ts {
		tt.byName[t.cfg.Name] = t
		for _, p := range t.cfg.Sources {
			tt.entries = append(tt.entries, tableEntry{p, t})
		}
	}
	slices.SortStableFunc(tt.entries, func(a, b tableEntry) int { return b.p.Bits() - a.p.Bits() })
	return tt
}

// lookup is the tenant src belongs to, or nil.
func (tt *tenantTable) lookup(src netip.Addr) *tenant {
	src = src.Unmap()
	if t, ok := tt.byAddr[src]; ok {
		return t
	}
	for _, e := range tt.entries {
		if e.p.Contains(src) {
			return e.t
		}
	}
	return nil
}

// defaultMaxDNSQueries bounds one tenant's DNS queries being answered at
// once (each may wait on the upstream for up to 3 s); beyond it a query
// is dropped and the client retries.
const defaultMaxDNSQueries = 256

// New sets the service up: the CA, every tenant's rules, secrets and audit
// log. Everything read from the host's files is read here, before the
// jail; a reload reads again only what the jail keeps (Binds).
func New(o Options) (*Service, error) {
	cfg := o.Config
	s := &Service{cfg: cfg, l: o.Listeners, log: o.Log, roots: o.SystemRoots, host: o.HostAddrs, started: time.Now(), drain: o.Drain}
	if s.drain <= 0 {
		s.drain = drainTimeout
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.roots == nil {
		r, err := x509.SystemCertPool()
		if err != nil {
			r = x509.NewCertPool()
		}
		s.roots = r
	}
	if s.host == nil {
		s.host = gate.HostAddrs()
	}
	servers := o.Resolvers
	if len(servers) == 0 {
		servers = cfg.Upstream
	}
	if len(servers) == 0 {
		rs, err := gate.ServersFromResolvConf("/etc/resolv.conf")
		if err != nil || len(rs) == 0 {
			return nil, fmt.Errorf("%s: no upstream resolver: /etc/resolv.conf names none (%v); set [upstream] dns", cfg.Path, err)
		}
		servers = rs
	}
	s.res = gate.NewResolver(gate.ResolverOptions{Servers: servers})
	for _, d := range []string{filepath.Join(cfg.StateDir, "ca"), filepath.Dir(cfg.Audit)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	ca, err := tlsca.LoadOrCreate(filepath.Join(cfg.StateDir, "ca"))
	if err != nil {
		return nil, fmt.Errorf("loading the service's CA: %w", err)
	}
	s.ca = ca
	if err := writeFileAtomic(cfg.CACert, ca.CertPEM(), 0o644); err != nil {
		return nil, fmt.Errorf("writing the CA certificate for clients to %s: %w", cfg.CACert, err)
	}
	s.metrics = newMetrics()
	s.unknown, err = audit.OpenWith(cfg.Audit, audit.Options{Logger: s.log.With("component", "audit")})
	if err != nil {
		return nil, fmt.Errorf("opening the audit log for unknown sources: %w", err)
	}
	s.unknown.Tap(s.metrics.tap(""))
	var ts []*tenant
	for _, tc := range cfg.Tenants {
		t, err := s.newTenant(tc)
		if err != nil {
			s.closeTenants(ts)
			s.unknown.Close()
			return nil, err
		}
		ts = append(ts, t)
	}
	s.tenants.Store(newTable(ts))
	if cfg.Kube != nil {
		if s.kube, err = newKubeSource(s, o.Kube); err != nil {
			s.unknown.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *Service) newTenant(tc Tenant) (*tenant, error) {
	r, err := readRules(tc, s.roots)
	if err != nil {
		return nil, err
	}
	old, err := readPlaceholders(tc.Placeholders)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: reading its placeholders: %w", tc.Name, err)
	}
	set, pending, err := resolveTenant(tc, r, old, nil)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: reading its secrets: %w", tc.Name, err)
	}
	for _, d := range []string{filepath.Dir(tc.Audit), filepath.Dir(tc.Placeholders)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	creds := &credentials{}
	creds.store(set, pending)
	if err := writePlaceholders(tc.Placeholders, creds.placeholders()); err != nil {
		return nil, fmt.Errorf("tenant %s: writing its placeholders: %w", tc.Name, err)
	}
	al, err := audit.OpenWith(tc.Audit, audit.Options{MaxBytes: int64(r.audit.MaxBytes), Retention: r.audit.Retention,
		Logger: s.log.With("component", "audit", "tenant", tc.Name)})
	if err != nil {
		return nil, fmt.Errorf("tenant %s: opening its audit log: %w", tc.Name, err)
	}
	al.Tap(s.metrics.tap(tc.Name))
	return s.assemble(tc, tc.Name, r, creds, al), nil
}

// assemble makes a tenant's gate; sandbox is what its audit records
// name.
func (s *Service) assemble(tc Tenant, sandbox string, r *rules, creds *credentials, al *audit.Log) *tenant {
	t := &tenant{cfg: tc, creds: creds, audit: al, dnsSem: make(chan struct{}, dnsLimit(r.network)), fixed: fixedOf(r.network)}
	host := s.host
	t.gate = gate.New(gate.Options{
		Sandbox:        sandbox,
		RulesAt:        tc.RulesAt,
		Policy:         r.policy,
		Resolver:       s.res,
		HostAddrs:      func() []netip.Addr { return host },
		Audit:          al,
		Ledger:         audit.NewLedger(1024),
		Log:            s.log.With("component", "gate", "tenant", tc.Name),
		Certs:          s.ca,
		Credentials:    t.creds,
		Inspect:        r.network.Inspect,
		UpstreamRoots:  rootsOr(r.roots, s.roots),
		Report:         r.network.Mode == config.ModeReport,
		MaxConnections: r.network.MaxConnections,
		Names:          s.cfg.Names,
		Trace:          true,
		// [mcp.NAME] in the tenant's files: calls decided by tool and
		// resource, as in a sandbox.
		MCP: gate.MCPServers(r.network.MCP),
	})
	t.mcp = mcpKey(r.network.MCP)
	return t
}

func rootsOr(a, b *x509.CertPool) *x509.CertPool {
	if a != nil {
		return a
	}
	return b
}

func dnsLimit(n config.Network) int {
	if n.MaxDNSQueries > 0 {
		return n.MaxDNSQueries
	}
	return defaultMaxDNSQueries
}

func (s *Service) closeTenants(ts []*tenant) {
	for _, t := range ts {
		t.audit.Close()
	}
}

// Serve serves every listener until ctx ends. Then it closes them and
// lets the HTTP and TLS connections open at that moment finish, for up to
// Options.Drain, before it cuts what is left (DNS over TCP is cut at
// once: a client asks again) and closes the audit logs.
func (s *Service) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// conns outlives ctx by the drain: the connections being served, and
	// the Kubernetes source that keeps their tenants current meanwhile.
	conns, cut := context.WithCancel(context.WithoutCancel(ctx))
	defer cut()
	var wg, draining sync.WaitGroup
	run := func(wg *sync.WaitGroup, fn func()) {
		wg.Add(1)
		go func() { defer wg.Done(); fn() }()
	}
	for i, u := range s.l.DNSUDP {
		front := s.front(s.cfg.DNS[i])
		run(&wg, func() { s.serveDNSUDP(ctx, u, front) })
	}
	for i, t := range s.l.DNSTCP {
		front := s.front(s.cfg.DNS[i])
		run(&wg, func() {
			s.accept(ctx, t, func(c net.Conn, tn *tenant) { tn.gate.DNS().ServeTCPAt(ctx, c, front) }, "dns")
		})
	}
	for _, t := range append(slices.Clone(s.l.HTTP), s.l.HTTPS...) {
		run(&draining, func() { s.accept(conns, t, func(c net.Conn, tn *tenant) { s.handleTCP(conns, c, tn, true) }, "tcp") })
	}
	if s.l.Names != nil {
		run(&draining, func() {
			s.accept(conns, s.l.Names, func(c net.Conn, tn *tenant) {
				if !s.cfg.Names.Contains(addrPortOf(c.LocalAddr()).Addr()) {
					reset(c) // the listener's own address, dialed on the host
					return
				}
				s.handleTCP(conns, c, tn, false)
			}, "tcp")
		})
	}
	if s.l.Metrics != nil {
		run(&wg, func() { s.serveMetrics(ctx, s.l.Metrics) })
	}
	if s.l.Control != nil {
		run(&wg, func() { s.serveControl(ctx, s.l.Control) })
	}
	if s.kube != nil {
		run(&wg, func() { s.kube.run(conns) })
	}
	<-ctx.Done()
	s.l.Close() // nothing new is accepted; accept returns once its connections end
	drained := make(chan struct{})
	go func() { draining.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(s.drain):
		s.log.Warn("gate service: connections still open after the drain are cut", "drain", s.drain)
	}
	cut()
	draining.Wait()
	wg.Wait()
	tt := s.tenants.Load()
	for _, t := range tt.byName {
		t.audit.Close()
	}
	if s.kube != nil {
		s.kube.audit.Close()
	}
	s.unknown.Close()
	s.res.Close()
	return nil
}

// front is the address DNS answers with for queries that arrive at ap;
// none with a names range, whose addresses the tenant's gate hands out.
func (s *Service) front(ap netip.AddrPort) netip.Addr {
	if s.cfg.Names.IsValid() {
		return netip.Addr{}
	}
	if s.cfg.Answer.IsValid() {
		return s.cfg.Answer
	}
	return ap.Addr()
}

// accept serves one TCP listener: each connection from a tenant goes to
// handle on a goroutine of its own; one from anyone else is reset and
// recorded.
func (s *Service) accept(ctx context.Context, l net.Listener, handle func(net.Conn, *tenant), proto string) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and the like: back off instead of spinning.
			s.log.Warn("gate service: accepting a connection failed", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		at := time.Now()
		src, dst := addrPortOf(c.RemoteAddr()), addrPortOf(c.LocalAddr())
		t := s.tenants.Load().lookup(src.Addr())
		if t == nil {
			reset(c)
			s.refuseUnknown(proto, src, dst, at)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			if t.gone != nil {
				// A pod deleted takes its connections with it, so an
				// address given to a new pod carries nothing of the old.
				stopGone := context.AfterFunc(t.gone, func() { c.Close() })
				defer stopGone()
			}
			handle(c, t)
		}()
	}
}

// handleTCP hands one connection to the tenant's gate. On a listener of
// the service's own (named), it is decided by the name it carries
// (TCPFlow.Named): the service's address says nothing of where the client
// meant to go. From the names range, it is decided as in a sandbox: by
// the name the tenant's gate bound to the address the client dialed (on
// 80 and 443 by Host and SNI).
func (s *Service) handleTCP(ctx context.Context, c net.Conn, t *tenant, named bool) {
	open := s.metrics.open.WithLabelValues(t.cfg.Name)
	open.Inc()
	defer open.Dec()
	t.gate.HandleTCP(ctx, gate.TCPFlow{
		Src: addrPortOf(c.RemoteAddr()), Dst: addrPortOf(c.LocalAddr()), Named: named,
		Accept: func() (net.Conn, error) { return c, nil },
		Refuse: func() { reset(c) },
	})
}

// maxDNSMessage is the largest UDP query read; larger ones are junk.
const maxDNSMessage = 4096

// serveDNSUDP answers queries on u until it is closed.
func (s *Service) serveDNSUDP(ctx context.Context, u *net.UDPConn, front netip.Addr) {
	var wg sync.WaitGroup
	defer wg.Wait()
	local := addrPortOf(u.LocalAddr())
	for {
		buf := make([]byte, maxDNSMessage)
		n, src, err := u.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		at := time.Now()
		query := buf[:n]
		t := s.tenants.Load().lookup(src.Addr())
		if t == nil {
			if resp := refusedAnswer(query); resp != nil {
				u.WriteToUDPAddrPort(resp, src)
			}
			s.refuseUnknown("dns", src, local, at)
			continue
		}
		select {
		case t.dnsSem <- struct{}{}:
		default:
			// The tenant has as many queries in flight as it may: this
			// one is dropped, and the client's retry finds room.
			s.metrics.dnsDropped.WithLabelValues(t.cfg.Name).Inc()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-t.dnsSem }()
			if resp := t.gate.DNS().HandleAt(ctx, query, false, front); resp != nil {
				u.WriteToUDPAddrPort(resp, src)
			}
		}()
	}
}

// refusedAnswer is REFUSED for a query, or nil for what is not one.
func refusedAnswer(query []byte) []byte {
	req := new(dns.Msg)
	if err := req.Unpack(query); err != nil || req.Response {
		return nil
	}
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeRefused)
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}

// refuseUnknown records a client that is no tenant's.
func (s *Service) refuseUnknown(proto string, src, dst netip.AddrPort, at time.Time) {
	dstS := dst.String()
	if proto == "dns" {
		dstS = "gateway:53"
	}
	s.unknown.Write(audit.Record{Time: at.UTC(), Proto: proto, Dst: dstS, Verdict: audit.Deny,
		Reason: audit.UnknownSource(src.Addr().String()), RejectedBy: audit.StepSource,
		Steps: []audit.Step{{Name: audit.StepSource, Action: audit.StepDeny, DurationUS: time.Since(at).Microseconds()}}})
}

// reset closes c with a RST, so the client fails at once.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func addrPortOf(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// Reload reads the configuration file and every tenant's policy files and
// secrets again, and applies them all or nothing: each tenant's rules
// (new connections and new requests on open intercepted ones are decided
// by them; established connections are not touched), secrets (the
// placeholders stay), report mode and sources. What a reload cannot
// change (listeners, the state directory, the uid, the set of tenants,
// audit and placeholder files) is refused with the old configuration
// kept: restart the service for those.
//
// Pushed secrets keep the values pushed so far (control.go).
func (s *Service) Reload() error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	return s.reload(s.pushed)
}

// reload is Reload with pushed as the pushed values; reloadMu is held.
func (s *Service) reload(pushed map[string]map[string][]byte) error {
	cfg, err := LoadConfig(s.cfg.Path)
	if err != nil {
		return err
	}
	if why := fixedChanged(s.cfg, cfg); why != "" {
		return fmt.Errorf("%s: %s changed, which a reload cannot apply; nothing was reloaded: restart the service", cfg.Path, why)
	}
	if s.kube != nil {
		// Policies and secrets come from the cluster and are applied as
		// they change there; the file holds nothing else a reload could.
		s.kube.kick()
		return nil
	}
	cur := s.tenants.Load()
	type next struct {
		t            *tenant
		cfg          Tenant
		r            *rules
		set, pending *secret.Set
	}
	var nexts []next
	for _, tc := range cfg.Tenants {
		t := cur.byName[tc.Name]
		r, err := readRules(tc, s.roots)
		if err != nil {
			return err
		}
		// Fail closed: the new files would allow a server's URL while
		// the gate decided its calls by the old declarations.
		if mcpKey(r.network.MCP) != t.mcp {
			return fmt.Errorf("tenant %s: its [mcp] servers changed, which a reload cannot apply (the gate decides their calls by the declarations it started with); nothing was reloaded: restart the service", tc.Name)
		}
		set, pending, err := resolveTenant(tc, r, t.creds.placeholders(), pushed[tc.Name])
		if err != nil {
			return fmt.Errorf("tenant %s: reading its secrets: %w", tc.Name, err)
		}
		nexts = append(nexts, next{t, tc, r, set, pending})
	}
	var ts []*tenant
	for _, n := range nexts {
		if fixedOf(n.r.network) != n.t.fixed {
			s.log.Warn("gate service: a tenant's inspect, max_connections or max_dns_queries changed; they take effect at the next restart",
				"tenant", n.cfg.Name)
		}
		n.t.gate.SetPolicy(n.r.policy)
		n.t.gate.SetReport(n.r.network.Mode == config.ModeReport)
		n.t.creds.store(n.set, n.pending)
		if err := writePlaceholders(n.cfg.Placeholders, n.t.creds.placeholders()); err != nil {
			s.log.Error("gate service: writing placeholders after a reload", "tenant", n.cfg.Name, "err", err)
		}
		// The tenant's struct is shared with its open connections: a
		// copy carries the new sources, the gate and logs stay the same.
		nt := *n.t
		nt.cfg = n.cfg
		ts = append(ts, &nt)
	}
	s.tenants.Store(newTable(ts))
	s.metrics.reloads.Inc()
	return nil
}

// fixedChanged names what differs between a and b that a reload cannot
// change, or "".
func fixedChanged(a, b *Config) string {
	switch {
	case a.StateDir != b.StateDir:
		return "service.state_dir"
	case a.UID != b.UID || a.GID != b.GID:
		return "service.uid or gid"
	case a.CACert != b.CACert:
		return "service.ca_cert"
	case a.Answer != b.Answer:
		return "service.answer"
	case a.Names != b.Names:
		return "service.names"
	case a.Control != b.Control:
		return "service.control"
	case a.Audit != b.Audit:
		return "service.audit"
	case !slices.Equal(a.DNS, b.DNS) || !slices.Equal(a.HTTP, b.HTTP) || !slices.Equal(a.HTTPS, b.HTTPS) || a.Metrics != b.Metrics:
		return "[listen]"
	case !slices.Equal(a.Upstream, b.Upstream):
		return "[upstream]"
	case (a.Kube == nil) != (b.Kube == nil) || a.Kube != nil && *a.Kube != *b.Kube:
		return "[kubernetes]"
	case len(a.Tenants) != len(b.Tenants):
		return "the set of tenants"
	}
	for i := range a.Tenants {
		ta, tb := a.Tenants[i], b.Tenants[i]
		switch {
		case ta.Name != tb.Name:
			return "the set of tenants"
		case ta.Audit != tb.Audit:
			return "tenants." + ta.Name + ".audit"
		case ta.Placeholders != tb.Placeholders:
			return "tenants." + ta.Name + ".placeholders"
		}
	}
	return ""
}

// writeFileAtomic writes b to path through a temporary file beside it.
func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// mcpKey identifies a set of [mcp] declarations: equal keys, equal
// declarations (encoding/json writes a map's keys sorted).
func mcpKey(m map[string]config.MCPServer) string {
	b, _ := json.Marshal(m)
	return string(b)
}
