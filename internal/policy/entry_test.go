package policy

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestParseEntry(t *testing.T) {
	pfx := netip.MustParsePrefix
	tests := []struct {
		in   string
		want Rule
	}{
		{"example.com", Rule{Name: "example.com"}},
		{"Example.COM", Rule{Name: "example.com"}},
		{"example.com.", Rule{Name: "example.com"}},
		{"*.example.com", Rule{Name: "example.com", Wildcard: true}},
		{"*.Example.com.", Rule{Name: "example.com", Wildcard: true}},
		{"example.com:443", Rule{Name: "example.com", Port: 443}},
		{"*.Example.com:443", Rule{Name: "example.com", Wildcard: true, Port: 443}},
		{"example.com.:8080", Rule{Name: "example.com", Port: 8080}},
		{"example.com:65535", Rule{Name: "example.com", Port: 65535}},
		{"example.com:1", Rule{Name: "example.com", Port: 1}},
		{"localhost", Rule{Name: "localhost"}},
		{"search", Rule{Name: "search"}}, // a rare method, a plausible host
		{"getter", Rule{Name: "getter"}},
		{"a", Rule{Name: "a"}},
		{"*.com", Rule{Name: "com", Wildcard: true}},
		{"_dmarc.example.com", Rule{Name: "_dmarc.example.com"}},
		{"r4---sn-abc.example.com", Rule{Name: "r4---sn-abc.example.com"}},
		{"3com.example", Rule{Name: "3com.example"}},
		{"bücher.example", Rule{Name: "xn--bcher-kva.example"}},
		{"BÜCHER.example", Rule{Name: "xn--bcher-kva.example"}},
		{"*.bücher.example:443", Rule{Name: "xn--bcher-kva.example", Wildcard: true, Port: 443}},
		{"XN--BCHER-KVA.example", Rule{Name: "xn--bcher-kva.example"}},
		{"bücher。example", Rule{Name: "xn--bcher-kva.example"}}, // ideographic full stop
		{"192.0.2.1", Rule{Prefix: pfx("192.0.2.1/32")}},
		{"192.0.2.1:443", Rule{Prefix: pfx("192.0.2.1/32"), Port: 443}},
		{"10.20.0.0/16", Rule{Prefix: pfx("10.20.0.0/16")}},
		{"0.0.0.0/0", Rule{Prefix: pfx("0.0.0.0/0")}},
		{"192.0.2.7/32", Rule{Prefix: pfx("192.0.2.7/32")}},
		{"2001:db8::1", Rule{Prefix: pfx("2001:db8::1/128")}},
		{"2001:DB8::1", Rule{Prefix: pfx("2001:db8::1/128")}},
		{"[2001:db8::1]", Rule{Prefix: pfx("2001:db8::1/128")}},
		{"[2001:db8::1]:443", Rule{Prefix: pfx("2001:db8::1/128"), Port: 443}},
		{"2001:db8::/32", Rule{Prefix: pfx("2001:db8::/32")}},
		{"::/0", Rule{Prefix: pfx("::/0")}},
		{"0.0.0.0/0:25", Rule{Prefix: pfx("0.0.0.0/0"), Port: 25}},
		{"10.0.0.0/8:443", Rule{Prefix: pfx("10.0.0.0/8"), Port: 443}},
		{"2001:db8::/32:443", Rule{Prefix: pfx("2001:db8::/32"), Port: 443}},
		{"[2001:db8::/32]:443", Rule{Prefix: pfx("2001:db8::/32"), Port: 443}},
		{"[2001:db8::/32]", Rule{Prefix: pfx("2001:db8::/32")}},
		{"::1", Rule{Prefix: pfx("::1/128")}},
		// An IPv6 address ending in what looks like a port is an address:
		// ports on IPv6 need brackets.
		{"2001:db8::1:443", Rule{Prefix: pfx("2001:db8::1:443/128")}},
		// Request rules: methods upper case and deduplicated, "read"
		// expanded, paths normalized.
		{"GET,HEAD github.com/*", Rule{Name: "github.com", Methods: []string{"GET", "HEAD"}, Path: "/*"}},
		{"get,Head GitHub.com/*", Rule{Name: "github.com", Methods: []string{"GET", "HEAD"}, Path: "/*"}},
		{"read github.com", Rule{Name: "github.com", Methods: []string{"GET", "HEAD", "OPTIONS"}}},
		{"READ,post,GET github.com", Rule{Name: "github.com", Methods: []string{"GET", "HEAD", "OPTIONS", "POST"}}},
		{"POST api.example.com/v1/messages", Rule{Name: "api.example.com", Methods: []string{"POST"}, Path: "/v1/messages"}},
		{"DELETE api.example.com/*", Rule{Name: "api.example.com", Methods: []string{"DELETE"}, Path: "/*"}},
		{"PROPFIND dav.example.com:8443/files/*", Rule{Name: "dav.example.com", Port: 8443, Methods: []string{"PROPFIND"}, Path: "/files/*"}},
		{"GET  x.example/a", Rule{Name: "x.example", Methods: []string{"GET"}, Path: "/a"}},
		{"github.com/*", Rule{Name: "github.com", Path: "/*"}},
		{"x.com/path", Rule{Name: "x.com", Path: "/path"}},
		{"x.com:443/path", Rule{Name: "x.com", Port: 443, Path: "/path"}},
		{"*.example.com/v1/*", Rule{Name: "example.com", Wildcard: true, Path: "/v1/*"}},
		{"x.example/", Rule{Name: "x.example", Path: "/"}},
		{"x.example/a/", Rule{Name: "x.example", Path: "/a/"}},
		{"x.example/a*b*c", Rule{Name: "x.example", Path: "/a*b*c"}},
		{"npm.example/@scope/*", Rule{Name: "npm.example", Path: "/@scope/*"}},
		{"x.example/%7euser/*", Rule{Name: "x.example", Path: "/~user/*"}},
		{"x.example/%61dmin", Rule{Name: "x.example", Path: "/admin"}},
		{"gitlab.example/api/v4/projects/group%2fproject/*", Rule{Name: "gitlab.example", Path: "/api/v4/projects/group%2Fproject/*"}},
		{"x.example/caf\u00e9", Rule{Name: "x.example", Path: "/caf%C3%A9"}},
		{"x.example/a%20b", Rule{Name: "x.example", Path: "/a%20b"}},
		{"x.example/.well-known/*", Rule{Name: "x.example", Path: "/.well-known/*"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseEntry(tt.in)
			if err != nil {
				t.Fatalf("ParseEntry(%q): %v", tt.in, err)
			}
			tt.want.Entry = tt.in
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseEntry(%q)\n got %+v\nwant %+v", tt.in, got, tt.want)
			}
			if got.IsAddr() != tt.want.Prefix.IsValid() {
				t.Errorf("IsAddr() = %v", got.IsAddr())
			}
		})
	}
}

