package e2e

// End-to-end tests of the egress gate (docs/network.md; threat model 1-22:
// going around the gate, name versus destination, DNS, internal targets), through the built moat binary exactly as a
// user types it, against a real guest and the real gate. The upstream world is test/inet: a
// network namespace holding the servers below, and the DNS server the gate is pointed at with
// MOAT_UPSTREAM_DNS. Nothing here talks to anything but loopback and that namespace.
//
// Most attacks run as subtests of TestGate against one sandbox (a start costs about a second,
// and the tier must stay fast). Every subtest is checked for leaks when it ends: no server an
// attacker controls (or an internal target) may have seen a connection, a byte or a datagram,
// and the upstream DNS server may have been asked only A questions for names the policy
// allows. "Denied" is then shown per attempt: the guest fails promptly and the audit log has
// the denial.

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"moat.dev/moat/test/inet"
)

// The test internet's hosts. 198.51.100.0/24 is routed into the inet namespace; the private,
// CGNAT and link-local ones get /32 routes there from inet.AddHost, so a leak would reach a
// real server that counts it.
const (
	upstreamDNS  = "198.51.100.53:53"
	allowedIP    = "198.51.100.10" // allowed.test and its spellings
	liveIP       = "198.51.100.11" // live.test: allowed and removed at run time
	httpsOnlyIP  = "198.51.100.20" // httpsonly.test, allowed on :443 only
	portIP       = "198.51.100.30" // port.test, allowed on :2222 only
	rebindIP     = "198.51.100.40" // rebind.test before it rebinds to lanIP
	dohIP        = "198.51.100.50" // doh.test: a DNS-over-HTTPS server that answers evilIP
	evilIP       = "198.51.100.66" // the attacker: evil.test and everything below it
	lanIP        = "10.1.2.3"      // lan.test, and rebind.test after rebinding
	lan2IP       = "192.168.77.7"
	openedIP     = "172.31.250.5" // opened by an explicit address rule: the positive control
	closedIP     = "172.31.250.6" // its neighbour, which no rule opens
	cgnatIP      = "100.64.1.1"
	metadataIP   = "169.254.169.254"
	ecsIP        = "169.254.170.2"
	alibabaIP    = "100.100.100.200"
	gatewayIP    = "10.88.0.1"
	guestIP      = "10.88.0.2"
	sshBanner    = "SSH-2.0-moat-e2e-allowed\r\n"
	portBanner   = "SSH-2.0-moat-e2e-port\r\n"
	rebindBanner = "SSH-2.0-moat-e2e-rebind\r\n"
	liveBanner   = "SSH-2.0-moat-e2e-live\r\n"
	evilBanner   = "SSH-2.0-moat-e2e-EVIL\r\n"
)

// gateToml is the main sandbox's policy: no built-in list, only these rules, in the project
// layer. Names that resolve to internal addresses are allowed on purpose: a name rule must
// never open an internal address.
const gateToml = `[network]
use = ["none"]
allow = [
  "allowed.test",
  "*.wild.test",
  "port.test:2222",
  "httpsonly.test:443",
  "xn--bcher-kva.test",
  "rebind.test",
  "doh.test",
  "meta.test",
  "metadata.google.internal",
  "lan.test",
  "cgnat.test",
  "loop.test",
  "hostself.test",
  "hostlan.test",
  "gw.test",
  "172.31.250.5",
]
block = ["blocked.wild.test"]
`

// allowedQueries are the only names the upstream DNS server may ever be asked about (type A
// only): the exact allow rules, and names below *.wild.test other than the blocked one.
var allowedQueries = []string{
	"allowed.test", "port.test", "httpsonly.test", "xn--bcher-kva.test", "rebind.test", "doh.test",
	"meta.test", "metadata.google.internal", "lan.test", "cgnat.test", "loop.test", "hostself.test",
	"hostlan.test", "gw.test",
}

// Bounds. A denial is prompt when the guest sees it well before any client timeout would fire.
const (
	promptly      = 2 * time.Second // a refused connection or an answered denial, in the guest
	auditWait     = 3 * time.Second // an audit line is written when the flow ends
	dropTimeout   = "1500ms"        // how long the probe waits on traffic the gate drops silently
	probeDefault  = "4s"
	curlMaxTimeS  = "8"
	guestRunBound = 20 * time.Second // one `moat run` of a batch of attempts
)

