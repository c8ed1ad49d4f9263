package policy

import (
	"errors"
	"testing"
)

// FuzzParseEntry: entries come from files moat does not control (a
// project's moat.toml) and from the interactive gate. ParseEntry must
// never panic, must fail only with an *EntryError, and a rule it accepts
// must be consistent: a name rule is normalized and has no prefix, an
// address rule the reverse, and its name parses back to itself.
func FuzzParseEntry(f *testing.F) {
	for _, s := range []string{
		"example.com", "*.Example.com:443", "bücher.example", "xn--bcher-kva.example.",
		"192.0.2.1", "192.0.2.1:443", "10.0.0.0/8", "0.0.0.0/0:25", "::1", "[2001:db8::1]:443",
		"[2001:db8::/32]:443", "fe80::1%eth0", "::ffff:127.0.0.1", "2130706433", "0x7f.1",
		"http://x.com", "x.com/p", "user@x.com", "*", "*foo.com", "a..b", "a:0", "[::1", "\x00",
		"ｅｘａｍｐｌｅ.com", "a\u200db", "\u0660.example",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseEntry(s)
		if err != nil {
			var ee *EntryError
			if !errors.As(err, &ee) || !errors.Is(err, ErrEntry) || ee.Entry != s {
				t.Fatalf("ParseEntry(%q): error %v is not an *EntryError for the entry", s, err)
			}
			return
		}
		if r.Entry != s || r.Action != 0 || r.Source != "" {
			t.Fatalf("ParseEntry(%q) = %+v: fields it must not set", s, r)
		}
		switch {
		case r.Name != "":
			if r.Prefix.IsValid() {
				t.Fatalf("ParseEntry(%q) = %+v: both a name and a prefix", s, r)
			}
			if n, err := NormalizeName(r.Name); err != nil || n != r.Name {
				t.Fatalf("ParseEntry(%q) name %q normalizes to %q, %v", s, r.Name, n, err)
			}
			// The rule matches what it names.
			p := Compile([]Rule{{Name: r.Name, Wildcard: r.Wildcard, Port: r.Port, Action: Allow}})
			probe := r.Name
			if r.Wildcard {
				probe = "x." + r.Name
			}
			if len(probe) <= maxName && p.Name(probe, r.Port).Verdict != Allow {
				t.Fatalf("rule %+v does not match %q", r, probe)
			}
		case r.Prefix.IsValid():
			if r.Prefix != r.Prefix.Masked() || r.Prefix.Addr().Zone() != "" || r.Prefix.Addr().Is4In6() {
				t.Fatalf("ParseEntry(%q) prefix %v", s, r.Prefix)
			}
		default:
			t.Fatalf("ParseEntry(%q) = %+v: neither a name nor a prefix", s, r)
		}
	})
}

// FuzzName: any name a guest sends (DNS question, SNI, Host header) must
// be decided without a panic, NormalizeName must be idempotent, and a
// name that normalizes is decided the same as its normal form.
func FuzzName(f *testing.F) {
	for _, s := range []string{
		"example.com", "A.B.Example.COM.", "münchen.example", "xn--mnchen-3ya.example", "xn--zz",
		"127.1", "", ".", "a..b", "*.example.com", "r4---sn-abc.example.com", "faß.example",
		"ｅｘａｍｐｌｅ。com", "\xff\xfe", "a.b.c.d.e.f.g.h.wild.example",
	} {
		f.Add(s, uint16(443))
	}
	p := compile(f,
		r{LayerUser, Allow, "*.example.com"},
		r{LayerUser, Block, "b.example.com:443"},
		r{LayerProject, Allow, "münchen.example"},
		r{LayerUser, Allow, "*.wild.example:8443"},
	)
	f.Fuzz(func(t *testing.T, s string, port uint16) {
		d := p.Name(s, port)
		n, err := NormalizeName(s)
		if err != nil {
			if d.Verdict == Allow || d.Rule != nil {
				t.Fatalf("Name(%q) = %+v for a name that does not normalize (%v)", s, d, err)
			}
			return
		}
		again, err := NormalizeName(n)
		if err != nil || again != n {
			t.Fatalf("NormalizeName(%q) = %q, then %q, %v: not idempotent", s, n, again, err)
		}
		if dn := p.Name(n, port); dn != d {
			t.Fatalf("Name(%q) = %+v but Name(%q) = %+v", s, d, n, dn)
		}
		_ = p.Name(s, 0)
	})
}
