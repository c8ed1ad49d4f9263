package policy

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
)

// r is a rule written the short way: layer, action, entry.
type r struct {
	l Layer
	a Action
	e string
}

func compile(t testing.TB, specs ...r) *Policy {
	t.Helper()
	var rules []Rule
	for i, s := range specs {
		rule, err := ParseEntry(s.e)
		if err != nil {
			t.Fatal(err)
		}
		rule.Action, rule.Layer, rule.Source = s.a, s.l, fmt.Sprintf("test:%d", i+1)
		rules = append(rules, rule)
	}
	return Compile(rules)
}

// q is a query and the decision it must get: the verdict and the entry
// and layer of the deciding rule ("" for none).
type q struct {
	name  string
	port  uint16
	allow bool
	entry string
	layer Layer
}

func checkName(t *testing.T, p *Policy, qs []q) {
	t.Helper()
	for _, tt := range qs {
		d := p.Name(tt.name, tt.port)
		gotEntry, gotLayer := "", Layer(0)
		if d.Rule != nil {
			gotEntry, gotLayer = d.Rule.Entry, d.Rule.Layer
		}
		if (d.Verdict == Allow) != tt.allow || gotEntry != tt.entry || gotLayer != tt.layer {
			t.Errorf("Name(%q, %d) = %v by %q (%v); want %v by %q (%v)",
				tt.name, tt.port, d.Verdict, gotEntry, gotLayer, verdict(tt.allow), tt.entry, tt.layer)
		}
	}
}

func verdict(allow bool) Verdict {
	if allow {
		return Allow
	}
	return Deny
}

const (
	yes = true
	no  = false
)

func TestNameMatching(t *testing.T) {
	p := compile(t,
		r{LayerUser, Allow, "exact.example"},
		r{LayerUser, Allow, "*.wild.example"},
		r{LayerUser, Allow, "port.example:443"},
		r{LayerUser, Allow, "*.wport.example:8443"},
		r{LayerUser, Allow, "bücher.example"},
		r{LayerUser, Allow, "TRAILING.example."},
	)
	checkName(t, p, []q{
		// Exact names: that name only, any case, trailing dot.
		{"exact.example", 443, yes, "exact.example", LayerUser},
		{"EXACT.Example", 80, yes, "exact.example", LayerUser},
		{"exact.example.", 22, yes, "exact.example", LayerUser},
		{"a.exact.example", 443, no, "", 0},
		{"exact.example.org", 443, no, "", 0},
		{"xexact.example", 443, no, "", 0},
		{"example", 443, no, "", 0},
		// Wildcards: any depth below, never the apex.
		{"a.wild.example", 443, yes, "*.wild.example", LayerUser},
		{"a.b.c.wild.example", 443, yes, "*.wild.example", LayerUser},
		{"A.Wild.Example.", 443, yes, "*.wild.example", LayerUser},
		{"wild.example", 443, no, "", 0},
		{"awild.example", 443, no, "", 0},
		{"wild.example.evil", 443, no, "", 0},
		// Ports.
		{"port.example", 443, yes, "port.example:443", LayerUser},
		{"port.example", 80, no, "", 0},
		{"a.wport.example", 8443, yes, "*.wport.example:8443", LayerUser},
		{"a.wport.example", 443, no, "", 0},
		{"wport.example", 8443, no, "", 0},
		// IDN: Unicode and punycode are the same name.
		{"bücher.example", 443, yes, "bücher.example", LayerUser},
		{"BÜCHER.example", 443, yes, "bücher.example", LayerUser},
		{"xn--bcher-kva.example", 443, yes, "bücher.example", LayerUser},
		{"trailing.example", 443, yes, "TRAILING.example.", LayerUser},
		// Not names: never matched, never an error.
		{"", 443, no, "", 0},
		{"exact..example", 443, no, "", 0},
		{"*.wild.example", 443, no, "", 0},
		{"127.0.0.1", 443, no, "", 0},
		{"2130706433", 443, no, "", 0},
	})
}

