package policy

import (
	"errors"
	"strings"
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
		"GET,HEAD github.com/*", "read github.com", "POST api.example.com/v1/messages", "x.com:443/a*b",
		"get x.com/%7e%2F%25/*", "GET 192.0.2.1", "x.com /a", "GET, HEAD x", "x.com/a/../b", "x.com/a?b",
		"x.com/a%2F..%2Fb", "*.x.com/@s/*", "READ,delete x.com/%C3%A9*",
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
			for _, m := range r.Methods {
				if !httpMethods[m] {
					t.Fatalf("ParseEntry(%q) method %q", s, m)
				}
			}
			if r.Path != "" {
				if g, err := normalizeGlob(r.Path); err != nil || g != r.Path {
					t.Fatalf("ParseEntry(%q) path %q normalizes to %q, %v", s, r.Path, g, err)
				}
			}
			// The rule matches what it names.
			p := Compile([]Rule{{Name: r.Name, Wildcard: r.Wildcard, Port: r.Port, Action: Allow, Methods: r.Methods, Path: r.Path}})
			probe := r.Name
			if r.Wildcard {
				probe = "x." + r.Name
			}
			if len(probe) > maxName {
				return
			}
			d := p.Name(probe, r.Port)
			if d.Verdict != Allow || d.Inspect != r.IsRequest() {
				t.Fatalf("rule %+v: Name(%q) = %+v", r, probe, d)
			}
			method, path := "GET", "/"
			if r.Methods != nil {
				method = r.Methods[0]
			}
			if r.Path != "" {
				path = strings.ReplaceAll(r.Path, "*", "x")
			}
			// Path parameters are dropped by the loose reading of a
			// request but kept in a pattern: such a rule allows only in
			// the strict reading, by design.
			if !strings.Contains(r.Path, ";") && p.Request(probe, r.Port, method, path).Verdict != Allow {
				t.Fatalf("rule %+v does not match %s %q on %q", r, method, path, probe)
			}
		case r.Prefix.IsValid():
			if r.Prefix != r.Prefix.Masked() || r.Prefix.Addr().Zone() != "" || r.Prefix.Addr().Is4In6() {
				t.Fatalf("ParseEntry(%q) prefix %v", s, r.Prefix)
			}
			if r.IsRequest() {
				t.Fatalf("ParseEntry(%q) = %+v: an address rule with methods or a path", s, r)
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

// FuzzNormalizePath: request paths come from the guest. NormalizePath
// must not panic, must be idempotent, and its result must have no empty,
// "." or ".." segment left for a rule to trip over; the loose reading
// must not panic either.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{
		"/", "/a/b", "/a/../b", "//a", "/%61dmin", "/admin%2F..", "/a%2", "/%zz", "/a?b#c", "*",
		"/x/..;/y", "/a\\b", "/%2525252541", "/caf\u00e9", "/a/b/.", "/.%2e/", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if l, ok := loosePath(s); ok && (l == "" || l[0] != '/') {
			t.Fatalf("loosePath(%q) = %q", s, l)
		}
		n, err := NormalizePath(s)
		if err != nil {
			if !errors.Is(err, ErrPath) {
				t.Fatalf("NormalizePath(%q): %v is not ErrPath", s, err)
			}
			return
		}
		if n == "" || n[0] != '/' {
			t.Fatalf("NormalizePath(%q) = %q", s, n)
		}
		segs := strings.Split(n[1:], "/")
		for i, seg := range segs {
			if seg == "." || seg == ".." || seg == "" && i < len(segs)-1 {
				t.Fatalf("NormalizePath(%q) = %q: segment %d is %q", s, n, i, seg)
			}
		}
		if again, err := NormalizePath(n); err != nil || again != n {
			t.Fatalf("NormalizePath(%q) = %q, then %q, %v: not idempotent", s, n, again, err)
		}
	})
}

// FuzzRequest: whatever a guest sends, Request must not panic and must
// agree with Name where the gate relies on it: a connection Name denies
// carries no allowed request, and on one Name allows without Inspect
// (which the gate splices unread) every request is allowed.
func FuzzRequest(f *testing.F) {
	for _, s := range []struct{ name, method, path string }{
		{"github.com", "GET", "/a"}, {"github.com", "POST", "/a"}, {"api.github.com", "DELETE", "/x"},
		{"b.example", "GET", "/%61dmin"}, {"b.example", "get", "/x/..%2Fadmin"}, {"ro.example", "PUT", "/"},
		{"x.veto.example", "DELETE", "/a"}, {"x.veto.example", "GET", "/%zz"}, {"p.example", "GET", "*"},
	} {
		f.Add(s.name, s.method, s.path, uint16(443))
	}
	p := compile(f,
		r{LayerNamed, Allow, "github.com"},
		r{LayerNamed, Allow, "api.github.com"},
		r{LayerUser, Allow, "GET,HEAD github.com/*"},
		r{LayerUser, Allow, "api.github.com"},
		r{LayerProject, Block, "DELETE api.github.com/repos/*"},
		r{LayerUser, Allow, "b.example"},
		r{LayerUser, Block, "b.example/admin*"},
		r{LayerUser, Allow, "GET b.example/admin/status"},
		r{LayerBuiltin, Allow, "ro.example"},
		r{LayerUser, Allow, "read ro.example"},
		r{LayerPreset, Allow, "*.veto.example"},
		r{LayerUser, Block, "DELETE *.veto.example/*"},
		r{LayerUser, Allow, "p.example:443"},
		r{LayerUser, Allow, "POST p.example:8443/v1/*"},
		r{LayerUser, Block, "p.example"},
	)
	f.Fuzz(func(t *testing.T, name, method, path string, port uint16) {
		d := p.Request(name, port, method, path)
		if d.Inspect || d.Verdict == Allow && (d.Rule == nil || d.Rule.Action != Allow) {
			t.Fatalf("Request(%q, %d, %q, %q) = %+v", name, port, method, path, d)
		}
		n := p.Name(name, port)
		switch {
		case n.Verdict != Allow && d.Verdict == Allow:
			t.Fatalf("Name(%q, %d) denies but Request(%q, %q) = %+v", name, port, method, path, d)
		case n.Verdict == Allow && !n.Inspect && d.Verdict != Allow:
			t.Fatalf("Name(%q, %d) allows without Inspect but Request(%q, %q) = %+v", name, port, method, path, d)
		}
	})
}
