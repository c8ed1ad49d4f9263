package gate

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/miekg/dns"

	"moat.dev/moat/internal/policy"
)

// A front end that owns a range (the gate service's [service] names) gets
// a pool in that range, and every name answered from it.

func TestPoolIn(t *testing.T) {
	p := NewPoolIn(netip.MustParsePrefix("10.9.0.128/25"), newFakeClock().Now)
	if p.size != 126 {
		t.Errorf("size = %d, want 126 (the /25 less network and broadcast)", p.size)
	}
	var got []netip.Addr
	for _, n := range []string{"a.test", "b.test", "a.test"} {
		got = append(got, p.Addr(n))
	}
	want := []netip.Addr{netip.MustParseAddr("10.9.0.129"), netip.MustParseAddr("10.9.0.130"), netip.MustParseAddr("10.9.0.129")}
	if !slices.Equal(got, want) {
		t.Errorf("addresses = %v, want %v", got, want)
	}
	for _, tt := range []struct {
		ip   string
		want bool
	}{{"10.9.0.129", true}, {"10.9.0.255", true}, {"10.9.0.127", false}, {"198.18.0.1", false}} {
		if got := p.Contains(netip.MustParseAddr(tt.ip)); got != tt.want {
			t.Errorf("Contains(%s) = %v, want %v", tt.ip, got, tt.want)
		}
	}
	small := NewPoolIn(netip.MustParsePrefix("10.9.0.0/30"), nil)
	if a, b, c := small.Addr("a"), small.Addr("b"), small.Addr("c"); a.String() != "10.9.0.1" || b.String() != "10.9.0.2" || c.IsValid() {
		t.Errorf("a /30 handed out %v %v %v; want .1, .2, then nothing", a, b, c)
	}
}

func TestDNSPoolAll(t *testing.T) {
	f := newDNSFixture(t)
	f.pool = NewPoolIn(netip.MustParsePrefix("10.9.0.128/25"), f.clock.Now)
	f.srv.o.Pool, f.srv.o.PoolAll = f.pool, true
	tests := []struct {
		name      string
		wantRcode int
		wantPool  bool
		wantUp    bool
	}{
		{"allowed.example.test", dns.RcodeSuccess, true, true},
		{"nx.example.test", dns.RcodeNameError, false, true},          // does not exist: no address to aim at
		{"nodata.example.test", dns.RcodeSuccess, false, true},        // no A upstream: none here either
		{"denied.example.test", dns.RcodeSuccess, true, false},        // never upstream
		{"exfil-6d6f6174.denied.test", dns.RcodeSuccess, true, false}, // nor data in labels
	}
	for _, tt := range tests {
		before := len(f.upstream.queries())
		m := unpack(t, f.srv.Handle(context.Background(), query(t, tt.name, dns.TypeA), false))
		got := answerAddrs(m)
		if m.Rcode != tt.wantRcode {
			t.Errorf("%s: rcode %s, want %s", tt.name, dns.RcodeToString[m.Rcode], dns.RcodeToString[tt.wantRcode])
		}
		if tt.wantPool != (len(got) == 1 && f.pool.Contains(got[0])) || (!tt.wantPool && len(got) != 0) {
			t.Errorf("%s: answers %v; want from the range: %v", tt.name, got, tt.wantPool)
		}
		if asked := len(f.upstream.queries()) > before; asked != tt.wantUp {
			t.Errorf("%s: asked upstream %v, want %v", tt.name, asked, tt.wantUp)
		}
		if tt.wantPool {
			if name, ok := f.pool.Name(got[0]); !ok || name != tt.name {
				t.Errorf("%s: %s is bound to %q", tt.name, got[0], name)
			}
			ev := f.audit.all()[f.audit.count()-1]
			if !ev.Front || !ev.Pool {
				t.Errorf("%s: event %+v; want Front and Pool (an address of the gate's own)", tt.name, ev)
			}
		}
	}
	// The real address is still bound: the gate dials it by name.
	if names := f.binds.Names(netip.MustParseAddr("192.0.2.10")); len(names) == 0 || names[0].Name != "allowed.example.test" {
		t.Errorf("192.0.2.10 is bound to %v, want allowed.example.test", names)
	}
}

func TestNamesRangeIsNeverDialed(t *testing.T) {
	// An address rule that opens the private range around it does not
	// open the range: a dial there would come back to the gate.
	p := policy.Compile(mustRules(t, policy.Allow, "10.0.0.0/8"))
	g := New(Options{Policy: p, Names: netip.MustParsePrefix("10.9.0.128/25")})
	if class, sp := g.special(netip.MustParseAddr("10.9.0.200"), 22); !sp || class != policy.ClassHost {
		t.Errorf("special(10.9.0.200) = %q, %v; want the host's own", class, sp)
	}
	if class, sp := g.special(netip.MustParseAddr("10.1.2.3"), 22); sp {
		t.Errorf("10.1.2.3, outside the range and opened by the rule, is refused as %q", class)
	}
}
