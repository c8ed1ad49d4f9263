package gate

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"moat.dev/moat/internal/audit"
)

// allowList is a NameDecider over a fixed set of names.
func allowList(names ...string) NameDecider {
	return func(name string) (bool, string, string) {
		if slices.Contains(names, name) {
			return true, name, "test"
		}
		return false, "", ""
	}
}

// auditLog collects DNSAudit events.
type auditLog struct {
	mu     sync.Mutex
	events []DNSEvent
	keep   bool // false: count only (fuzzing)
	n      int
}

func (a *auditLog) record(e DNSEvent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	if a.keep {
		a.events = append(a.events, e)
	}
}

func (a *auditLog) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

func (a *auditLog) all() []DNSEvent {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.events)
}

// dnsFixture is a DNSServer wired to a local upstream.
type dnsFixture struct {
	srv      *DNSServer
	upstream *testDNS
	clock    *fakeClock
	binds    *Bindings
	pool     *Pool
	audit    *auditLog
	resolver *Resolver
}

func bigZone(n int) []string {
	var rrs []string
	for i := range n {
		rrs = append(rrs, fmt.Sprintf("big.example.test. 60 IN A 192.0.2.%d", i+1))
	}
	return rrs
}

func newDNSFixture(t testing.TB, allowed ...string) *dnsFixture {
	t.Helper()
	up := startZone(t, map[string]*zoneEntry{
		"allowed.example.test": {rrs: []string{
			"allowed.example.test. 60 IN A 192.0.2.10",
			"allowed.example.test. 60 IN AAAA 2001:db8::10",
			"allowed.example.test. 60 IN TXT \"upstream text\"",
		}},
		"longttl.example.test": {rrs: []string{"longttl.example.test. 86400 IN A 192.0.2.11"}},
		"cname.example.test":   {rrs: []string{"cname.example.test. 60 IN CNAME target.example.test.", "target.example.test. 60 IN A 192.0.2.12"}},
		"nx.example.test":      {rcode: dns.RcodeNameError, soa: true, soaTTL: 10},
		"nodata.example.test":  {soa: true, soaTTL: 10},
		"broken.example.test":  {rcode: dns.RcodeServerFailure},
		"big.example.test":     {rrs: bigZone(100)},
		"slow1.example.test":   {rrs: []string{"slow1.example.test. 60 IN A 192.0.2.21"}, delay: 200 * time.Millisecond},
		"slow2.example.test":   {rrs: []string{"slow2.example.test. 60 IN A 192.0.2.22"}, delay: 200 * time.Millisecond},
		"slow3.example.test":   {rrs: []string{"slow3.example.test. 60 IN A 192.0.2.23"}, delay: 200 * time.Millisecond},
		"slow4.example.test":   {rrs: []string{"slow4.example.test. 60 IN A 192.0.2.24"}, delay: 200 * time.Millisecond},
		// Present upstream but denied by the policy: a leak would be answered.
		"denied.example.test": {rrs: []string{"denied.example.test. 60 IN A 192.0.2.99"}},
	})
	if len(allowed) == 0 {
		allowed = []string{"allowed.example.test", "longttl.example.test", "cname.example.test", "nx.example.test",
			"nodata.example.test", "broken.example.test", "big.example.test",
			"slow1.example.test", "slow2.example.test", "slow3.example.test", "slow4.example.test"}
	}
	clock := newFakeClock()
	f := &dnsFixture{upstream: up, clock: clock, binds: NewBindings(clock.Now), pool: NewPool(clock.Now), audit: &auditLog{keep: true}}
	f.resolver = NewResolver(ResolverOptions{Servers: []netip.AddrPort{up.Addr}, Now: clock.Now, RetryAfter: 150 * time.Millisecond, Timeout: time.Second, MaxInFlight: 2})
	t.Cleanup(f.resolver.Close)
	f.srv = NewDNSServer(DNSOptions{Decide: allowList(allowed...), Resolver: f.resolver, Pool: f.pool, Bindings: f.binds, Audit: f.audit.record, Now: clock.Now})
	return f
}

// query packs a query for name and qtype; mods adjust it first.
func query(t testing.TB, name string, qtype uint16, mods ...func(*dns.Msg)) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	for _, mod := range mods {
		mod(m)
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatalf("packing query %s: %v", name, err)
	}
	return b
}

