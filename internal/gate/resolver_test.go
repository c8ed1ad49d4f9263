package gate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fakeClock is the injected clock: tests move it by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// zoneEntry is how the test server answers one name.
type zoneEntry struct {
	rrs      []string      // zone-file lines; records of every type, filtered by the query type (CNAMEs always)
	rcode    int           // answer code (default NOERROR)
	soa      bool          // add an SOA to the authority section of a negative answer
	soaTTL   uint32        // that SOA's TTL and MINIMUM
	dropUDP  int           // drop the first n UDP queries for this name
	delay    time.Duration // wait before answering
	truncUDP bool          // answer UDP with TC and no records
	spoof    bool          // first send a reply with the wrong ID
}

// queryRecord is one query the test server received.
type queryRecord struct {
	Name string // lower case, no trailing dot
	Type string
	Net  string // "udp" or "tcp"
}

// testDNS is a local authoritative server on 127.0.0.1 (UDP and TCP on one
// port) that records every query it receives.
type testDNS struct {
	Addr netip.AddrPort

	mu      sync.Mutex
	zone    map[string]*zoneEntry // key: lower-case FQDN
	log     []queryRecord
	dropped map[string]int
}

func startZone(t testing.TB, zone map[string]*zoneEntry) *testDNS {
	t.Helper()
	s := &testDNS{zone: make(map[string]*zoneEntry), dropped: make(map[string]int)}
	for k, v := range zone {
		s.zone[dns.Fqdn(strings.ToLower(k))] = v
	}
	var (
		pc net.PacketConn
		l  net.Listener
	)
	for range 20 { // the TCP port must match the UDP one; retry on a clash
		p, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err = net.Listen("tcp", p.LocalAddr().String())
		if err == nil {
			pc = p
			break
		}
		p.Close()
	}
	if pc == nil {
		t.Fatal("no free UDP+TCP port pair on 127.0.0.1")
	}
	s.Addr = netip.MustParseAddrPort(pc.LocalAddr().String())
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: s}, {Listener: l, Handler: s}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			t.Fatal("test DNS server did not start")
		}
		t.Cleanup(func() { srv.Shutdown() })
	}
	return s
}

func (s *testDNS) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if len(r.Question) != 1 {
		return
	}
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	network := w.LocalAddr().Network()
	s.mu.Lock()
	s.log = append(s.log, queryRecord{Name: strings.TrimSuffix(name, "."), Type: typeName(q.Qtype), Net: network})
	e := s.zone[name]
	drop := false
	if e != nil && network == "udp" && s.dropped[name] < e.dropUDP {
		s.dropped[name]++
		drop = true
	}
	s.mu.Unlock()
	if drop {
		return
	}
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	if e == nil {
		m.Rcode = dns.RcodeNameError
		w.WriteMsg(m)
		return
	}
	if e.delay > 0 {
		time.Sleep(e.delay)
	}
	m.Rcode = e.rcode
	for _, line := range e.rrs {
		rr, err := dns.NewRR(line)
		if err != nil {
			panic(err)
		}
		if t := rr.Header().Rrtype; t == q.Qtype || t == dns.TypeCNAME {
			m.Answer = append(m.Answer, rr)
		}
	}
	if e.soa {
		m.Ns = append(m.Ns, &dns.SOA{
			Hdr: dns.RR_Header{Name: "example.test.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: e.soaTTL},
			Ns:  "ns.example.test.", Mbox: "hostmaster.example.test.", Serial: 1,
			Refresh: 3600, Retry: 600, Expire: 86400, Minttl: e.soaTTL,
		})
	}
	if network == "udp" {
		if e.truncUDP {
			m.Answer, m.Truncated = nil, true
		}
		size := dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
		m.Truncate(size)
	}
	if e.spoof {
		bad := m.Copy()
		bad.Id ^= 0x5555
		w.WriteMsg(bad)
	}
	w.WriteMsg(m)
}

// queries returns what the server received so far.
func (s *testDNS) queries() []queryRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

func (s *testDNS) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.log)
}

// since returns the queries received after the first n.
func (s *testDNS) since(n int) []queryRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log[n:])
}