// gateEnv is one sandbox behind the gate, the test internet around it, and the servers that
// must never hear from it.
type gateEnv struct {
	net   *inet.Net
	name  string
	dir   string // workspace, same path in host and guest
	state string // $MOAT_HOME/state/sandboxes/<name>
	env   []string
	probe string // the probe, inside the workspace
	ca    string // the test CA's PEM, inside the workspace

	hostIP string        // the host's own LAN address
	host   *hostListener // listens on every host address; must never be reached

	srv     map[string]*inet.Server // by role, see startServers
	watched []string                // roles whose servers must never be contacted

	// liveWindow is the part of the DNS query log during which live.test had a runtime allow
	// rule (live_rules): the only time it may be asked upstream.
	liveWindow [2]int
}

// hostListener is a TCP listener in the host namespace on all addresses; every connection it
// accepts is a connection the gate should have refused.
type hostListener struct {
	port    int
	accepts atomic.Int64
}

func listenHost(t *testing.T, network, addr string) (*hostListener, net.Listener) {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("listening on the host (%s %s): %v", network, addr, err)
	}
	h := &hostListener{}
	if ta, ok := l.Addr().(*net.TCPAddr); ok {
		h.port = ta.Port
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.accepts.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return h, l
}

// newGateEnv starts the test internet's servers, then a sandbox named name whose workspace
// holds toml as moat.toml, the probe and the test CA.
func newGateEnv(t *testing.T, n *inet.Net, name, toml string) *gateEnv {
	t.Helper()
	g := &gateEnv{
		net:   n,
		name:  name,
		dir:   project(t, name),
		state: filepath.Join(moatHome, "state", "sandboxes", name),
		env:   []string{"MOAT_UPSTREAM_DNS=" + upstreamDNS},
		srv:   map[string]*inet.Server{},
	}
	g.probe = installProbe(t, g.dir)
	g.ca = filepath.Join(g.dir, "ca.pem")
	// The guest's agent user writes curl results here (see script).
	if err := os.Mkdir(filepath.Join(g.dir, "out"), 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(g.dir, "out"), 0o777)
	if err := os.WriteFile(g.ca, n.CA().PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	g.hostIP = hostLANAddr(t)
	g.host, _ = listenHost(t, "tcp4", "0.0.0.0:0")
	return g
}

// up starts the sandbox with the gate's upstream resolver pointed at the test DNS server.
func (g *gateEnv) up(t *testing.T) {
	t.Helper()
	start := time.Now()
	if r := moat(t, g.dir, g.env, "up"); r.code != 0 {
		t.Fatalf("moat up %s: exit %d\nstdout: %s\nstderr: %s\n%s", g.name, r.code, r.stdout, r.stderr, g.daemonLog())
	}
	t.Logf("sandbox %s up in %v", g.name, time.Since(start).Round(time.Millisecond))
}

// settleDiscovery waits until the host's tools have said which package repositories they use.
// Until then the first connection no rule decides waits for them, up to 5 s, before it is
// refused (daemon.settling); the tools run at the lowest CPU priority, so on a loaded host they
// can take longer than that. One such connection, with a long timeout, does the waiting here,
// so that the checks after it time refusals, not the host's tools.
func (g *gateEnv) settleDiscovery(t *testing.T) {
	t.Helper()
	p := g.probes(t, pr("tcp", "-timeout", "30s", evilIP+":2222"))
	if p[0].OK {
		t.Fatalf("a connection to the attacker's address went through: %v", p[0])
	}
	t.Logf("the first refusal, after the host's tools: %v", p[0])
}

func (g *gateEnv) daemonLog() string {
	b, _ := os.ReadFile(filepath.Join(g.state, "daemon.log"))
	return "daemon.log:\n" + gateTail(string(b), 30)
}

// hostLANAddr is the host's own address on its default-route interface: the gate runs in the
// host's namespace, so this is the "host's own LAN address" of threat model 19.
func hostLANAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() || inet.Prefix.Contains(p.Addr()) {
			continue
		}
		return p.Addr().String()
	}
	t.Fatal("the host has no IPv4 address besides loopback and the test internet's")
	return ""
}