func withEDNS(size uint16) func(*dns.Msg) { return func(m *dns.Msg) { m.SetEdns0(size, false) } }

func unpack(t testing.TB, b []byte) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatalf("unpacking answer: %v", err)
	}
	return m
}

func answerAddrs(m *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A)
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// rawQuery builds a query by hand, for names miekg/dns refuses to pack.
func rawQuery(id uint16, labels []string, qtype, qclass uint16) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, 0x01, 0x00)             // RD
	b = append(b, 0, 1, 0, 0, 0, 0, 0, 0) // one question
	for _, l := range labels {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	b = append(b, 0)
	b = binary.BigEndian.AppendUint16(b, qtype)
	return binary.BigEndian.AppendUint16(b, qclass)
}

func TestDNSAnswers(t *testing.T) {
	f := newDNSFixture(t)
	tests := []struct {
		name      string
		query     []byte
		tcp       bool
		wantRcode int
		wantAddrs []netip.Addr // nil: none; pool answers are checked by wantPool
		wantPool  bool
		wantTTL   uint32 // 0: not checked
		wantUp    []string
		verdict   audit.Verdict
	}{
		{"allowed A", query(t, "allowed.example.test", dns.TypeA), false, dns.RcodeSuccess, addrs("192.0.2.10"), false, 60, []string{"allowed.example.test"}, "allow"},
		{"allowed A cached", query(t, "Allowed.Example.Test", dns.TypeA), false, dns.RcodeSuccess, addrs("192.0.2.10"), false, 60, nil, "allow"},
		{"allowed A over TCP", query(t, "allowed.example.test", dns.TypeA), true, dns.RcodeSuccess, addrs("192.0.2.10"), false, 60, nil, "allow"},
		{"long upstream TTL is capped", query(t, "longttl.example.test", dns.TypeA), false, dns.RcodeSuccess, addrs("192.0.2.11"), false, uint32(maxTTL / time.Second), []string{"longttl.example.test"}, "allow"},
		{"CNAME chain", query(t, "cname.example.test", dns.TypeA), false, dns.RcodeSuccess, addrs("192.0.2.12"), false, 60, []string{"cname.example.test"}, "allow"},
		{"allowed NXDOMAIN", query(t, "nx.example.test", dns.TypeA), false, dns.RcodeNameError, nil, false, 0, []string{"nx.example.test"}, "allow"},
		{"allowed NODATA", query(t, "nodata.example.test", dns.TypeA), false, dns.RcodeSuccess, nil, false, 0, []string{"nodata.example.test"}, "allow"},
		{"upstream SERVFAIL", query(t, "broken.example.test", dns.TypeA), false, dns.RcodeServerFailure, nil, false, 0, []string{"broken.example.test"}, "allow"},
		{"allowed AAAA is empty", query(t, "allowed.example.test", dns.TypeAAAA), false, dns.RcodeSuccess, nil, false, 0, nil, "allow"},
		{"allowed TXT is empty", query(t, "allowed.example.test", dns.TypeTXT), false, dns.RcodeSuccess, nil, false, 0, nil, "allow"},
		{"allowed HTTPS is empty", query(t, "allowed.example.test", dns.TypeHTTPS), false, dns.RcodeSuccess, nil, false, 0, nil, "allow"},
		{"denied A from the pool", query(t, "denied.example.test", dns.TypeA), false, dns.RcodeSuccess, nil, true, uint32(poolTTL / time.Second), nil, "deny"},
		{"denied AAAA is empty", query(t, "denied.example.test", dns.TypeAAAA), false, dns.RcodeSuccess, nil, false, 0, nil, "deny"},
		{"denied TXT is empty", query(t, "denied.example.test", dns.TypeTXT), false, dns.RcodeSuccess, nil, false, 0, nil, "deny"},
		{"denied ANY is empty", query(t, "denied.example.test", dns.TypeANY), false, dns.RcodeSuccess, nil, false, 0, nil, "deny"},
		{"denied MX is empty", query(t, "denied.example.test", dns.TypeMX), false, dns.RcodeSuccess, nil, false, 0, nil, "deny"},
		{"denied AXFR is refused", query(t, "denied.example.test", dns.TypeAXFR), true, dns.RcodeRefused, nil, false, 0, nil, "deny"},
		{"class CH is refused", query(t, "version.bind", dns.TypeTXT, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }), false, dns.RcodeRefused, nil, false, 0, nil, "deny"},
		{"opcode STATUS", query(t, "allowed.example.test", dns.TypeA, func(m *dns.Msg) { m.Opcode = dns.OpcodeStatus }), false, dns.RcodeNotImplemented, nil, false, 0, nil, "deny"},
		{"two questions", query(t, "allowed.example.test", dns.TypeA, func(m *dns.Msg) {
			m.Question = append(m.Question, dns.Question{Name: "denied.example.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
		}), false, dns.RcodeFormatError, nil, false, 0, nil, "deny"},
		{"no question", query(t, "allowed.example.test", dns.TypeA, func(m *dns.Msg) { m.Question = nil }), false, dns.RcodeFormatError, nil, false, 0, nil, "deny"},
		{"root name", query(t, ".", dns.TypeNS), false, dns.RcodeFormatError, nil, false, 0, nil, "deny"},
		{"numeric last label", query(t, "1.2.3.4", dns.TypeA), false, dns.RcodeFormatError, nil, false, 0, nil, "deny"},
		{"EDNS version 1", query(t, "allowed.example.test", dns.TypeA, withEDNS(1232), func(m *dns.Msg) { m.IsEdns0().SetVersion(1) }), false, dns.RcodeBadVers, nil, false, 0, nil, "deny"},
		{"two OPT records", query(t, "allowed.example.test", dns.TypeA, withEDNS(1232), withEDNS(1232)), false, dns.RcodeFormatError, nil, false, 0, nil, "deny"},
		{"label of 63", rawQuery(7, []string{strings.Repeat("a", 63), "example", "test"}, dns.TypeA, dns.ClassINET), false, dns.RcodeSuccess, nil, true, 0, nil, "deny"},
		{"label of 64", rawQuery(7, []string{strings.Repeat("a", 64), "example", "test"}, dns.TypeA, dns.ClassINET), false, dns.RcodeFormatError, nil, false, 0, nil, "deny"},
		{"name of 253", rawQuery(7, []string{strings.Repeat("a", 63), strings.Repeat("b", 63), strings.Repeat("c", 63), strings.Repeat("d", 61)}, dns.TypeA, dns.ClassINET), false, dns.RcodeSuccess, nil, true, 0, nil, "deny"},
		{"name of 254", rawQuery(7, []string{strings.Repeat("a", 63), strings.Repeat("b", 63), strings.Repeat("c", 63), strings.Repeat("d", 62)}, dns.TypeA, dns.ClassINET), false, dns.RcodeFormatError, nil, false, 0, nil, "deny"},
		{"raw non-ASCII", rawQuery(7, []string{"b\xc3\xbccher", "example", "test"}, dns.TypeA, dns.ClassINET), false, dns.RcodeFormatError, nil, false, 0, nil, "deny"},
		{"dot inside a label", rawQuery(7, []string{"allowed.example", "test"}, dns.TypeA, dns.ClassINET), false, dns.RcodeFormatError, nil, false, 0, nil, "deny"},
		{"punycode label", rawQuery(7, []string{"xn--bcher-kva", "example", "test"}, dns.TypeA, dns.ClassINET), false, dns.RcodeSuccess, nil, true, 0, nil, "deny"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(f.upstream.queries())
			nAudit := len(f.audit.all())
			wire := f.srv.Handle(context.Background(), tt.query, tt.tcp)
			if wire == nil {
				t.Fatal("Handle dropped the query")
			}
			m := unpack(t, wire)
			if m.Rcode != tt.wantRcode {
				t.Errorf("rcode = %s, want %s", rcodeName(m.Rcode), rcodeName(tt.wantRcode))
			}
			if !m.Response || m.Id != binary.BigEndian.Uint16(tt.query) {
				t.Errorf("answer header: response %v, id %d; want a response with id %d", m.Response, m.Id, binary.BigEndian.Uint16(tt.query))
			}
			got := answerAddrs(m)
			if tt.wantPool {
				if len(got) != 1 || !InPool(got[0]) {
					t.Errorf("answers = %v, want one pool address", got)
				}
			} else if !slices.Equal(got, tt.wantAddrs) {
				t.Errorf("answers = %v, want %v", got, tt.wantAddrs)
			}
			if len(m.Answer) != len(got) {
				t.Errorf("answer section has %d records, %d of them A: %v", len(m.Answer), len(got), m.Answer)
			}
			if tt.wantTTL != 0 {
				for _, rr := range m.Answer {
					if rr.Header().Ttl != tt.wantTTL {
						t.Errorf("TTL = %d, want %d", rr.Header().Ttl, tt.wantTTL)
					}
				}
			}
			var up []string
			for _, q := range f.upstream.queries()[before:] {
				up = append(up, q.Name)
			}
			if !slices.Equal(up, tt.wantUp) {
				t.Errorf("upstream queries = %v, want %v", up, tt.wantUp)
			}
			evs := f.audit.all()[nAudit:]
			if len(evs) != 1 {
				t.Fatalf("audit events = %d, want 1", len(evs))
			}
			ev := evs[0]
			if ev.Verdict != tt.verdict || ev.Pool != tt.wantPool || ev.Rcode != rcodeName(tt.wantRcode) {
				t.Errorf("audit event = %+v, want verdict %s, pool %v, rcode %s", ev, tt.verdict, tt.wantPool, rcodeName(tt.wantRcode))
			}
			if !slices.Equal(ev.Answers, got) {
				t.Errorf("audit answers = %v, want %v", ev.Answers, got)
			}
		})
	}
}