// TestLayers: the highest layer with any matching rule decides, however
// specific the rules of lower layers are.
func TestLayers(t *testing.T) {
	p := compile(t,
		r{LayerBuiltin, Allow, "*.example.com"},
		r{LayerNamed, Block, "ads.example.com"},
		r{LayerUser, Block, "*.example.com"},
		r{LayerUser, Allow, "api.example.com"},
		r{LayerProject, Allow, "*.example.com:443"},
		r{LayerProject, Block, "tracker.example.com"},
		r{LayerRuntime, Allow, "tracker.example.com:8080"},
		r{LayerBuiltin, Allow, "low.example"},
		r{LayerNamed, Block, "low.example"},
		r{LayerBuiltin, Block, "open.example"},
		r{LayerRuntime, Allow, "*.open.example"},
	)
	checkName(t, p, []q{
		// Project allows every subdomain on 443, overriding the user's
		// block and the named policy's more specific block.
		{"ads.example.com", 443, yes, "*.example.com:443", LayerProject},
		{"www.example.com", 443, yes, "*.example.com:443", LayerProject},
		// On port 80 the project has no opinion; the user's layer has.
		{"www.example.com", 80, no, "*.example.com", LayerUser},
		{"api.example.com", 80, yes, "api.example.com", LayerUser},
		// The project's exact block beats its own wildcard allow.
		{"tracker.example.com", 443, no, "tracker.example.com", LayerProject},
		// A runtime grant beats the project.
		{"tracker.example.com", 8080, yes, "tracker.example.com:8080", LayerRuntime},
		{"tracker.example.com", 80, no, "tracker.example.com", LayerProject},
		// Named beats builtin.
		{"low.example", 443, no, "low.example", LayerNamed},
		// A runtime wildcard does not cover the apex, so the builtin
		// block of the apex still decides it.
		{"open.example", 443, no, "open.example", LayerBuiltin},
		{"x.open.example", 443, yes, "*.open.example", LayerRuntime},
	})
}

// TestSpecificity: inside one layer, exact beats any wildcard, a deeper
// wildcard beats a shallower one, a port beats no port for the same
// pattern, and the name pattern counts before the port.
func TestSpecificity(t *testing.T) {
	p := compile(t,
		r{LayerUser, Allow, "*.com"},
		r{LayerUser, Block, "*.example.com"},
		r{LayerUser, Allow, "*.api.example.com"},
		r{LayerUser, Block, "v1.api.example.com"},
		r{LayerUser, Allow, "v1.api.example.com:443"},
		r{LayerUser, Allow, "*.example.com:22"},
		r{LayerUser, Block, "exact.example.org"},
		r{LayerUser, Allow, "*.example.org:443"},
	)
	checkName(t, p, []q{
		{"other.com", 443, yes, "*.com", LayerUser},
		{"a.example.com", 443, no, "*.example.com", LayerUser},
		{"example.com", 443, yes, "*.com", LayerUser}, // the apex is not under *.example.com
		{"x.api.example.com", 443, yes, "*.api.example.com", LayerUser},
		{"x.y.api.example.com", 443, yes, "*.api.example.com", LayerUser},
		{"api.example.com", 443, no, "*.example.com", LayerUser},
		{"v1.api.example.com", 443, yes, "v1.api.example.com:443", LayerUser},
		{"v1.api.example.com", 80, no, "v1.api.example.com", LayerUser},
		// *.example.com:22 beats *.example.com, but not the deeper
		// *.api.example.com, nor the exact v1 block.
		{"a.example.com", 22, yes, "*.example.com:22", LayerUser},
		{"x.api.example.com", 22, yes, "*.api.example.com", LayerUser},
		{"v1.api.example.com", 22, no, "v1.api.example.com", LayerUser},
		// An exact name without a port beats a wildcard with one.
		{"exact.example.org", 443, no, "exact.example.org", LayerUser},
		{"other.example.org", 443, yes, "*.example.org:443", LayerUser},
	})
}