// serve adds a server under role; watch marks it as one that must never be contacted.
func (g *gateEnv) serve(role string, s *inet.Server, watch bool) {
	g.srv[role] = s
	if watch {
		g.watched = append(g.watched, role)
	}
}

// startServers builds the test internet's contents: the allowed upstreams, the attacker, the
// internal targets, and the zone that names them.
func (g *gateEnv) startServers(t *testing.T) {
	t.Helper()
	n := g.net
	ca := []string{"allowed.test", "*.wild.test", "xn--bcher-kva.test", "live.test"}
	// Allowed upstreams: the tests read which of them answered from the body, which names the
	// server and the Host it was sent.
	g.serve("allowed:80", n.HTTP(t, allowedIP, 80, nil), false)
	g.serve("allowed:443", n.HTTPS(t, allowedIP, 443, ca, nil), false)
	g.serve("allowed:2222", n.TCP(t, allowedIP, 2222, sshBanner), false)
	g.serve("live:80", n.HTTP(t, liveIP, 80, nil), false)
	g.serve("live:2222", n.TCP(t, liveIP, 2222, liveBanner), false)
	g.serve("httpsonly:443", n.HTTPS(t, httpsOnlyIP, 443, []string{"httpsonly.test"}, nil), false)
	g.serve("port:2222", n.TCP(t, portIP, 2222, portBanner), false)
	g.serve("rebind:80", n.HTTP(t, rebindIP, 80, nil), false)
	g.serve("rebind:2222", n.TCP(t, rebindIP, 2222, rebindBanner), false)
	g.serve("doh:443", n.HTTPS(t, dohIP, 443, []string{"doh.test"}, dohHandler(evilIP)), false)
	g.serve("opened:80", n.HTTP(t, openedIP, 80, nil), false)

	// UDP of an allowed host: UDP is not forwarded at all, so these must hear nothing.
	g.serve("allowed:udp9999", n.UDP(t, allowedIP, 9999), true)
	g.serve("allowed:quic443", n.UDP(t, allowedIP, 443), true)
	// Ports and schemes of allowed names that their rules do not cover.
	g.serve("port:2223", n.TCP(t, portIP, 2223, portBanner), true)
	g.serve("port:80", n.HTTP(t, portIP, 80, nil), true)
	g.serve("httpsonly:80", n.HTTP(t, httpsOnlyIP, 80, nil), true)

	// The attacker. Its HTTPS certificate also covers allowed.test, so an allowed SNI that the
	// gate wrongly dialed here would complete its handshake: only the attacker's counters
	// tell.
	g.serve("evil:80", n.HTTP(t, evilIP, 80, nil), true)
	g.serve("evil:443", n.HTTPS(t, evilIP, 443, []string{"evil.test", "*.evil.test", "allowed.test"}, nil), true)
	g.serve("evil:2222", n.TCP(t, evilIP, 2222, evilBanner), true)
	g.serve("evil:8080", n.TCP(t, evilIP, 8080, evilBanner), true)
	g.serve("evil:853", n.TCP(t, evilIP, 853, ""), true)
	g.serve("evil:dns53", n.UDP(t, evilIP, 53), true)
	g.serve("evil:tcp53", n.TCP(t, evilIP, 53, ""), true)
	g.serve("evil:quic443", n.UDP(t, evilIP, 443), true)
	g.serve("evil:udp9999", n.UDP(t, evilIP, 9999), true)
	g.serve("evil:udp2222", n.UDP(t, evilIP, 2222), true)

	// Internal targets: each a real server, so a leak is counted, not just a timeout.
	for _, ip := range []string{lanIP, lan2IP, closedIP, cgnatIP, metadataIP, ecsIP, alibabaIP} {
		g.serve(ip+":80", n.HTTP(t, ip, 80, nil), true)
	}
	g.serve(lanIP+":2222", n.TCP(t, lanIP, 2222, evilBanner), true)

	z := func(name string, ips ...string) { n.SetA(name, ips...) }
	z("allowed.test", allowedIP)
	n.SetAAAA("allowed.test", "2001:db8::10")
	n.SetTXT("allowed.test", "v=would-carry-tunnelled-data")
	z("live.test", liveIP)
	z("a.wild.test", allowedIP)
	z("a.b.c.wild.test", allowedIP)
	z("xn--bcher-kva.test", allowedIP)
	z("httpsonly.test", httpsOnlyIP)
	z("port.test", portIP)
	z("rebind.test", rebindIP)
	z("doh.test", dohIP)
	z("meta.test", metadataIP)
	z("metadata.google.internal", metadataIP)
	z("lan.test", lanIP)
	z("cgnat.test", cgnatIP)
	z("loop.test", "127.0.0.1")
	z("hostself.test", inet.HostAddr.String())
	z("hostlan.test", g.hostIP)
	z("gw.test", gatewayIP)
	// Names the policy denies point at the attacker: if the gate ever resolved and dialed one
	// of them, the attacker would count it.
	for _, name := range []string{"evil.test", "x.evil.test", "wild.test", "blocked.wild.test", "xwild.test", "allowed.test.evil.test", homoglyph} {
		z(name, evilIP)
	}
	n.SetAAAA("evil.test", "2001:db8::66")
	n.SetTXT("evil.test", "attacker-controlled")
}