// TestParseEntryErrors checks that each bad entry is refused with a
// message that says what to write. want holds substrings.
func TestParseEntryErrors(t *testing.T) {
	long := strings.Repeat("a", 64)
	tests := []struct {
		in   string
		want []string
	}{
		{"", []string{`"": empty entry; remove it`}},
		{"http://x.com", []string{`"http://x.com": a URL, not a rule; write x.com`}},
		{"https://x.com/path?q=1", []string{"a URL, not a rule; write x.com"}},
		{"https://x.com:8443/", []string{"write x.com:8443"}},
		{"https://user:pw@x.com/", []string{"write x.com"}},
		{"https://[2001:db8::1]:8443/", []string{"write [2001:db8::1]:8443"}},
		{"ftp://", []string{"a URL", `write the host name alone`}},
		{"/etc/hosts", []string{"a path without a host", `"example.com/api/*"`}},
		{"x.com:443:80/path", []string{"not a name or an address"}},
		{"user@x.com", []string{"user info is not part of a rule", "write x.com"}},
		{"git@github.com:owner/repo", []string{"user info", "write github.com"}},
		{"*", []string{"a wildcard alone would match every name", `"*.example.com"`}},
		{"*.*", []string{"a wildcard alone"}},
		{"*.", []string{"a wildcard alone"}},
		{"*:443", []string{"a wildcard alone"}},
		{"*foo.com", []string{"a wildcard must be a whole first label; write *.foo.com (every subdomain) or foo.com"}},
		{"foo.*.com", []string{"a wildcard must be a whole first label; write *.com"}},
		{"*.*.example.com", []string{"write *.example.com"}},
		{"**.example.com", []string{"write *.example.com"}},
		{"foo*", []string{"write *.foo (every subdomain) or foo"}},
		{"example.com:", []string{"empty port"}},
		{"example.com:0", []string{"port 0 is out of range", "leave the port off"}},
		{"example.com:65536", []string{"port 65536 is out of range"}},
		{"example.com:99999999999999999999", []string{"out of range"}},
		{"example.com:https", []string{`port "https" is not a number`}},
		{"example.com:-1", []string{`port "-1" is not a number`}},
		{"example.com:+1", []string{`is not a number`}},
		{":443", []string{"no host before the port"}},
		{"a:b:c", []string{"not an IPv6 address", "[2001:db8::1]:443"}},
		{"example..com", []string{"empty label"}},
		{".example.com", []string{"empty label"}},
		{"example.com..", []string{"empty label"}},
		{long + ".com", []string{"is 64 characters long; the most is 63"}},
		{strings.Repeat("a.", 127) + "com", []string{"the most a name can have is 253"}},
		{"exa mple.com", []string{"white space"}},
		{" example.com", []string{`contains white space; write "example.com"`}},
		{"example.com\n", []string{`contains white space; write "example.com"`}},
		{"exa\x00mple.com", []string{"control characters"}},
		{"exa!mple.com", []string{`'!' is not allowed in a name`}},
		{"[::1", []string{`unclosed "["`}},
		{"[::1]x", []string{`unexpected "x" after "]"`}},
		{"[::1]:0", []string{"port 0 is out of range"}},
		{"[192.0.2.1]:443", []string{"brackets are for IPv6 only"}},
		{"[example.com]:443", []string{"brackets are for IPv6 only"}},
		{"[192.0.2.0/24]:443", []string{"brackets are for IPv6 only"}},
		{"10.0.0.0/8:0", []string{"port 0 is out of range"}},
		{"10.0.0.0/8:", []string{"empty port"}},
		{"10.0.0.0/08", []string{"bad prefix length /08"}},
		{"10.0.0.0/", []string{"bad prefix length /;"}},
		{"2001:db8::/129", []string{"bad prefix length /129"}},
		{"10.1.2.3/8", []string{"host bits are set; write 10.0.0.0/8 for the network, or 10.1.2.3 for the one address"}},
		{"2001:db8::1/32", []string{"host bits are set; write 2001:db8::/32"}},
		{"10.0.0.0/33", []string{"bad prefix length /33"}},
		{"10.0.0.0/x", []string{"bad prefix length /x"}},
		{"fe80::1%eth0", []string{"a zone (%eth0) is not part of a rule; write fe80::1"}},
		{"[fe80::1%eth0]:22", []string{"a zone"}},
		{"::ffff:127.0.0.1", []string{"IPv4-mapped", "write the IPv4 address 127.0.0.1"}},
		{"[::ffff:10.0.0.1]:443", []string{"write the IPv4 address 10.0.0.1"}},
		{"::ffff:10.0.0.0/104", []string{"write the IPv4 prefix 10.0.0.0/8"}},
		// IPv4 shorthand that resolvers and browsers read as an address.
		{"2130706433", []string{"IPv4 shorthand; write the dotted address 127.0.0.1"}},
		{"2130706433:80", []string{"write the dotted address 127.0.0.1"}},
		{"127.1", []string{"write the dotted address 127.0.0.1"}},
		{"0x7f.0.0.1", []string{"write the dotted address 127.0.0.1"}},
		{"0177.0.0.1", []string{"write the dotted address 127.0.0.1"}},
		{"0x7f000001", []string{"write the dotted address 127.0.0.1"}},
		{"10.1.258", []string{"write the dotted address 10.1.1.2"}},
		{"192.168.1.256", []string{"is a number, so this is neither a name nor an IPv4 address"}},
		{"1.2.3.4.5", []string{"is a number"}},
		{"example.123", []string{`the last label "123" is a number`}},
		{"example.0x1f", []string{`the last label "0x1f" is a number`}},
		{"*.10.0.0.1", []string{"IPv4 shorthand"}},
		{"xn--zz.example", []string{"not a valid internationalized name"}},
		{"a\u200db.example", []string{"not a valid internationalized name"}}, // zero width joiner out of context
		// Request rules.
		{"GET 192.0.2.1", []string{"methods and paths apply to names only", "terminates TLS by the name", `"GET,HEAD example.com/api/*"`}},
		{"read [2001:db8::1]:443", []string{"methods and paths apply to names only"}},
		{"GET 10.0.0.0/8", []string{"methods and paths apply to names only"}},
		{"192.0.2.1/admin", []string{"methods and paths apply to names only"}},
		{"192.0.2.1/admin/*", []string{"methods and paths apply to names only"}},
		{"GTE github.com/*", []string{`"GTE" is not an HTTP method`, `"read" for GET, HEAD and OPTIONS`, `e.g. "GET,HEAD github.com/*"`}},
		{"exa mple.com", []string{`"exa" is not an HTTP method (white space separates methods from the name)`}},
		{"GET,,HEAD x.com", []string{`an empty method in "GET,,HEAD"`, `"GET,HEAD x.com"`}},
		{"GET, HEAD x.com/*", []string{`white space inside the list of methods; write "GET,HEAD x.com/*"`}},
		{"x.com /path", []string{`white space between the name and its path; write "x.com/path"`}},
		{"a.com b.com", []string{"contains white space; write one rule per entry"}},
		{"GET a.com b.com", []string{"contains white space; write one rule per entry"}},
		{"GET\tx.com", []string{"control characters"}},
		{"GET x.com/a?b=1", []string{`a query or fragment is not matched, only the path; write "GET x.com/a"`}},
		{"x.com/a#top", []string{`write "x.com/a"`}},
		{"GET x.com/a//b", []string{`an empty path segment ("//") never matches`}},
		{"GET x.com/a/../b", []string{`a "." or ".." segment never matches`, "write the path they lead to"}},
		{"GET x.com/./b", []string{`a "." or ".." segment`}},
		{"GET x.com/%2e%2E/b", []string{`a "." or ".." segment`}},
		{"GET x.com/a%2F..%2Fb", []string{`escaped slashes around a "." or ".." segment`}},
		{"GET x.com/a%252F..%252Fb", []string{`escaped slashes around`}},
		{"GET x.com/a%zz", []string{`a "%" in the path is not followed by two hex digits`}},
		{"GET x.com/a%2", []string{`not followed by two hex digits`}},
		{"GET x.com:0/a", []string{"port 0 is out of range"}},
		{"GET *", []string{"a wildcard alone"}},
		{"GET */a", []string{"a wildcard alone"}},
		{"GET https://x.com/a", []string{"a URL, not a rule; write x.com"}},
		{"GET user@x.com/a", []string{"user info is not part of a rule", "write x.com"}},
		{"GET", []string{`"GET": HTTP methods, not a host`, `"GET example.com/path" (quoted in a shell)`}},
		{"read", []string{"HTTP methods, not a host"}},
		{"GET,HEAD", []string{"HTTP methods, not a host"}},
		{"get,propfind", []string{"HTTP methods, not a host"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseEntry(tt.in)
			if err == nil {
				t.Fatalf("ParseEntry(%q) = %+v, want an error", tt.in, got)
			}
			if !errors.Is(err, ErrEntry) {
				t.Errorf("errors.Is(%v, ErrEntry) = false", err)
			}
			var ee *EntryError
			if !errors.As(err, &ee) || ee.Entry != tt.in {
				t.Errorf("error %v: want an *EntryError naming %q", err, tt.in)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("ParseEntry(%q) error\n  %v\nwant it to contain\n  %s", tt.in, err, w)
				}
			}
		})
	}
}