// TestTieBreak: equal specificity in the same layer, block wins,
// whichever was written first; identical rules name the first.
func TestTieBreak(t *testing.T) {
	for _, order := range [][]r{
		{{LayerUser, Allow, "a.example"}, {LayerUser, Block, "A.example."}},
		{{LayerUser, Block, "A.example."}, {LayerUser, Allow, "a.example"}},
	} {
		checkName(t, compile(t, order...), []q{{"a.example", 443, no, "A.example.", LayerUser}})
	}
	checkName(t, compile(t,
		r{LayerUser, Allow, "*.example:443"},
		r{LayerUser, Block, "*.example:443"},
		r{LayerUser, Allow, "dup.example"},
		r{LayerUser, Allow, "DUP.example"},
	), []q{
		{"x.example", 443, no, "*.example:443", LayerUser},
		{"dup.example", 443, yes, "dup.example", LayerUser},
	})
	// A zero Action is not an allow.
	checkName(t, Compile([]Rule{{Entry: "z.example", Name: "z.example", Layer: LayerUser}}),
		[]q{{"z.example", 443, no, "z.example", LayerUser}})
}

// TestAnyPort: port 0 asks whether some port is allowed.
func TestAnyPort(t *testing.T) {
	p := compile(t,
		r{LayerUser, Allow, "plain.example"},
		r{LayerUser, Allow, "ssh.example:22"},
		r{LayerUser, Block, "closed.example"},
		r{LayerUser, Allow, "closed.example:443"},
		r{LayerUser, Block, "shut.example:443"},
		r{LayerUser, Allow, "*.mixed.example"},
		r{LayerUser, Block, "*.mixed.example:443"},
		r{LayerProject, Block, "*.mixed.example:80"},
		r{LayerUser, Block, "all.example"},
		r{LayerProject, Block, "*.deep.example"},
		r{LayerUser, Allow, "x.deep.example:443"},
		r{LayerUser, Allow, "ports.example:443"},
		r{LayerProject, Block, "ports.example:443"},
		r{LayerUser, Allow, "ports.example:8443"},
		r{LayerRuntime, Block, "ports.example:8443"},
	)
	checkName(t, p, []q{
		{"plain.example", 0, yes, "plain.example", LayerUser},
		{"ssh.example", 0, yes, "ssh.example:22", LayerUser},
		// A block without a port, an allow with one: resolvable.
		{"closed.example", 0, yes, "closed.example:443", LayerUser},
		// Only a block, on one port: other ports are undecided, so
		// denied; the block is named.
		{"shut.example", 0, no, "shut.example:443", LayerUser},
		// Allowed except 443 and 80: some port still works.
		{"a.mixed.example", 0, yes, "*.mixed.example", LayerUser},
		{"a.mixed.example", 80, no, "*.mixed.example:80", LayerProject},
		{"all.example", 0, no, "all.example", LayerUser},
		// A higher layer's wildcard block beats the lower exact allow
		// on every port.
		{"x.deep.example", 0, no, "*.deep.example", LayerProject},
		// Every allowed port is overridden above.
		{"ports.example", 0, no, "ports.example:443", LayerProject},
		{"ports.example", 8443, no, "ports.example:8443", LayerRuntime},
		{"nothing.example", 0, no, "", 0},
	})
}