// TestDNSDeniedNeverUpstream is the property the gate exists for: a name
// the policy does not allow is never sent to the host's resolver, whatever
// the type and transport.
func TestDNSDeniedNeverUpstream(t *testing.T) {
	f := newDNSFixture(t)
	names := []string{
		"denied.example.test",
		"c2VjcmV0IGRhdGE.exfil.example.test",
		"sub.allowed.example.test", // a subdomain of an allowed name is another name
		"allowed.example.test.evil.example.test",
		"xn--bcher-kva.example.test",
	}
	types := []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT, dns.TypeANY, dns.TypeNULL, dns.TypeMX,
		dns.TypeSRV, dns.TypeCNAME, dns.TypeNS, dns.TypeSOA, dns.TypeHTTPS, dns.TypeSVCB, dns.TypePTR, dns.TypeCAA, 65280}
	for _, name := range names {
		for _, qt := range types {
			for _, tcp := range []bool{false, true} {
				for _, mod := range []func(*dns.Msg){func(*dns.Msg) {}, withEDNS(4096)} {
					wire := f.srv.Handle(context.Background(), query(t, name, qt, mod), tcp)
					if wire == nil {
						t.Fatalf("%s %s: dropped", name, typeName(qt))
					}
					m := unpack(t, wire)
					if qt == dns.TypeA {
						if got := answerAddrs(m); len(got) != 1 || !InPool(got[0]) {
							t.Errorf("%s A: answers %v, want one pool address", name, got)
						}
					} else if len(m.Answer) != 0 {
						t.Errorf("%s %s: answers %v, want none", name, typeName(qt), m.Answer)
					}
				}
			}
		}
	}
	if q := f.upstream.queries(); len(q) != 0 {
		t.Errorf("denied names reached upstream: %v", q)
	}
	// The same denied name gets the same pool address each time.
	a1 := answerAddrs(unpack(t, f.srv.Handle(context.Background(), query(t, "denied.example.test", dns.TypeA), false)))
	a2 := answerAddrs(unpack(t, f.srv.Handle(context.Background(), query(t, "DENIED.example.test", dns.TypeA), false)))
	if !slices.Equal(a1, a2) {
		t.Errorf("pool answers differ: %v, %v", a1, a2)
	}
}

