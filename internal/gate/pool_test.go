package gate

import (
	"net/netip"
	"testing"
	"time"
)

func TestInPool(t *testing.T) {
	tests := []struct {
		ip   string
		want bool
	}{
		{"198.18.0.0", true},
		{"198.18.0.1", true},
		{"198.19.255.255", true},
		{"198.17.255.255", false},
		{"198.20.0.0", false},
		{"192.0.2.1", false},
		{"::ffff:198.18.0.1", true},
		{"2001:db8::1", false},
	}
	for _, tt := range tests {
		if got := InPool(netip.MustParseAddr(tt.ip)); got != tt.want {
			t.Errorf("InPool(%s) = %v, want %v", tt.ip, got, tt.want)
		}
	}
	if InPool(netip.Addr{}) {
		t.Error("InPool(zero Addr) = true")
	}
}

func TestPoolAddr(t *testing.T) {
	tests := []struct {
		i    int
		want string
	}{
		{0, "198.18.0.1"},
		{254, "198.18.0.255"},
		{255, "198.18.1.0"},
		{1<<17 - 3, "198.19.255.254"},
	}
	for _, tt := range tests {
		if got := poolAddr(tt.i).String(); got != tt.want {
			t.Errorf("poolAddr(%d) = %s, want %s", tt.i, got, tt.want)
		}
	}
}

func TestPoolStable(t *testing.T) {
	p := NewPool(newFakeClock().Now)
	a := p.Addr("one.example.test")
	b := p.Addr("two.example.test")
	if !a.IsValid() || !b.IsValid() || a == b {
		t.Fatalf("Addr gave %v and %v, want two distinct addresses", a, b)
	}
	for _, spelling := range []string{"one.example.test", "ONE.Example.Test", "one.example.test."} {
		if got := p.Addr(spelling); got != a {
			t.Errorf("Addr(%q) = %v, want %v", spelling, got, a)
		}
	}
	for _, ip := range []netip.Addr{a, b} {
		if !InPool(ip) {
			t.Errorf("%v is not in the pool prefix", ip)
		}
	}
	tests := []struct {
		ip     netip.Addr
		want   string
		wantOK bool
	}{
		{a, "one.example.test", true},
		{b, "two.example.test", true},
		{netip.AddrFrom16(a.As16()), "one.example.test", true}, // IPv4-mapped
		{netip.MustParseAddr("198.19.0.1"), "", false},
		{netip.MustParseAddr("192.0.2.1"), "", false},
	}
	for _, tt := range tests {
		got, ok := p.Name(tt.ip)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("Name(%v) = %q, %v; want %q, %v", tt.ip, got, ok, tt.want, tt.wantOK)
		}
	}
	if got := p.Len(); got != 2 {
		t.Errorf("Len = %d, want 2", got)
	}
}

func TestPoolReusesLeastRecentlyUsed(t *testing.T) {
	clock := newFakeClock()
	p := newPool(clock.Now, 3)
	a := p.Addr("a.example.test")
	b := p.Addr("b.example.test")
	c := p.Addr("c.example.test")
	clock.Advance(time.Second)
	p.Addr("a.example.test") // a is used again; b is now the oldest
	p.Name(c)                // a connection to c counts as use

	// Full, and nothing idle long enough: refuse rather than rebind.
	if got := p.Addr("d.example.test"); got.IsValid() {
		t.Fatalf("Addr on a full pool of fresh names = %v, want the zero Addr", got)
	}
	clock.Advance(poolHold - time.Second)
	// b has been idle for poolHold; a and c for less.
	d := p.Addr("d.example.test")
	if d != b {
		t.Fatalf("Addr(d) = %v, want b's address %v reused", d, b)
	}
	if got, _ := p.Name(b); got != "d.example.test" {
		t.Errorf("Name(%v) = %q, want d.example.test", b, got)
	}
	if got := p.Addr("a.example.test"); got != a {
		t.Errorf("a moved from %v to %v", a, got)
	}
	if got := p.Addr("c.example.test"); got != c {
		t.Errorf("c moved from %v to %v", c, got)
	}
	if got := p.Len(); got != 3 {
		t.Errorf("Len = %d, want 3", got)
	}
}

func TestPoolSizeCapped(t *testing.T) {
	p := newPool(newFakeClock().Now, 1<<20)
	if p.size != 1<<17-2 {
		t.Errorf("size = %d, want %d (the /15 less network and broadcast)", p.size, 1<<17-2)
	}
}