func TestAddr(t *testing.T) {
	p := compile(t,
		r{LayerUser, Allow, "192.0.2.0/24"},
		r{LayerUser, Block, "192.0.2.66"},
		r{LayerUser, Allow, "192.0.2.66:443"},
		r{LayerProject, Block, "198.51.100.0/24"},
		r{LayerUser, Allow, "198.51.100.7"},
		r{LayerUser, Allow, "2001:db8::/32"},
		r{LayerUser, Block, "[2001:db8::bad]:22"},
		r{LayerUser, Allow, "203.0.113.9:22"},
		r{LayerUser, Allow, "names.example"},
		r{LayerUser, Block, "0.0.0.0/0:25"},
	)
	tests := []struct {
		ip    string
		port  uint16
		allow bool
		entry string
	}{
		{"192.0.2.1", 443, yes, "192.0.2.0/24"},
		{"192.0.2.66", 80, no, "192.0.2.66"},
		{"192.0.2.66", 443, yes, "192.0.2.66:443"},
		{"192.0.2.66", 0, yes, "192.0.2.66:443"},
		{"::ffff:192.0.2.1", 443, yes, "192.0.2.0/24"}, // decided as the IPv4 address
		{"198.51.100.7", 443, no, "198.51.100.0/24"},   // higher layer wins
		{"2001:db8::1", 443, yes, "2001:db8::/32"},
		{"2001:db8::bad", 22, no, "[2001:db8::bad]:22"},
		{"2001:db8::bad", 0, yes, "2001:db8::/32"},
		{"fe80::1%eth0", 443, no, ""},
		{"203.0.113.9", 22, yes, "203.0.113.9:22"},
		{"203.0.113.9", 23, no, ""},
		{"203.0.113.9", 0, yes, "203.0.113.9:22"},
		{"203.0.113.10", 0, no, "0.0.0.0/0:25"}, // the only opinion about it
		{"192.0.2.1", 25, yes, "192.0.2.0/24"},  // the prefix counts before the port
		{"192.0.2.66", 25, no, "192.0.2.66"},
		{"8.8.4.4", 25, no, "0.0.0.0/0:25"},
		{"8.8.8.8", 443, no, ""},
	}
	for _, tt := range tests {
		d := p.Addr(netip.MustParseAddr(tt.ip), tt.port)
		got := ""
		if d.Rule != nil {
			got = d.Rule.Entry
		}
		if (d.Verdict == Allow) != tt.allow || got != tt.entry {
			t.Errorf("Addr(%s, %d) = %v by %q; want %v by %q", tt.ip, tt.port, d.Verdict, got, verdict(tt.allow), tt.entry)
		}
	}
	// Name rules never decide an address, address rules never a name.
	if d := p.Name("192.0.2.1", 443); d.Verdict == Allow {
		t.Errorf("Name(192.0.2.1) = %v by %v", d.Verdict, d.Rule)
	}
	if d := p.Addr(netip.Addr{}, 443); d.Verdict == Allow || d.Rule != nil {
		t.Errorf("Addr(invalid) = %+v", d)
	}
}

// TestFailClosed: no policy, an empty one, and the zero Decision deny.
func TestFailClosed(t *testing.T) {
	var nilPolicy *Policy
	for _, p := range []*Policy{nilPolicy, Compile(nil)} {
		if d := p.Name("example.com", 443); d.Verdict != Deny || d.Rule != nil {
			t.Errorf("Name on %v = %+v", p, d)
		}
		if d := p.Addr(netip.MustParseAddr("192.0.2.1"), 443); d.Verdict != Deny || d.Rule != nil {
			t.Errorf("Addr on %v = %+v", p, d)
		}
		if d, ok := p.OpensSpecial(netip.MustParseAddr("10.0.0.1"), 443, "private"); ok || d.Verdict != Deny {
			t.Errorf("OpensSpecial on %v = %+v, %v", p, d, ok)
		}
		if len(p.Rules()) != 0 {
			t.Errorf("Rules() = %v", p.Rules())
		}
	}
	if (Decision{}).Verdict != Deny {
		t.Error("the zero Decision does not deny")
	}
}