func TestDNSBindsAnswers(t *testing.T) {
	f := newDNSFixture(t)
	tests := []struct {
		name string
		ip   netip.Addr
	}{
		{"allowed.example.test", netip.MustParseAddr("192.0.2.10")},
		{"longttl.example.test", netip.MustParseAddr("192.0.2.11")},
	}
	for _, tt := range tests {
		m := unpack(t, f.srv.Handle(context.Background(), query(t, tt.name, dns.TypeA), false))
		if len(m.Answer) != 1 {
			t.Fatalf("%s: answers %v", tt.name, m.Answer)
		}
		ttl := time.Duration(m.Answer[0].Header().Ttl) * time.Second
		got := f.binds.Names(tt.ip)
		if len(got) != 1 || got[0].Name != tt.name || got[0].Source != SourceObserved {
			t.Fatalf("%s: bindings %v, want one observed binding", tt.name, got)
		}
		// The guest may use the answer for ttl; the binding must last longer.
		if lives := got[0].Until.Sub(f.clock.Now()); lives < ttl+bindGrace {
			t.Errorf("%s: binding lives %v, guest TTL %v: want at least TTL + %v", tt.name, lives, ttl, bindGrace)
		}
	}
	// Past TTL plus grace the binding is gone.
	f.clock.Advance(maxTTL + bindGrace + time.Second)
	for _, tt := range tests {
		if got := f.binds.Names(tt.ip); len(got) != 0 {
			t.Errorf("%s: bindings %v after expiry, want none", tt.name, got)
		}
	}
	// A denied name is not bound: it lives in the pool.
	ip := answerAddrs(unpack(t, f.srv.Handle(context.Background(), query(t, "denied.example.test", dns.TypeA), false)))[0]
	if got := f.binds.Names(ip); len(got) != 0 {
		t.Errorf("pool address bound: %v", got)
	}
	if got, ok := f.pool.Name(ip); !ok || got != "denied.example.test" {
		t.Errorf("pool name of %v = %q, %v", ip, got, ok)
	}
}