// homoglyph is allowed.test with a Cyrillic "а" (U+0430) for the first letter, in punycode
// (Python: "аllowed.test".encode("idna")).
const homoglyph = "xn--llowed-2nf.test"

// dohHandler answers DNS-over-HTTPS (RFC 8484, GET and POST) with answer for every A
// question: a resolver the guest may use only because the host it runs on is allowed.
func dohHandler(answer string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q []byte
		if r.Method == http.MethodPost {
			q, _ = io.ReadAll(io.LimitReader(r.Body, 65535))
		} else {
			q, _ = base64.RawURLEncoding.DecodeString(r.URL.Query().Get("dns"))
		}
		m := new(dns.Msg)
		if err := m.Unpack(q); err != nil {
			http.Error(w, "bad DNS message", http.StatusBadRequest)
			return
		}
		resp := new(dns.Msg)
		resp.SetReply(m)
		if len(m.Question) == 1 && m.Question[0].Qtype == dns.TypeA {
			resp.Answer = append(resp.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A:   net.ParseIP(answer),
			})
		}
		b, _ := resp.Pack()
		w.Header().Set("Content-Type", "application/dns-message")
		w.Write(b)
	})
}

// ---- the tests -----------------------------------------------------------------------------

// TestGate runs the gate's behaviour and threat model 1-22 (without TLS termination)
// against one sandbox whose policy is gateToml.
func TestGate(t *testing.T) {
	n := inet.Start(t)
	// Answers live one second upstream (the gate clamps to its 5 s minimum), so the rebinding
	// test sees the new address without waiting out a long TTL.
	n.SetTTL(1)
	g := newGateEnv(t, n, "gate-e2e", gateToml)
	g.startServers(t)
	g.up(t)
	g.settleDiscovery(t)

	for _, st := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"allowed_name", g.testAllowedName},
		{"denied_name_never_leaves", g.testDeniedName},
		{"live_rules", g.testLiveRules},
		{"attack01_no_route_but_the_gate", g.attack01},
		{"attack02_hardcoded_ip_resolve_raw_packet", g.attack02},
		{"attack03_udp_quic_public_dns_dot", g.attack03},
		{"attack04_icmp", g.attack04},
		{"attack05_ipv6", g.attack05},
		{"attack06_http_vs_https", g.attack06},
		{"attack07_relay_in_sandbox", g.attack07},
		{"attack08_unix_sockets", g.attack08},
		{"attack09_allowed_sni_to_attacker_ip", g.attack09},
		{"attack10_hosts_file_and_guest_resolver", g.attack10},
		{"attack11_fronting_without_termination", g.attack11},
		{"attack12_ech_no_sni_split_hello", g.attack12},
		{"attack13_odd_spellings", g.attack13},
		{"attack14_dns_exfiltration", g.attack14},
		{"attack15_dns_tunnel_types_long_names_flood", g.attack15},
		{"attack16_rebinding", g.attack16},
		{"attack17_doh_to_allowed_host", g.attack17},
		{"attack18_metadata", g.attack18},
		{"attack19_host_loopback_and_lan", g.attack19},
		{"attack20_private_cgnat_nat64", g.attack20},
		{"attack21_other_sandboxes", g.attack21},
		{"attack22_gate_to_itself", g.attack22},
	} {
		t.Run(st.name, func(t *testing.T) {
			g.noLeaks(t)
			st.f(t)
		})
	}
	// Across the whole test: the attacker's name never reached the upstream resolver.
	if k := n.Asked("evil.test"); k != 0 {
		t.Errorf("LEAK: the upstream DNS server was asked %d questions under evil.test", k)
	}
}