// blackHole is a UDP socket on 127.0.0.1 that reads queries and never
// answers: a resolver that lost every packet.
func blackHole(t testing.TB) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestResolverLookupA(t *testing.T) {
	srv := startZone(t, map[string]*zoneEntry{
		"a.example.test":        {rrs: []string{"a.example.test. 60 IN A 192.0.2.1", "a.example.test. 60 IN A 192.0.2.2"}},
		"cname.example.test":    {rrs: []string{"cname.example.test. 30 IN CNAME b.example.test.", "b.example.test. 120 IN A 192.0.2.3"}},
		"out.example.test":      {rrs: []string{"out.example.test. 30 IN CNAME elsewhere.example.test."}, soa: true, soaTTL: 10},
		"offchain.example.test": {rrs: []string{"intruder.example.test. 60 IN A 192.0.2.66", "offchain.example.test. 60 IN A 192.0.2.4"}},
		"loop.example.test":     {rrs: []string{"loop.example.test. 60 IN CNAME loop.example.test."}},
		"nx.example.test":       {rcode: dns.RcodeNameError, soa: true, soaTTL: 10},
		"nodata.example.test":   {rrs: []string{"nodata.example.test. 60 IN AAAA 2001:db8::1"}, soa: true, soaTTL: 10},
		"servfail.example.test": {rcode: dns.RcodeServerFailure},
		"dup.example.test":      {rrs: []string{"dup.example.test. 60 IN A 192.0.2.5", "dup.example.test. 60 IN A 192.0.2.5"}},
		"pooled.example.test":   {rrs: []string{"pooled.example.test. 60 IN A 198.18.0.1", "pooled.example.test. 60 IN A 192.0.2.6"}},
		"onlypool.example.test": {rrs: []string{"onlypool.example.test. 60 IN A 198.19.1.1"}},
	})
	tests := []struct {
		name     string
		want     []netip.Addr
		wantTTL  time.Duration
		wantErr  error
		upstream bool // a query reaches the server
	}{
		{"a.example.test", addrs("192.0.2.1", "192.0.2.2"), 60 * time.Second, nil, true},
		{"A.Example.TEST.", addrs("192.0.2.1", "192.0.2.2"), 60 * time.Second, nil, false}, // cached under the normalized name
		{"cname.example.test", addrs("192.0.2.3"), 30 * time.Second, nil, true},
		{"out.example.test", nil, 10 * time.Second, ErrNoAddress, true},
		{"offchain.example.test", addrs("192.0.2.4"), 60 * time.Second, nil, true},
		{"loop.example.test", nil, minNegTTL, ErrNoAddress, true},
		{"nx.example.test", nil, 10 * time.Second, ErrNoSuchHost, true},
		{"nodata.example.test", nil, 10 * time.Second, ErrNoAddress, true},
		{"servfail.example.test", nil, 0, ErrServerFailure, true},
		{"dup.example.test", addrs("192.0.2.5"), 60 * time.Second, nil, true},
		{"pooled.example.test", addrs("192.0.2.6"), 60 * time.Second, nil, true},
		{"onlypool.example.test", nil, minNegTTL, ErrNoAddress, true},
		{"bad..example.test", nil, 0, ErrInvalidName, false},
		{strings.Repeat("a", 64) + ".example.test", nil, 0, ErrInvalidName, false},
	}
	clock := newFakeClock()
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{srv.Addr}, Now: clock.Now, RetryAfter: 50 * time.Millisecond, Timeout: time.Second})
	defer r.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(srv.queries())
			got, ttl, err := r.LookupA(context.Background(), tt.name)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("LookupA err = %v, want %v", err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("LookupA = %v, want %v", got, tt.want)
			}
			if ttl != tt.wantTTL {
				t.Errorf("ttl = %v, want %v", ttl, tt.wantTTL)
			}
			if gotUp := len(srv.queries()) > before; gotUp != tt.upstream {
				t.Errorf("sent upstream = %v, want %v", gotUp, tt.upstream)
			}
		})
	}
}