func TestDNSCachedTTLCountsDown(t *testing.T) {
	f := newDNSFixture(t)
	f.srv.Handle(context.Background(), query(t, "allowed.example.test", dns.TypeA), false)
	f.clock.Advance(45 * time.Second)
	m := unpack(t, f.srv.Handle(context.Background(), query(t, "allowed.example.test", dns.TypeA), false))
	if got := m.Answer[0].Header().Ttl; got != 15 {
		t.Errorf("TTL of a cached answer after 45 s = %d, want 15", got)
	}
	if n := len(f.upstream.queries()); n != 1 {
		t.Errorf("upstream queries = %d, want 1", n)
	}
}

func TestDNSPTR(t *testing.T) {
	f := newDNSFixture(t)
	ip := answerAddrs(unpack(t, f.srv.Handle(context.Background(), query(t, "Denied.Example.Test", dns.TypeA), false)))[0]
	arpa, err := dns.ReverseAddr(ip.String())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		q    string
		want string // "" for no answer
	}{
		{"pool address", arpa, "denied.example.test."},
		{"unbound pool address", "254.255.19.198.in-addr.arpa", ""},
		{"real address", "10.2.0.192.in-addr.arpa", ""},
		{"not an address", "x.10.2.0.192.in-addr.arpa", ""},
	}
	for _, tt := range tests {
		m := unpack(t, f.srv.Handle(context.Background(), query(t, tt.q, dns.TypePTR), false))
		got := ""
		if len(m.Answer) == 1 {
			got = m.Answer[0].(*dns.PTR).Ptr
		}
		if got != tt.want || m.Rcode != dns.RcodeSuccess {
			t.Errorf("%s: PTR %s = %q (%s), want %q", tt.name, tt.q, got, rcodeName(m.Rcode), tt.want)
		}
	}
	if q := f.upstream.queries(); len(q) != 0 {
		t.Errorf("PTR queries reached upstream: %v", q)
	}
}

func TestDNSTruncation(t *testing.T) {
	f := newDNSFixture(t)
	tests := []struct {
		name    string
		query   []byte
		tcp     bool
		maxLen  int
		wantTC  bool
		wantAll bool
	}{
		{"UDP without EDNS", query(t, "big.example.test", dns.TypeA), false, 512, true, false},
		{"UDP with EDNS 512", query(t, "big.example.test", dns.TypeA, withEDNS(512)), false, 512, true, false},
		{"UDP with EDNS 1232", query(t, "big.example.test", dns.TypeA, withEDNS(1232)), false, 1232, true, false},
		{"UDP with EDNS 4096", query(t, "big.example.test", dns.TypeA, withEDNS(4096)), false, 4096, false, true},
		{"UDP with EDNS 65535 is capped", query(t, "big.example.test", dns.TypeA, withEDNS(65535)), false, maxUDPAnswer, false, true},
		{"TCP", query(t, "big.example.test", dns.TypeA), true, 65535, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := f.srv.Handle(context.Background(), tt.query, tt.tcp)
			if len(wire) > tt.maxLen {
				t.Errorf("answer is %d bytes, want at most %d", len(wire), tt.maxLen)
			}
			m := unpack(t, wire)
			if m.Truncated != tt.wantTC {
				t.Errorf("TC = %v, want %v", m.Truncated, tt.wantTC)
			}
			if got := len(m.Answer); (got == 100) != tt.wantAll {
				t.Errorf("answers = %d, want all 100: %v", got, tt.wantAll)
			}
		})
	}
	// The upstream answer (100 records) did not fit the resolver's UDP
	// size either: it came over TCP, once.
	want := []queryRecord{{"big.example.test", "A", "udp"}, {"big.example.test", "A", "tcp"}}
	if got := f.upstream.queries(); !slices.Equal(got, want) {
		t.Errorf("upstream queries = %v, want %v", got, want)
	}
}