// An allowed name: curl gets the page; the audit line says allow, with the rule
// and the layer.
func (g *gateEnv) testAllowedName(t *testing.T) {
	m := g.mark(t)
	r := g.curls(t, []string{"http://allowed.test/"}, []string{"--cacert", g.ca, "https://allowed.test/"})
	curlReached(t, r[0], "inet http 198.51.100.10:80 allowed.test/")
	curlReached(t, r[1], "inet https 198.51.100.10:443 allowed.test/")
	for _, c := range []struct{ port, from string }{{"80", "host"}, {"443", "sni"}} {
		a, ok := g.expect(t, m, match{Proto: "tcp", Dst: "*:" + c.port, Name: "allowed.test", Verdict: "allow"})
		if !ok {
			continue
		}
		if a.Schema != 1 || a.Sandbox != g.name || a.Rule != "allowed.test" || a.Layer != "project" || a.NameFrom != c.from ||
			a.Upstream != allowedIP+":"+c.port || a.BytesDown == 0 || a.BytesUp == 0 || a.Time.IsZero() {
			t.Errorf("allow record for :%s: want schema 1, sandbox %s, rule allowed.test, layer project, name_from %s, upstream %s:%s, bytes both ways; got %v",
				c.port, g.name, c.from, allowedIP, c.port, a)
		}
	}
	if a, ok := g.expect(t, m, match{Proto: "dns", Name: "allowed.test", Verdict: "allow"}); ok && (a.Rule != "allowed.test" || a.Layer != "project") {
		t.Errorf("DNS allow record without its rule and layer: %v", a)
	}
	// The same decision through the command a person types.
	out := mustMoatEnv(t, g.dir, g.env, "network", "audit", g.name, "--json")
	found := false
	for _, l := range strings.Split(out, "\n") {
		var a auditRec
		if json.Unmarshal([]byte(l), &a) == nil && a.Verdict == "allow" && a.Name == "allowed.test" && a.Rule == "allowed.test" && a.Layer == "project" {
			found = true
		}
	}
	if !found {
		t.Errorf("moat network audit %s --json has no allow line for allowed.test:\n%s", g.name, gateTail(out, 20))
	}
}

