package gate

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestBindingsNames(t *testing.T) {
	clock := newFakeClock()
	b := NewBindings(clock.Now)
	now := clock.Now()
	ip1, ip2 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	b.Add("one.example.test", []netip.Addr{ip1, ip2}, SourceObserved, now.Add(time.Minute))
	b.Add("two.example.test", []netip.Addr{ip1}, SourceResolved, now.Add(2*time.Minute))
	b.Add("Three.Example.Test.", []netip.Addr{netip.AddrFrom16(ip1.As16())}, SourceGranted, now.Add(3*time.Minute))

	tests := []struct {
		name    string
		advance time.Duration
		ip      netip.Addr
		want    []Binding
	}{
		{"all live, most recent first", 0, ip1, []Binding{
			{"three.example.test", SourceGranted, now.Add(3 * time.Minute)},
			{"two.example.test", SourceResolved, now.Add(2 * time.Minute)},
			{"one.example.test", SourceObserved, now.Add(time.Minute)},
		}},
		{"mapped address", 0, netip.AddrFrom16(ip2.As16()), []Binding{
			{"one.example.test", SourceObserved, now.Add(time.Minute)},
		}},
		{"unbound", 0, netip.MustParseAddr("192.0.2.3"), nil},
		{"first expired", time.Minute, ip1, []Binding{
			{"three.example.test", SourceGranted, now.Add(3 * time.Minute)},
			{"two.example.test", SourceResolved, now.Add(2 * time.Minute)},
		}},
		{"expired everywhere", 0, ip2, nil},
		{"all expired", 2 * time.Minute, ip1, nil},
	}
	for _, tt := range tests {
		clock.Advance(tt.advance)
		if got := b.Names(tt.ip); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Names(%v) = %v, want %v", tt.name, tt.ip, got, tt.want)
		}
	}
	if got := b.Len(); got != 0 {
		t.Errorf("Len after every binding expired and was looked up = %d, want 0", got)
	}
}

func TestBindingsRefresh(t *testing.T) {
	clock := newFakeClock()
	b := NewBindings(clock.Now)
	now := clock.Now()
	ip := netip.MustParseAddr("192.0.2.1")
	b.Add("one.example.test", []netip.Addr{ip}, SourceObserved, now.Add(time.Hour))
	b.Add("two.example.test", []netip.Addr{ip}, SourceObserved, now.Add(time.Hour))
	// Seen again with a shorter lifetime: it becomes the most recent, but
	// keeps the longer lifetime the guest was already promised.
	b.Add("one.example.test", []netip.Addr{ip}, SourceObserved, now.Add(time.Minute))
	want := []Binding{
		{"one.example.test", SourceObserved, now.Add(time.Hour)},
		{"two.example.test", SourceObserved, now.Add(time.Hour)},
	}
	if got := b.Names(ip); !slices.Equal(got, want) {
		t.Errorf("Names = %v, want %v", got, want)
	}
	if got := b.Len(); got != 2 {
		t.Errorf("Len = %d, want 2 (a refresh adds nothing)", got)
	}
}

func TestBindingsBounded(t *testing.T) {
	clock := newFakeClock()
	b := NewBindings(clock.Now)
	b.max = 3
	until := clock.Now().Add(time.Hour)
	for i := range 5 {
		b.Add(fmt.Sprintf("n%d.example.test", i), []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})}, SourceObserved, until)
	}
	if got := b.Len(); got != 3 {
		t.Errorf("Len = %d, want 3", got)
	}
	for i := range 5 {
		got := len(b.Names(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})))
		if want := map[bool]int{true: 0, false: 1}[i < 2]; got != want {
			t.Errorf("names for n%d = %d, want %d (oldest evicted first)", i, got, want)
		}
	}

	// One address shared by many names keeps the most recent ones.
	b = NewBindings(clock.Now)
	ip := netip.MustParseAddr("192.0.2.100")
	for i := range maxNamesPerAddr + 10 {
		b.Add(fmt.Sprintf("cdn%d.example.test", i), []netip.Addr{ip}, SourceObserved, until)
	}
	got := b.Names(ip)
	if len(got) != maxNamesPerAddr {
		t.Fatalf("names for a shared address = %d, want %d", len(got), maxNamesPerAddr)
	}
	if want := fmt.Sprintf("cdn%d.example.test", maxNamesPerAddr+9); got[0].Name != want {
		t.Errorf("most recent = %q, want %q", got[0].Name, want)
	}
	if got := b.Len(); got != maxNamesPerAddr {
		t.Errorf("Len = %d, want %d", got, maxNamesPerAddr)
	}
}

func TestBindingsSweepExpired(t *testing.T) {
	clock := newFakeClock()
	b := NewBindings(clock.Now)
	for i := range 4 {
		b.Add(fmt.Sprintf("old%d.example.test", i), []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})}, SourceObserved, clock.Now().Add(time.Second))
	}
	clock.Advance(time.Minute)
	b.Add("new.example.test", []netip.Addr{netip.MustParseAddr("192.0.2.200")}, SourceObserved, clock.Now().Add(time.Hour))
	if got := b.Len(); got != 1 {
		t.Errorf("Len = %d, want 1 (expired bindings swept on Add)", got)
	}
}