func TestDNSMalformed(t *testing.T) {
	f := newDNSFixture(t)
	valid := query(t, "allowed.example.test", dns.TypeA)
	response := slices.Clone(valid)
	response[2] |= 0x80 // QR
	// Trailing bytes after the question are ignored, as most servers do:
	// they carry nothing the gate reads.
	tests := []struct {
		name      string
		query     []byte
		wantDrop  bool
		wantRcode int
	}{
		{"empty", nil, true, 0},
		{"short", []byte{1, 2, 3, 4, 5}, true, 0},
		{"a response", response, true, 0},
		{"header only, one question promised", valid[:12], false, dns.RcodeFormatError},
		{"cut in the name", valid[:20], false, dns.RcodeFormatError},
		{"cut in the type", valid[:len(valid)-3], false, dns.RcodeFormatError},
		{"pointer loop", append(slices.Clone(valid[:12]), 0xC0, 12, 0, 1, 0, 1), false, dns.RcodeFormatError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := len(f.audit.all())
			wire := f.srv.Handle(context.Background(), tt.query, false)
			if got := len(f.audit.all()) - n; got != 1 {
				t.Errorf("audit events = %d, want 1", got)
			}
			if tt.wantDrop {
				if wire != nil {
					t.Errorf("answered %x, want dropped", wire)
				}
				return
			}
			if wire == nil {
				t.Fatal("dropped, want an answer")
			}
			m := unpack(t, wire)
			if m.Rcode != tt.wantRcode || m.Id != binary.BigEndian.Uint16(tt.query) || !m.Response {
				t.Errorf("answer = %s id %d response %v, want %s id %d", rcodeName(m.Rcode), m.Id, m.Response, rcodeName(tt.wantRcode), binary.BigEndian.Uint16(tt.query))
			}
		})
	}
	if q := f.upstream.queries(); len(q) != 0 {
		t.Errorf("malformed queries reached upstream: %v", q)
	}
}

func TestDNSPreservesQueryCase(t *testing.T) {
	f := newDNSFixture(t)
	// Resolvers randomize case (DNS 0x20) and check the answer echoes it.
	m := unpack(t, f.srv.Handle(context.Background(), query(t, "AlLoWeD.eXaMpLe.TeSt", dns.TypeA), false))
	if got := m.Question[0].Name; got != "AlLoWeD.eXaMpLe.TeSt." {
		t.Errorf("question = %q, want the case as sent", got)
	}
	if len(m.Answer) != 1 || m.Answer[0].Header().Name != "AlLoWeD.eXaMpLe.TeSt." {
		t.Errorf("answer = %v, want the owner name as sent", m.Answer)
	}
}

