package daemon

import (
	"net/netip"
	"testing"

	"moat.dev/moat/internal/gate"
)

func TestSuggestAndRegistrable(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.7")
	for _, tt := range []struct {
		q            gate.Question
		suggest, dom string
	}{
		{gate.Question{Name: "api.example.com", Addr: ip, Port: 443}, "api.example.com", "example.com"},
		{gate.Question{Name: "example.com", Addr: ip, Port: 80}, "example.com", "example.com"},
		{gate.Question{Name: "git.example.co.uk", Addr: ip, Port: 22}, "git.example.co.uk:22", "example.co.uk"},
		{gate.Question{Name: "a.b.tracker.example.github.io", Addr: ip, Port: 443}, "a.b.tracker.example.github.io", "example.github.io"},
		{gate.Question{Name: "x.blockme.test", Addr: ip, Port: 443}, "x.blockme.test", "blockme.test"},
		{gate.Question{Name: "localhostish", Addr: ip, Port: 443}, "localhostish", "localhostish"},
		{gate.Question{Addr: ip, Port: 5432}, "203.0.113.7:5432", ""},
	} {
		if got := suggestEntry(tt.q); got != tt.suggest {
			t.Errorf("suggestEntry(%+v) = %q, want %q", tt.q, got, tt.suggest)
		}
		if tt.q.Name == "" {
			continue
		}
		if got := registrable(tt.q.Name); got != tt.dom {
			t.Errorf("registrable(%q) = %q, want %q", tt.q.Name, got, tt.dom)
		}
	}
}