func TestResolverTTLClamp(t *testing.T) {
	tests := []struct {
		name     string
		entry    *zoneEntry
		wantTTL  time.Duration
		negative bool
	}{
		{"zero", &zoneEntry{rrs: []string{"x.example.test. 0 IN A 192.0.2.1"}}, minTTL, false},
		{"one", &zoneEntry{rrs: []string{"x.example.test. 1 IN A 192.0.2.1"}}, minTTL, false},
		{"minute", &zoneEntry{rrs: []string{"x.example.test. 60 IN A 192.0.2.1"}}, 60 * time.Second, false},
		{"day", &zoneEntry{rrs: []string{"x.example.test. 86400 IN A 192.0.2.1"}}, maxTTL, false},
		{"nx short", &zoneEntry{rcode: dns.RcodeNameError, soa: true, soaTTL: 1}, minNegTTL, true},
		{"nx long", &zoneEntry{rcode: dns.RcodeNameError, soa: true, soaTTL: 3600}, maxNegTTL, true},
		{"nx no soa", &zoneEntry{rcode: dns.RcodeNameError}, minNegTTL, true},
		{"nodata long", &zoneEntry{soa: true, soaTTL: 3600}, maxNegTTL, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startZone(t, map[string]*zoneEntry{"x.example.test": tt.entry})
			clock := newFakeClock()
			r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{srv.Addr}, Now: clock.Now})
			defer r.Close()
			_, ttl, err := r.LookupA(context.Background(), "x.example.test")
			if (err != nil) != tt.negative {
				t.Fatalf("LookupA err = %v, negative answer wanted: %v", err, tt.negative)
			}
			if ttl != tt.wantTTL {
				t.Errorf("ttl = %v, want %v", ttl, tt.wantTTL)
			}
			// Cached until the clamped TTL runs out, and no longer.
			clock.Advance(tt.wantTTL - time.Second)
			_, ttl, _ = r.LookupA(context.Background(), "x.example.test")
			if got := len(srv.queries()); got != 1 {
				t.Errorf("upstream queries before expiry = %d, want 1", got)
			}
			if ttl != time.Second {
				t.Errorf("remaining ttl = %v, want 1s", ttl)
			}
			clock.Advance(time.Second)
			r.LookupA(context.Background(), "x.example.test")
			if got := len(srv.queries()); got != 2 {
				t.Errorf("upstream queries after expiry = %d, want 2", got)
			}
		})
	}
}

func TestResolverRetriesDroppedQuery(t *testing.T) {
	srv := startZone(t, map[string]*zoneEntry{
		"drop.example.test": {rrs: []string{"drop.example.test. 60 IN A 192.0.2.7"}, dropUDP: 1},
	})
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{srv.Addr}})
	defer r.Close()
	start := time.Now()
	got, _, err := r.LookupA(context.Background(), "drop.example.test")
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("LookupA: %v", err)
	}
	if want := addrs("192.0.2.7"); !slices.Equal(got, want) {
		t.Errorf("LookupA = %v, want %v", got, want)
	}
	if n := len(srv.queries()); n != 2 {
		t.Errorf("upstream queries = %d, want 2 (one dropped, one retried)", n)
	}
	// The retry goes out after the default 250 ms, not after seconds.
	if elapsed < 200*time.Millisecond || elapsed > time.Second {
		t.Errorf("lookup took %v, want about 250ms", elapsed)
	}
}

func TestResolverRetryGoesToNextServer(t *testing.T) {
	srv := startZone(t, map[string]*zoneEntry{
		"next.example.test": {rrs: []string{"next.example.test. 60 IN A 192.0.2.8"}},
	})
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{blackHole(t), srv.Addr}})
	defer r.Close()
	got, _, err := r.LookupA(context.Background(), "next.example.test")
	if err != nil {
		t.Fatalf("LookupA: %v", err)
	}
	if want := addrs("192.0.2.8"); !slices.Equal(got, want) {
		t.Errorf("LookupA = %v, want %v", got, want)
	}
}