func TestDNSFloodIsBounded(t *testing.T) {
	f := newDNSFixture(t) // the resolver allows 2 upstream lookups in flight
	names := []string{"slow1.example.test", "slow2.example.test", "slow3.example.test", "slow4.example.test"}
	var wg sync.WaitGroup
	rcodes := make(chan int, 10*len(names))
	for range 10 {
		for _, n := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := unpack(t, f.srv.Handle(context.Background(), query(t, n, dns.TypeA), false))
				rcodes <- m.Rcode
			}()
		}
	}
	wg.Wait()
	close(rcodes)
	count := map[int]int{}
	for rc := range rcodes {
		count[rc]++
	}
	if count[dns.RcodeSuccess] == 0 || count[dns.RcodeServerFailure] == 0 || count[dns.RcodeSuccess]+count[dns.RcodeServerFailure] != 40 {
		t.Errorf("rcodes = %v, want some NOERROR, some SERVFAIL, nothing else", count)
	}
	// The resolver re-sends a query that is slow to come back, so count
	// lookups (names), not packets.
	seen := map[string]bool{}
	for _, q := range f.upstream.queries() {
		seen[q.Name] = true
	}
	if len(seen) > 2 {
		t.Errorf("names looked up upstream = %v, want at most 2 (in-flight bound, coalesced)", seen)
	}
	// Cached now: a burst of the same question costs nothing upstream.
	before := len(f.upstream.queries())
	var resolved string
	for _, n := range names {
		if _, ok := f.resolver.cached(n); ok {
			resolved = n
			break
		}
	}
	if resolved == "" {
		t.Fatal("nothing was resolved")
	}
	for range 1000 {
		f.srv.Handle(context.Background(), query(t, resolved, dns.TypeA), false)
	}
	if n := len(f.upstream.queries()) - before; n != 0 {
		t.Errorf("cached burst sent %d upstream queries, want 0", n)
	}
}

func TestDNSPoolExhausted(t *testing.T) {
	f := newDNSFixture(t)
	f.srv.o.Pool = newPool(f.clock.Now, 1)
	m := unpack(t, f.srv.Handle(context.Background(), query(t, "one.example.test", dns.TypeA), false))
	if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		t.Fatalf("first denied name: %s %v", rcodeName(m.Rcode), m.Answer)
	}
	m = unpack(t, f.srv.Handle(context.Background(), query(t, "two.example.test", dns.TypeA), false))
	if m.Rcode != dns.RcodeServerFailure || len(m.Answer) != 0 {
		t.Errorf("second denied name on a full pool: %s %v, want SERVFAIL", rcodeName(m.Rcode), m.Answer)
	}
	evs := f.audit.all()
	if ev := evs[len(evs)-1]; ev.Err == "" || ev.Verdict != "deny" {
		t.Errorf("audit = %+v, want a deny with the reason", ev)
	}
}

func TestDNSFailsClosed(t *testing.T) {
	up := startZone(t, map[string]*zoneEntry{"allowed.example.test": {rrs: []string{"allowed.example.test. 60 IN A 192.0.2.10"}}})
	r := NewResolver(ResolverOptions{Servers: []netip.AddrPort{up.Addr}})
	defer r.Close()
	tests := []struct {
		name      string
		o         DNSOptions
		wantRcode int
	}{
		{"no decider", DNSOptions{Resolver: r, Pool: NewPool(nil)}, dns.RcodeSuccess}, // denied: a pool answer
		{"no pool", DNSOptions{Resolver: r}, dns.RcodeRefused},
		{"no resolver", DNSOptions{Decide: allowList("allowed.example.test")}, dns.RcodeServerFailure},
	}
	for _, tt := range tests {
		m := unpack(t, NewDNSServer(tt.o).Handle(context.Background(), query(t, "allowed.example.test", dns.TypeA), false))
		if m.Rcode != tt.wantRcode {
			t.Errorf("%s: rcode %s, want %s", tt.name, rcodeName(m.Rcode), rcodeName(tt.wantRcode))
		}
		for _, a := range answerAddrs(m) {
			if !InPool(a) {
				t.Errorf("%s: real address %v answered", tt.name, a)
			}
		}
	}
	if q := up.queries(); len(q) != 0 {
		t.Errorf("upstream queries = %v, want none", q)
	}
}