func TestNormalizeName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"example.com", "example.com"},
		{"EXAMPLE.Com", "example.com"},
		{"example.com.", "example.com"},
		{"a.b.c.example.com", "a.b.c.example.com"},
		{"münchen.example", "xn--mnchen-3ya.example"},
		{"MÜNCHEN.example", "xn--mnchen-3ya.example"},
		{"xn--mnchen-3ya.example", "xn--mnchen-3ya.example"},
		{"Xn--Mnchen-3ya.Example.", "xn--mnchen-3ya.example"},
		{"faß.example", "xn--fa-hia.example"}, // non-transitional: ß stays ß
		{"ｅｘａｍｐｌｅ.com", "example.com"},        // full width folds
		{"例え.テスト", "xn--r8jz45g.xn--zckzah"},
		{"under_score.example", "under_score.example"},
		{"-lead.example", "-lead.example"},
		{strings.Repeat("a", 63) + ".com", strings.Repeat("a", 63) + ".com"},
	}
	for _, tt := range tests {
		got, err := NormalizeName(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("NormalizeName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			continue
		}
		again, err := NormalizeName(got)
		if err != nil || again != got {
			t.Errorf("NormalizeName(%q) = %q, %v; not idempotent", got, again, err)
		}
	}
	for _, in := range []string{"", ".", "..", "a..b", "*.example.com", "a b", "127.0.0.1", "1.2.3.4.", "example.com:443", "a/b", "[::1]", "::1"} {
		if got, err := NormalizeName(in); err == nil {
			t.Errorf("NormalizeName(%q) = %q, want an error", in, got)
		}
	}
}