func TestResolverFailedServerMovesOnAtOnce(t *testing.T) {
	// A port with nothing listening: the kernel's ICMP port-unreachable
	// fails the read at once.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := netip.MustParseAddrPort(pc.LocalAddr().String())
	pc.Close()
	failing := startZone(t, map[string]*zoneEntry{"x.example.test": {rcode: dns.RcodeServerFailure}})
	refusing := startZone(t, map[string]*zoneEntry{"x.example.test": {rcode: dns.RcodeRefused}})
	tests := []struct {
		name  string
		first netip.AddrPort
	}{
		{"port unreachable", closed},
		{"SERVFAIL", failing.Addr},
		{"REFUSED", refusing.Addr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			good := startZone(t, map[string]*zoneEntry{"x.example.test": {rrs: []string{"x.example.test. 60 IN A 192.0.2.9"}}})
			// A long retry interval: only moving on at once can be fast.
			r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{tt.first, good.Addr}, RetryAfter: 2 * time.Second, Timeout: 3 * time.Second})
			defer r.Close()
			start := time.Now()
			got, _, err := r.LookupA(context.Background(), "x.example.test")
			if err != nil {
				t.Fatalf("LookupA: %v", err)
			}
			if want := addrs("192.0.2.9"); !slices.Equal(got, want) {
				t.Errorf("LookupA = %v, want %v", got, want)
			}
			if elapsed := time.Since(start); elapsed > time.Second {
				t.Errorf("lookup took %v; a failed server should move on at once", elapsed)
			}
		})
	}
	// Every server failed: the lookup fails, having asked each once.
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{failing.Addr, refusing.Addr}, RetryAfter: 2 * time.Second})
	defer r.Close()
	before := len(failing.queries()) + len(refusing.queries())
	if _, _, err := r.LookupA(context.Background(), "x.example.test"); !errors.Is(err, ErrServerFailure) {
		t.Errorf("all servers failing: err = %v, want ErrServerFailure", err)
	}
	if n := len(failing.queries()) + len(refusing.queries()) - before; n != 2 {
		t.Errorf("queries = %d, want 2 (one per server)", n)
	}
}

func TestResolverTruncatedFallsBackToTCP(t *testing.T) {
	srv := startZone(t, map[string]*zoneEntry{
		"tc.example.test": {rrs: []string{"tc.example.test. 60 IN A 192.0.2.11", "tc.example.test. 60 IN A 192.0.2.12"}, truncUDP: true},
	})
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{srv.Addr}})
	defer r.Close()
	got, _, err := r.LookupA(context.Background(), "tc.example.test")
	if err != nil {
		t.Fatalf("LookupA: %v", err)
	}
	if want := addrs("192.0.2.11", "192.0.2.12"); !slices.Equal(got, want) {
		t.Errorf("LookupA = %v, want %v", got, want)
	}
	want := []queryRecord{{"tc.example.test", "A", "udp"}, {"tc.example.test", "A", "tcp"}}
	if got := srv.queries(); !slices.Equal(got, want) {
		t.Errorf("upstream queries = %v, want %v", got, want)
	}
}

func TestResolverSkipsReplyWithWrongID(t *testing.T) {
	srv := startZone(t, map[string]*zoneEntry{
		"spoof.example.test": {rrs: []string{"spoof.example.test. 60 IN A 192.0.2.13"}, spoof: true},
	})
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{srv.Addr}})
	defer r.Close()
	got, _, err := r.LookupA(context.Background(), "spoof.example.test")
	if err != nil {
		t.Fatalf("LookupA: %v", err)
	}
	if want := addrs("192.0.2.13"); !slices.Equal(got, want) {
		t.Errorf("LookupA = %v, want %v", got, want)
	}
	if n := len(srv.queries()); n != 1 {
		t.Errorf("upstream queries = %d, want 1 (the forged reply must not cause a retry)", n)
	}
}

func TestResolverCoalesces(t *testing.T) {
	srv := startZone(t, map[string]*zoneEntry{
		"slow.example.test": {rrs: []string{"slow.example.test. 60 IN A 192.0.2.14"}, delay: 200 * time.Millisecond},
	})
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{srv.Addr}, RetryAfter: 2 * time.Second})
	defer r.Close()
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "slow.example.test"
			if i%2 == 1 {
				name = "SLOW.example.test." // the same name, spelt another way
			}
			got, _, err := r.LookupA(context.Background(), name)
			if err == nil && !slices.Equal(got, addrs("192.0.2.14")) {
				err = errors.New("wrong answer " + net.IP(got[0].AsSlice()).String())
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := len(srv.queries()); got != 1 {
		t.Errorf("upstream queries = %d, want 1", got)
	}
}