func TestDNSServeTCP(t *testing.T) {
	f := newDNSFixture(t)
	f.srv.tcpIdle = 300 * time.Millisecond
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); f.srv.ServeTCP(ctx, c) }()
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		return c
	}
	frame := func(b []byte) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...) }
	read := func(c net.Conn) (*dns.Msg, error) {
		var hdr [2]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return nil, err
		}
		b := make([]byte, binary.BigEndian.Uint16(hdr[:]))
		if _, err := io.ReadFull(c, b); err != nil {
			return nil, err
		}
		m := new(dns.Msg)
		return m, m.Unpack(b)
	}

	// Two queries in one write, then the big answer that UDP cannot carry.
	c := dial()
	defer c.Close()
	batch := append(frame(query(t, "allowed.example.test", dns.TypeA)), frame(query(t, "denied.example.test", dns.TypeA))...)
	batch = append(batch, frame(query(t, "big.example.test", dns.TypeA))...)
	if _, err := c.Write(batch); err != nil {
		t.Fatal(err)
	}
	var got []int
	for range 3 {
		m, err := read(c)
		if err != nil {
			t.Fatalf("reading answer: %v", err)
		}
		got = append(got, len(m.Answer))
	}
	if want := []int{1, 1, 100}; !slices.Equal(got, want) {
		t.Errorf("answer counts = %v, want %v", got, want)
	}
	// Idle: the server hangs up.
	start := time.Now()
	if _, err := read(c); err == nil {
		t.Error("read after idle: got a message, want the connection closed")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("idle close took %v", d)
	}

	// A dropped query (a response sent as a query) closes the connection.
	c2 := dial()
	defer c2.Close()
	resp := query(t, "allowed.example.test", dns.TypeA)
	resp[2] |= 0x80
	c2.Write(frame(resp))
	if _, err := read(c2); err == nil {
		t.Error("answer to a response: want the connection closed")
	}

	// Shutdown closes open connections.
	c3 := dial()
	defer c3.Close()
	c3.Write(frame(query(t, "allowed.example.test", dns.TypeA)))
	if _, err := read(c3); err != nil {
		t.Fatal(err)
	}
	cancel()
	start = time.Now()
	if _, err := read(c3); err == nil {
		t.Error("read after cancel: want the connection closed")
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("close on cancel took %v", d)
	}
}

// FuzzHandle feeds arbitrary bytes to Handle: it must not panic, must
// answer with a parsable message carrying the query's ID (or drop it),
// must not exceed the UDP limits, and must send nothing upstream for any
// name but the one allowed.
func FuzzHandle(f *testing.F) {
	fx := newDNSFixture(f, "allowed.example.test")
	fx.audit.keep = false
	for _, seed := range [][]byte{
		query(f, "allowed.example.test", dns.TypeA),
		query(f, "allowed.example.test", dns.TypeA, withEDNS(4096)),
		query(f, "denied.example.test", dns.TypeA),
		query(f, "denied.example.test", dns.TypeTXT),
		query(f, "denied.example.test", dns.TypeANY, withEDNS(1232)),
		query(f, "1.0.18.198.in-addr.arpa", dns.TypePTR),
		rawQuery(1, []string{strings.Repeat("a", 64), "example", "test"}, dns.TypeA, dns.ClassINET),
		rawQuery(1, []string{"b\xc3\xbccher", "example", "test"}, dns.TypeA, dns.ClassINET),
		{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xC0, 12, 0, 1, 0, 1},
		{},
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	f.Fuzz(func(t *testing.T, b []byte, tcp bool) {
		n, up := fx.audit.count(), fx.upstream.count()
		wire := fx.srv.Handle(context.Background(), b, tcp)
		if got := fx.audit.count() - n; got != 1 {
			t.Fatalf("audit events = %d, want 1", got)
		}
		for _, q := range fx.upstream.since(up) {
			if q.Name != "allowed.example.test" || q.Type != "A" {
				t.Fatalf("sent upstream: %+v", q)
			}
		}
		if wire == nil {
			return
		}
		m := new(dns.Msg)
		if err := m.Unpack(wire); err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		if m.Id != binary.BigEndian.Uint16(b) || !m.Response {
			t.Fatalf("answer id %d response %v, query id %d", m.Id, m.Response, binary.BigEndian.Uint16(b))
		}
		if !tcp && len(wire) > maxUDPAnswer {
			t.Fatalf("UDP answer of %d bytes", len(wire))
		}
		for _, a := range answerAddrs(m) {
			if a != netip.MustParseAddr("192.0.2.10") && !InPool(a) {
				t.Fatalf("answered %v", a)
			}
		}
	})
}

// BenchmarkCachedA measures answering an A query from the cache, the
// common case once a workload is running. Target: p50 at most 0.3 ms.
func BenchmarkCachedA(b *testing.B) {
	f := newDNSFixture(b)
	f.audit.keep = false
	q := query(b, "allowed.example.test", dns.TypeA)
	if m := unpack(b, f.srv.Handle(context.Background(), q, false)); len(m.Answer) != 1 {
		b.Fatalf("warm-up answer: %v", m.Answer)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		f.srv.Handle(context.Background(), q, false)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	if n := len(f.upstream.queries()); n != 1 {
		b.Errorf("upstream queries = %d, want 1", n)
	}
}