func TestFromEntries(t *testing.T) {
	got, err := FromEntries([]string{"a.example", "10.0.0.0/8:", "*.b.example:22"}, Allow, LayerUser, "moat.toml")
	if err == nil {
		t.Fatalf("FromEntries with a bad entry = %v, want an error", got)
	}
	if got != nil || !errors.Is(err, ErrEntry) || !strings.HasPrefix(err.Error(), "moat.toml: ") {
		t.Errorf("FromEntries: got %v, %v; want nil rules and a wrapped ErrEntry", got, err)
	}

	got, err = FromEntries([]string{"a.example", "*.b.example:22"}, Block, LayerProject, "moat.toml")
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{Entry: "a.example", Action: Block, Layer: LayerProject, Source: "moat.toml", Name: "a.example"},
		{Entry: "*.b.example:22", Action: Block, Layer: LayerProject, Source: "moat.toml", Name: "b.example", Wildcard: true, Port: 22},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d rules, want %d", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("rule %d\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

func TestStrings(t *testing.T) {
	tests := []struct{ got, want string }{
		{Action(Allow).String(), "allow"},
		{Block.String(), "block"},
		{Action(0).String(), "Action(0)"},
		{LayerBuiltin.String(), "builtin"},
		{LayerNamed.String(), "policy"},
		{LayerPreset.String(), "preset"},
		{LayerUser.String(), "user"},
		{LayerProject.String(), "project"},
		{LayerRuntime.String(), "runtime"},
		{Layer(9).String(), "Layer(9)"},
		{Verdict(Allow).String(), "allow"},
		{Deny.String(), "deny"},
		{Verdict(7).String(), "deny"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestAllowEntry(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.9")
	tests := []struct {
		name string
		addr netip.Addr
		port uint16
		want string
	}{
		{"api.example", ip, 443, "api.example"},
		{"api.example", ip, 80, "api.example"},
		{"api.example", netip.Addr{}, 0, "api.example"},
		{"git.example", ip, 22, "git.example:22"},
		{"", ip, 443, "203.0.113.9:443"},
		{"", ip, 5432, "203.0.113.9:5432"},
	}
	for _, tt := range tests {
		if got := AllowEntry(tt.name, tt.addr, tt.port); got != tt.want {
			t.Errorf("AllowEntry(%q, %v, %d) = %q, want %q", tt.name, tt.addr, tt.port, got, tt.want)
		}
		// What it offers must parse as an allow rule.
		if _, err := ParseEntry(AllowEntry(tt.name, tt.addr, tt.port)); err != nil {
			t.Errorf("AllowEntry(%q, %v, %d) does not parse: %v", tt.name, tt.addr, tt.port, err)
		}
	}
}