func TestResolverBusy(t *testing.T) {
	srv := startZone(t, map[string]*zoneEntry{
		"slow.example.test":  {rrs: []string{"slow.example.test. 60 IN A 192.0.2.15"}, delay: 500 * time.Millisecond},
		"other.example.test": {rrs: []string{"other.example.test. 60 IN A 192.0.2.16"}},
	})
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{srv.Addr}, MaxInFlight: 1, RetryAfter: 2 * time.Second})
	defer r.Close()
	done := make(chan error, 1)
	go func() {
		_, _, err := r.LookupA(context.Background(), "slow.example.test")
		done <- err
	}()
	deadline := time.Now().Add(2 * time.Second)
	for len(srv.queries()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	_, _, err := r.LookupA(context.Background(), "other.example.test")
	if !errors.Is(err, ErrBusy) {
		t.Errorf("second lookup err = %v, want ErrBusy", err)
	}
	if err := <-done; err != nil {
		t.Errorf("first lookup: %v", err)
	}
	for _, q := range srv.queries() {
		if q.Name == "other.example.test" {
			t.Errorf("a lookup refused as busy reached upstream: %v", q)
		}
	}
	// The slot is free again.
	if _, _, err := r.LookupA(context.Background(), "other.example.test"); err != nil {
		t.Errorf("lookup after the slot freed: %v", err)
	}
}

func TestResolverTimeout(t *testing.T) {
	hole := blackHole(t)
	tests := []struct {
		name    string
		timeout time.Duration
		ctx     time.Duration
		wantErr error
	}{
		{"resolver timeout", 300 * time.Millisecond, 5 * time.Second, ErrServerFailure},
		{"caller deadline", 5 * time.Second, 100 * time.Millisecond, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{hole}, Timeout: tt.timeout, RetryAfter: 50 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), tt.ctx)
			defer cancel()
			start := time.Now()
			_, _, err := r.LookupA(ctx, "hole.example.test")
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
			if elapsed, bound := time.Since(start), min(tt.timeout, tt.ctx)+500*time.Millisecond; elapsed > bound {
				t.Errorf("lookup took %v, want under %v", elapsed, bound)
			}
			r.Close() // waits for the abandoned flight
			if _, _, err := r.LookupA(context.Background(), "hole.example.test"); !errors.Is(err, ErrClosed) {
				t.Errorf("lookup after Close: err = %v, want ErrClosed", err)
			}
		})
	}
}

func TestResolverCacheBounded(t *testing.T) {
	srv := startZone(t, nil) // every name is NXDOMAIN, cached 5 s
	clock := newFakeClock()
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{srv.Addr}, Now: clock.Now})
	defer r.Close()
	r.maxCache = 20
	for i := range 50 {
		r.LookupA(context.Background(), fmt.Sprintf("n%d.example.test", i))
		r.mu.Lock()
		n := len(r.cache)
		r.mu.Unlock()
		if n > r.maxCache {
			t.Fatalf("after %d lookups the cache holds %d entries, cap %d", i+1, n, r.maxCache)
		}
	}
}

func TestResolverNoServers(t *testing.T) {
	r := NewResolver(ResolverOptions{})
	defer r.Close()
	if _, _, err := r.LookupA(context.Background(), "a.example.test"); !errors.Is(err, ErrServerFailure) {
		t.Errorf("err = %v, want ErrServerFailure", err)
	}
}

func TestServersFromResolvConf(t *testing.T) {
	tests := []struct {
		name    string
		conf    string
		want    []string
		wantErr bool
	}{
		{"one", "nameserver 127.0.0.53\noptions edns0\n", []string{"127.0.0.53:53"}, false},
		{"several", "# comment\nsearch example.test\nnameserver 192.0.2.1\nnameserver  2001:db8::1\nnameserver 192.0.2.2\n", []string{"192.0.2.1:53", "[2001:db8::1]:53", "192.0.2.2:53"}, false},
		{"zone", "nameserver fe80::1%eth0\n", []string{"[fe80::1%eth0]:53"}, false},
		{"junk skipped", "nameserver not-an-ip\nnameserver 192.0.2.3\n", []string{"192.0.2.3:53"}, false},
		{"none", "search example.test\n", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "resolv.conf")
			if err := os.WriteFile(path, []byte(tt.conf), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := ServersFromResolvConf(path)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error: %v", err, tt.wantErr)
			}
			var gotS []string
			for _, a := range got {
				gotS = append(gotS, a.String())
			}
			if !slices.Equal(gotS, tt.want) {
				t.Errorf("servers = %v, want %v", gotS, tt.want)
			}
		})
	}
	if _, err := ServersFromResolvConf(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing file: no error")
	}
}