// TestRules: Rules keeps the order given and cannot change the policy.
func TestRules(t *testing.T) {
	p := compile(t, r{LayerUser, Allow, "b.example"}, r{LayerUser, Block, "a.example"}, r{LayerBuiltin, Allow, "10.0.0.0/8"})
	got := p.Rules()
	want := []string{"b.example", "a.example", "10.0.0.0/8"}
	if len(got) != len(want) {
		t.Fatalf("Rules() = %v", got)
	}
	for i := range want {
		if got[i].Entry != want[i] || got[i].Source != fmt.Sprintf("test:%d", i+1) {
			t.Errorf("Rules()[%d] = %+v, want entry %q", i, got[i], want[i])
		}
	}
	got[0].Action = Block
	got[0].Name = "c.example"
	if d := p.Name("b.example", 443); d.Verdict != Allow {
		t.Errorf("changing Rules() changed the policy: %+v", d)
	}
	// Compile copies its input too.
	in := []Rule{{Entry: "x.example", Name: "x.example", Action: Allow}}
	p = Compile(in)
	in[0].Action = Block
	if d := p.Name("x.example", 443); d.Verdict != Allow {
		t.Errorf("changing Compile's input changed the policy: %+v", d)
	}
}

// TestCompileNormalizes: a hand-built rule with a name in upper case or
// an address prefix with host bits still matches.
func TestCompileNormalizes(t *testing.T) {
	p := Compile([]Rule{
		{Entry: "X", Name: "Upper.Example.", Action: Allow},
		{Entry: "Y", Prefix: netip.MustParsePrefix("192.0.2.77/24"), Action: Allow},
	})
	if d := p.Name("upper.example", 443); d.Verdict != Allow {
		t.Errorf("Name(upper.example) = %+v", d)
	}
	if d := p.Addr(netip.MustParseAddr("192.0.2.1"), 443); d.Verdict != Allow {
		t.Errorf("Addr(192.0.2.1) = %+v", d)
	}
}

func TestConcurrent(t *testing.T) {
	p := compile(t, r{LayerUser, Allow, "*.example.com"}, r{LayerUser, Allow, "10.0.0.0/8"})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				if p.Name(fmt.Sprintf("h%d.example.com", j), 0).Verdict != Allow {
					t.Error("denied")
					return
				}
				p.Addr(netip.AddrFrom4([4]byte{10, byte(i), byte(j), 1}), 443)
			}
		}()
	}
	wg.Wait()
}

// bigPolicy is a blocklist-sized policy: n rules, half exact names and
// half wildcards, over a few layers, plus some address rules.
func bigPolicy(n int) *Policy {
	rules := make([]Rule, 0, n)
	for i := 0; i < n; i++ {
		var e string
		switch i % 4 {
		case 0:
			e = fmt.Sprintf("host%d.block%d.example", i, i%97)
		case 1:
			e = fmt.Sprintf("*.ads%d.example", i)
		case 2:
			e = fmt.Sprintf("api%d.example.com:443", i)
		default:
			e = fmt.Sprintf("10.%d.%d.0/24", (i>>8)&255, i&255)
		}
		r, err := ParseEntry(e)
		if err != nil {
			panic(err)
		}
		r.Action, r.Layer = Block, Layer(i%3)
		if i%5 == 0 {
			r.Action = Allow
		}
		rules = append(rules, r)
	}
	return Compile(rules)
}

func BenchmarkName(b *testing.B) {
	p := bigPolicy(100_000)
	names := []string{
		"a.b.c.d.ads5.example",    // wildcard hit, four labels deep
		"host4.block4.example",    // exact hit
		"api6.example.com",        // exact hit with a port
		"www.unrelated.example",   // miss
		"Mixed.Case.ADS9.Example", // needs lower-casing
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		p.Name(names[i%len(names)], 443)
	}
}

func BenchmarkNameAnyPort(b *testing.B) {
	p := bigPolicy(100_000)
	b.ReportAllocs()
	for b.Loop() {
		p.Name("api6.example.com", 0)
	}
}

func BenchmarkAddr(b *testing.B) {
	p := bigPolicy(100_000)
	ip := netip.MustParseAddr("10.1.7.9")
	b.ReportAllocs()
	for b.Loop() {
		p.Addr(ip, 443)
	}
}

func BenchmarkCompile(b *testing.B) {
	for b.Loop() {
		bigPolicy(100_000)
	}
}
