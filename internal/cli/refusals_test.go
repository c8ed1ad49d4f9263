package cli

import (
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
)

func TestAllowHint(t *testing.T) {
	tests := []struct {
		en   audit.Entry
		want string
	}{
		{audit.Entry{Dest: "evil.example:443", Name: "evil.example", Ports: []uint16{443}, Proto: "tcp", Reason: "no rule allows it"},
			"moat network allow api evil.example"},
		{audit.Entry{Dest: "db.example:5432", Name: "db.example", Ports: []uint16{5432}, Proto: "tcp", Reason: "no rule allows it"},
			"moat network allow api db.example:5432"},
		{audit.Entry{Dest: "203.0.113.9:22", Ports: []uint16{22}, Proto: "tcp"},
			"moat network allow api 203.0.113.9:22"},
		{audit.Entry{Dest: "t.example:443", Name: "t.example", Ports: []uint16{443}, Proto: "tcp", Rule: "t.example", Reason: "blocked by rule"},
			"remove that block: moat network list api"},
		{audit.Entry{Dest: "api.example:443", Name: "api.example", Ports: []uint16{443}, Proto: "http", Reason: "no rule allows it"},
			"a request rule allows it: moat network suggest api"},
		// Refused for the sandbox's safety: no allow rule to offer.
		{audit.Entry{Dest: "10.0.0.5:80", Ports: []uint16{80}, Proto: "tcp", Reason: "private address (RFC 1918)"}, ""},
		{audit.Entry{Dest: "203.0.113.9:443", Ports: []uint16{443}, Proto: "udp", Reason: "udp is not carried"}, ""},
	}
	for _, tt := range tests {
		if got := allowHint("api", tt.en); got != tt.want {
			t.Errorf("allowHint(%+v) = %q, want %q", tt.en, got, tt.want)
		}
	}
}

func TestRefusalsSince(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	// The ledger lists the most recent first.
	entries := []audit.Entry{
		{Dest: "c:443", Last: t0.Add(3 * time.Second)},
		{Dest: "b:443", Last: t0.Add(time.Second)},
		{Dest: "a:443", Last: t0.Add(-time.Second)},
	}
	var got []string
	for _, en := range refusalsSince(entries, t0) {
		got = append(got, en.Dest)
	}
	if strings.Join(got, " ") != "b:443 c:443" {
		t.Errorf("refusalsSince = %v, want [b:443 c:443] (oldest first, none before the session)", got)
	}
}