// A denied name: a pool address, never asked upstream (the DNS exfiltration
// test), refused at once, and in the ledger as name:port.
func (g *gateEnv) testDeniedName(t *testing.T) {
	m := g.mark(t)
	s := g.script()
	pi := s.probes(
		pr("dns", "-timeout", probeDefault, gatewayIP+":53", "x.evil.test", "A"),
		pr("dns", "-tcp", "-timeout", probeDefault, gatewayIP+":53", "x.evil.test", "A"),
		pr("tcp", "-timeout", probeDefault, "x.evil.test:8080"),
	)
	ci := s.curl("http://x.evil.test:8080/")
	o := s.run(t)
	r := o.probes(t, pi)
	udpAddr, tcpAddr := answerA(r[0].Data), answerA(r[1].Data)
	if !r[0].OK || !inPool(udpAddr) {
		t.Errorf("lookup of a denied name over UDP: want an address in 198.18.0.0/15, got %v", r[0])
	}
	if !r[1].OK || tcpAddr != udpAddr {
		t.Errorf("lookup over TCP: want the same pool address %s, got %v", udpAddr, r[1])
	}
	refusedPromptly(t, "connecting to x.evil.test:8080", r[2])
	if !strings.Contains(r[2].Err, "refused") {
		t.Errorf("connecting to a denied name: want connection refused (a reset), got %v", r[2])
	}
	c := o.curl(t, ci)
	if c.exit != 7 {
		t.Errorf("curl to a denied name on a non-HTTP port: want exit 7 (could not connect), got %v", c)
	}
	curlDenied(t, c)
	if k := g.net.Asked("evil.test"); k != 0 {
		t.Errorf("LEAK: the upstream DNS server was asked %d questions under evil.test: %q", k, g.net.Queries())
	}
	g.denied(t, m, match{Proto: "dns", Name: "x.evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: udpAddr + ":8080", Name: "x.evil.test", NameFrom: "pool"})

	out := mustMoatEnv(t, g.dir, g.env, "network", "denials", g.name, "--json")
	if !strings.Contains(out, "x.evil.test:8080") || !strings.Contains(out, `"schema":1`) {
		t.Errorf("moat network denials %s --json does not show x.evil.test:8080 (schema 1):\n%s", g.name, out)
	}
	var st struct {
		Schema  int   `json:"schema"`
		Denials int64 `json:"denials"`
	}
	sj := mustMoatEnv(t, g.dir, g.env, "status", g.name, "--json")
	if err := json.Unmarshal([]byte(sj), &st); err != nil || st.Schema != 1 || st.Denials < 2 {
		t.Errorf("moat status %s --json: want schema 1 and denials >= 2, got %s (%v)", g.name, sj, err)
	}
}

// Live rule changes: allow makes the next connection succeed without restarting anything,
// remove makes the next one fail.
func (g *gateEnv) testLiveRules(t *testing.T) {
	pidBefore := g.daemonPID(t)
	m := g.mark(t)
	before := g.curls(t, []string{"http://live.test/"})[0]
	curlDenied(t, before)
	if before.status != "403" {
		t.Errorf("before the rule: want the gate's 403, got %v", before)
	}
	g.denied(t, m, match{Proto: "tcp", Name: "live.test"})

	g.liveWindow = [2]int{len(g.net.Queries()), 1 << 62}
	mustMoatEnv(t, g.dir, g.env, "network", "allow", g.name, "live.test")
	m = g.mark(t)
	s := g.script()
	ci := s.curl("http://live.test/")
	pi := s.probes(pr("tcp", "-read", "-timeout", "1s", "live.test:2222"))
	o := s.run(t)
	curlReached(t, o.curl(t, ci), "inet http 198.51.100.11:80 live.test/")
	p := o.probes(t, pi)
	if !p[0].OK || !strings.HasPrefix(p[0].Data, liveBanner) {
		t.Errorf("after allow, live.test:2222 (no sniffing, server speaks first): want its banner, got %v", p[0])
	}
	if a, ok := g.expect(t, m, match{Proto: "tcp", Name: "live.test", Verdict: "allow"}); ok && (a.Layer != "runtime" || a.Rule != "live.test") {
		t.Errorf("allowed by the runtime rule: want layer runtime, rule live.test; got %v", a)
	}
	list := mustMoatEnv(t, g.dir, g.env, "network", "list", g.name, "--json")
	if !strings.Contains(list, `"live.test"`) || !strings.Contains(list, `"runtime"`) {
		t.Errorf("moat network list --json after allow does not show live.test in the runtime layer:\n%s", list)
	}

	mustMoatEnv(t, g.dir, g.env, "network", "remove", g.name, "live.test")
	g.liveWindow[1] = len(g.net.Queries())
	liveHTTP, liveSSH := countsOf(g.srv["live:80"]), countsOf(g.srv["live:2222"])
	m = g.mark(t)
	s = g.script()
	ci = s.curl("http://live.test/")
	// The guest still knows live.test's real address from its last lookup: dialing it
	// directly must fail too, now that the name is no longer allowed.
	pi = s.probes(pr("tcp", "-read", "-timeout", "1s", "live.test:2222"), pr("tcp", "-read", "-timeout", "1s", liveIP+":2222"))
	o = s.run(t)
	curlDenied(t, o.curl(t, ci))
	p = o.probes(t, pi)
	refusedPromptly(t, "live.test:2222 after remove", p[0])
	refusedPromptly(t, liveIP+":2222 (its address, remembered) after remove", p[1])
	if countsOf(g.srv["live:80"]) != liveHTTP || countsOf(g.srv["live:2222"]) != liveSSH {
		t.Errorf("after remove, live.test's servers were still contacted")
	}
	g.denied(t, m, match{Proto: "tcp", Name: "live.test"})
	g.noAllow(t, m, match{Name: "live.test", Proto: "tcp"})
	if pid := g.daemonPID(t); pid != pidBefore {
		t.Errorf("the daemon was restarted by a rule change (pid %d → %d)", pidBefore, pid)
	}
}
