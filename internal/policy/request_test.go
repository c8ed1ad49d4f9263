package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// rq is a request and the decision it must get: verdict, and the entry
// and layer of the deciding rule ("" for none).
type rq struct {
	name         string
	method, path string
	allow        bool
	entry        string
	layer        Layer
}

func checkRequest(t *testing.T, p *Policy, qs []rq) {
	t.Helper()
	for _, tt := range qs {
		d := p.Request(tt.name, 443, tt.method, tt.path)
		gotEntry, gotLayer := "", Layer(0)
		if d.Rule != nil {
			gotEntry, gotLayer = d.Rule.Entry, d.Rule.Layer
		}
		if (d.Verdict == Allow) != tt.allow || gotEntry != tt.entry || gotLayer != tt.layer || d.Inspect {
			t.Errorf("Request(%q, %s %q) = %v by %q (%v), inspect %v; want %v by %q (%v)",
				tt.name, tt.method, tt.path, d.Verdict, gotEntry, gotLayer, d.Inspect, verdict(tt.allow), tt.entry, tt.layer)
		}
	}
}

// TestRequestGitHub is the example of the issue: a read-only github.com
// beside a full allow of api.github.com, over the built-in full allows
// of both.
func TestRequestGitHub(t *testing.T) {
	p := compile(t,
		r{LayerNamed, Allow, "github.com"},
		r{LayerNamed, Allow, "api.github.com"},
		r{LayerUser, Allow, "GET,HEAD github.com/*"},
		r{LayerUser, Allow, "api.github.com"},
	)
	checkRequest(t, p, []rq{
		{"github.com", "GET", "/owner/repo", yes, "GET,HEAD github.com/*", LayerUser},
		{"github.com", "HEAD", "/", yes, "GET,HEAD github.com/*", LayerUser},
		{"GitHub.com.", "GET", "/owner/repo.git/info/refs?service=git-upload-pack", yes, "GET,HEAD github.com/*", LayerUser},
		// git push is a POST: the user's restriction denies it, and the
		// built-in allow below does not undo that.
		{"github.com", "POST", "/owner/repo.git/git-receive-pack", no, "GET,HEAD github.com/*", LayerUser},
		{"github.com", "DELETE", "/owner/repo", no, "GET,HEAD github.com/*", LayerUser},
		{"api.github.com", "POST", "/repos/owner/repo/issues", yes, "api.github.com", LayerUser},
		{"api.github.com", "DELETE", "/repos/owner/repo", yes, "api.github.com", LayerUser},
		{"gist.github.com", "GET", "/", no, "", 0},
	})
	checkName(t, p, []q{
		{"github.com", 443, yes, "GET,HEAD github.com/*", LayerUser},
		{"api.github.com", 443, yes, "api.github.com", LayerUser},
	})
}

// TestRequestLayers: the highest layer with an opinion about the request
// decides; restrictions do not fall through, a higher full allow lifts
// a lower restriction.
func TestRequestLayers(t *testing.T) {
	p := compile(t,
		// A user's read-only mode over the built-in allow.
		r{LayerBuiltin, Allow, "ro.example"},
		r{LayerUser, Allow, "read ro.example"},
		// A project's full allow over the user's read-only mode.
		r{LayerUser, Allow, "read full.example"},
		r{LayerProject, Allow, "full.example"},
		// A runtime block of one method over a project's full allow.
		r{LayerProject, Allow, "nodel.example"},
		r{LayerRuntime, Block, "DELETE nodel.example/*"},
		// A user block of one method over a preset's allow: the block
		// alone is no opinion about GET, so the preset still decides it.
		r{LayerPreset, Allow, "preset.example"},
		r{LayerUser, Block, "DELETE preset.example/*"},
		// A project block of a whole name over a user's request allow.
		r{LayerUser, Allow, "GET shut.example/*"},
		r{LayerProject, Block, "shut.example"},
		// A request block alone, nothing allows the name.
		r{LayerUser, Block, "POST lone.example/*"},
	)
	checkRequest(t, p, []rq{
		{"ro.example", "GET", "/x", yes, "read ro.example", LayerUser},
		{"ro.example", "OPTIONS", "/x", yes, "read ro.example", LayerUser},
		{"ro.example", "POST", "/x", no, "read ro.example", LayerUser},
		{"ro.example", "PUT", "/x", no, "read ro.example", LayerUser},
		{"full.example", "POST", "/x", yes, "full.example", LayerProject},
		{"full.example", "GET", "/x", yes, "full.example", LayerProject},
		{"nodel.example", "DELETE", "/x", no, "DELETE nodel.example/*", LayerRuntime},
		{"nodel.example", "GET", "/x", yes, "nodel.example", LayerProject},
		{"preset.example", "GET", "/x", yes, "preset.example", LayerPreset},
		{"preset.example", "DELETE", "/x", no, "DELETE preset.example/*", LayerUser},
		{"shut.example", "GET", "/x", no, "shut.example", LayerProject},
		{"lone.example", "POST", "/x", no, "POST lone.example/*", LayerUser},
		{"lone.example", "GET", "/x", no, "", 0},
	})
	checkName(t, p, []q{
		{"ro.example", 443, yes, "read ro.example", LayerUser},
		{"full.example", 443, yes, "full.example", LayerProject},
		{"nodel.example", 443, yes, "nodel.example", LayerProject},
		{"preset.example", 443, yes, "preset.example", LayerPreset},
		{"shut.example", 443, no, "shut.example", LayerProject},
		{"lone.example", 443, no, "", 0},
	})
}

// TestRequestSpecificity: inside a layer, name first, then port, then
// path, then a method list; block wins an exact tie; a restriction
// loses to a bare allow of its own name and beats a less specific one.
func TestRequestSpecificity(t *testing.T) {
	p := compile(t,
		// Block one method inside a full allow.
		r{LayerUser, Allow, "api.example"},
		r{LayerUser, Block, "DELETE api.example/*"},
		// Path specificity: the longer literal prefix wins, an exact path
		// beats a glob with the same prefix.
		r{LayerUser, Allow, "paths.example/*"},
		r{LayerUser, Block, "paths.example/admin/*"},
		r{LayerUser, Allow, "paths.example/admin/status*"},
		r{LayerUser, Block, "paths.example/admin/status-internal"},
		r{LayerUser, Block, "paths.example/exact*"},
		r{LayerUser, Allow, "paths.example/exact"},
		// A method list beats any method at the same path.
		r{LayerUser, Block, "meth.example/v1/*"},
		r{LayerUser, Allow, "GET meth.example/v1/*"},
		// Exact tie: block wins, whatever the order.
		r{LayerUser, Allow, "GET tie.example/a"},
		r{LayerUser, Block, "get tie.example/a"},
		// A bare allow of the same name outranks a restriction; a
		// wildcard allow does not.
		r{LayerUser, Allow, "same.example"},
		r{LayerUser, Allow, "read same.example"},
		r{LayerUser, Allow, "*.wild.example"},
		r{LayerUser, Allow, "read x.wild.example"},
		// A wildcard request allow cannot lift an exact restriction.
		r{LayerUser, Allow, "POST *.deep.example/*"},
		r{LayerUser, Allow, "GET x.deep.example/*"},
		// A plain block with a request allow of the same name: only the
		// allowed requests pass.
		r{LayerUser, Block, "only.example"},
		r{LayerUser, Allow, "GET only.example/public/*"},
	)
	checkRequest(t, p, []rq{
		{"api.example", "DELETE", "/x", no, "DELETE api.example/*", LayerUser},
		{"api.example", "delete", "/x", no, "DELETE api.example/*", LayerUser}, // case folded for blocks
		{"api.example", "GET", "/x", yes, "api.example", LayerUser},
		{"paths.example", "GET", "/a", yes, "paths.example/*", LayerUser},
		{"paths.example", "GET", "/admin/users", no, "paths.example/admin/*", LayerUser},
		{"paths.example", "GET", "/admin/status", yes, "paths.example/admin/status*", LayerUser},
		{"paths.example", "GET", "/admin/status.json", yes, "paths.example/admin/status*", LayerUser},
		{"paths.example", "GET", "/admin/status-internal", no, "paths.example/admin/status-internal", LayerUser},
		{"paths.example", "GET", "/exact", yes, "paths.example/exact", LayerUser},
		{"paths.example", "GET", "/exact/more", no, "paths.example/exact*", LayerUser},
		{"meth.example", "GET", "/v1/x", yes, "GET meth.example/v1/*", LayerUser},
		{"meth.example", "POST", "/v1/x", no, "meth.example/v1/*", LayerUser},
		{"meth.example", "POST", "/v2/x", no, "GET meth.example/v1/*", LayerUser}, // nothing allows it: the restriction
		{"tie.example", "GET", "/a", no, "get tie.example/a", LayerUser},
		{"same.example", "POST", "/x", yes, "same.example", LayerUser},
		{"same.example", "GET", "/x", yes, "read same.example", LayerUser},
		{"y.wild.example", "POST", "/x", yes, "*.wild.example", LayerUser},
		{"x.wild.example", "POST", "/x", no, "read x.wild.example", LayerUser},
		{"x.wild.example", "GET", "/x", yes, "read x.wild.example", LayerUser},
		{"x.deep.example", "POST", "/x", no, "GET x.deep.example/*", LayerUser},
		{"y.deep.example", "POST", "/x", yes, "POST *.deep.example/*", LayerUser},
		{"y.deep.example", "GET", "/x", no, "POST *.deep.example/*", LayerUser},
		{"only.example", "GET", "/public/a", yes, "GET only.example/public/*", LayerUser},
		{"only.example", "GET", "/private", no, "only.example", LayerUser},
		{"only.example", "POST", "/public/a", no, "only.example", LayerUser},
	})
	checkName(t, p, []q{
		{"only.example", 443, yes, "GET only.example/public/*", LayerUser},
		{"x.deep.example", 443, yes, "GET x.deep.example/*", LayerUser},
	})
}

// TestRequestMethodCase: methods are matched as sent for allows (a
// server may treat "get" as a method of its own) and case-folded for
// blocks.
func TestRequestMethodCase(t *testing.T) {
	p := compile(t,
		r{LayerUser, Allow, "get,Head m.example/*"},
		r{LayerUser, Allow, "n.example"},
		r{LayerUser, Block, "Delete n.example/*"},
	)
	checkRequest(t, p, []rq{
		{"m.example", "GET", "/", yes, "get,Head m.example/*", LayerUser},
		{"m.example", "HEAD", "/", yes, "get,Head m.example/*", LayerUser},
		{"m.example", "get", "/", no, "get,Head m.example/*", LayerUser},
		{"n.example", "DELETE", "/", no, "Delete n.example/*", LayerUser},
		{"n.example", "dElEtE", "/", no, "Delete n.example/*", LayerUser},
		{"n.example", "GET", "/", yes, "n.example", LayerUser},
	})
}

// TestRequestPathBypass: spellings of a path that servers read alike
// must be matched alike (threat model 13); where servers differ, blocks
// match and allows do not widen.
func TestRequestPathBypass(t *testing.T) {
	p := compile(t,
		r{LayerUser, Allow, "b.example"},
		r{LayerUser, Block, "b.example/admin*"},
		r{LayerUser, Allow, "GET a.example/public/*"},
		r{LayerUser, Allow, "GET gl.example/api/v4/projects/*"},
		r{LayerUser, Block, "gl.example/api/v4/projects/secret%2Fproject/*"},
		r{LayerUser, Allow, "GET case.example/Repo/*"},
		r{LayerUser, Block, "case.example/repo/private/*"},
	)
	block := "b.example/admin*"
	restrict := "GET a.example/public/*"
	checkRequest(t, p, []rq{
		{"b.example", "GET", "/admin", no, block, LayerUser},
		{"b.example", "GET", "/a/../admin", no, block, LayerUser},
		{"b.example", "GET", "/%61dmin", no, block, LayerUser},
		{"b.example", "GET", "/%2561dmin", no, block, LayerUser}, // decoded twice
		{"b.example", "GET", "//admin", no, block, LayerUser},
		{"b.example", "GET", "/./admin", no, block, LayerUser},
		{"b.example", "GET", "/x/%2e%2e/admin", no, block, LayerUser},
		{"b.example", "GET", "/x/..%2Fadmin", no, block, LayerUser},
		{"b.example", "GET", "/x%2F..%2Fadmin", no, block, LayerUser},
		{"b.example", "GET", "/x/..;/admin", no, block, LayerUser},
		{"b.example", "GET", "/x\\..\\admin", no, block, LayerUser},
		{"b.example", "GET", "/ADMIN", no, block, LayerUser},
		{"b.example", "GET", "/admin%2F..", no, block, LayerUser},
		{"b.example", "GET", "/admin?x=1", no, block, LayerUser},
		{"b.example", "GET", "/adm%zzin", no, block, LayerUser},     // unreadable: blocks with a path match it
		{"b.example", "GET", "/%zz/../admin", no, block, LayerUser}, // (and the loose reading sees /admin)
		{"b.example", "GET", "/public/x", yes, "b.example", LayerUser},
		{"b.example", "GET", "/administrator", no, block, LayerUser},
		// Allows must not widen.
		{"a.example", "GET", "/public/x", yes, restrict, LayerUser},
		{"a.example", "GET", "/public/%78", yes, restrict, LayerUser},
		{"a.example", "GET", "/public/../admin", no, restrict, LayerUser},
		{"a.example", "GET", "/public/%2e%2e/admin", no, restrict, LayerUser},
		{"a.example", "GET", "/public/..%2Fadmin", no, restrict, LayerUser},
		{"a.example", "GET", "/public%2F..%2Fadmin", no, restrict, LayerUser},
		{"a.example", "GET", "/public/..%252Fadmin", no, restrict, LayerUser},
		{"a.example", "GET", "/public/..;/admin", no, restrict, LayerUser},
		{"a.example", "GET", "/public/..\\admin", no, restrict, LayerUser},
		{"a.example", "GET", "/public/x%zz", no, restrict, LayerUser}, // unreadable: no path allow matches it
		{"a.example", "GET", "*", no, restrict, LayerUser},
		{"a.example", "GET", "http://a.example/public/x", no, restrict, LayerUser},
		{"a.example", "GET", "", no, restrict, LayerUser},
		// An encoded slash inside a segment is fine where both readings
		// allow it (GitLab's project paths), and blocks see through it.
		{"gl.example", "GET", "/api/v4/projects/group%2Fproject/issues", yes, "GET gl.example/api/v4/projects/*", LayerUser},
		{"gl.example", "GET", "/api/v4/projects/secret%2fproject/issues", no, "gl.example/api/v4/projects/secret%2Fproject/*", LayerUser},
		{"gl.example", "GET", "/api/v4/projects/secret/project/issues", no, "gl.example/api/v4/projects/secret%2Fproject/*", LayerUser},
		// Case: allows match as written in both readings, blocks case
		// folded.
		{"case.example", "GET", "/Repo/x", yes, "GET case.example/Repo/*", LayerUser},
		{"case.example", "GET", "/repo/x", no, "GET case.example/Repo/*", LayerUser},
		{"case.example", "GET", "/Repo/Private/x", no, "case.example/repo/private/*", LayerUser},
	})
}

// TestRequestPorts: request rules with a port apply on that port only.
func TestRequestPorts(t *testing.T) {
	p := compile(t,
		r{LayerUser, Allow, "p.example"},
		r{LayerUser, Allow, "GET p.example:8443/*"},
	)
	for _, tt := range []struct {
		port   uint16
		method string
		allow  bool
		entry  string
	}{
		{443, "POST", yes, "p.example"},
		{8443, "GET", yes, "GET p.example:8443/*"},
		{8443, "POST", no, "GET p.example:8443/*"}, // the port makes the restriction outrank the bare allow
	} {
		d := p.Request("p.example", tt.port, tt.method, "/x")
		if (d.Verdict == Allow) != tt.allow || d.Rule == nil || d.Rule.Entry != tt.entry {
			t.Errorf("Request(p.example:%d, %s) = %+v; want %v by %q", tt.port, tt.method, d, verdict(tt.allow), tt.entry)
		}
	}
}

// TestRequestFailClosed: no policy, a name that is not one, and an empty
// policy deny.
func TestRequestFailClosed(t *testing.T) {
	var nilPolicy *Policy
	for _, p := range []*Policy{nilPolicy, Compile(nil)} {
		if d := p.Request("example.com", 443, "GET", "/"); d != (Decision{}) {
			t.Errorf("Request on %v = %+v", p, d)
		}
	}
	p := compile(t, r{LayerUser, Allow, "example.com"})
	if d := p.Request("not a name", 443, "GET", "/"); d != (Decision{}) {
		t.Errorf("Request(bad name) = %+v", d)
	}
	// Without request rules, a request gets its name's verdict.
	if d := p.Request("example.com", 443, "DELETE", "/%zz"); d.Verdict != Allow {
		t.Errorf("Request(plain allow) = %+v", d)
	}
}

// TestCompileRequestFailsClosed: hand-built rules ParseEntry would
// refuse do not open anything.
func TestCompileRequestFailsClosed(t *testing.T) {
	p := Compile([]Rule{
		{Entry: "a", Name: "bad.example", Action: Allow, Methods: []string{"get"}, Path: "/a/../b"},
		{Entry: "b", Name: "blk.example", Action: Allow},
		{Entry: "c", Name: "blk.example", Action: Block, Path: "relative"},
		{Entry: "d", Prefix: netip.MustParsePrefix("192.0.2.0/24"), Action: Allow, Methods: []string{"GET"}},
		{Entry: "e", Prefix: netip.MustParsePrefix("198.51.100.0/24"), Action: Allow},
		{Entry: "f", Prefix: netip.MustParsePrefix("198.51.100.7/32"), Action: Block, Path: "/x"},
	})
	if d := p.Request("bad.example", 443, "GET", "/b"); d.Verdict == Allow {
		t.Errorf("an allow with a broken path allowed: %+v", d)
	}
	if d := p.Request("blk.example", 443, "GET", "/anything"); d.Verdict == Allow {
		t.Errorf("a block with a broken path did not block: %+v", d)
	}
	if d := p.Addr(netip.MustParseAddr("192.0.2.1"), 443); d.Verdict == Allow {
		t.Errorf("an address allow with methods allowed: %+v", d)
	}
	if d := p.Addr(netip.MustParseAddr("198.51.100.7"), 443); d.Verdict == Allow {
		t.Errorf("an address block with a path did not block: %+v", d)
	}
	if got := p.Rules()[0].Methods; len(got) != 1 || got[0] != "GET" {
		t.Errorf("Compile did not upper-case methods: %q", got)
	}
}

// TestInspect: Name sets Inspect exactly when some request could be
// decided otherwise than the connection.
func TestInspect(t *testing.T) {
	p := compile(t,
		r{LayerBuiltin, Allow, "plain.example"},
		r{LayerNamed, Allow, "ro.example"},
		r{LayerUser, Allow, "read ro.example"},
		// A bare allow above a lower layer's request rules: no inspection.
		r{LayerUser, Allow, "GET over.example/*"},
		r{LayerProject, Allow, "over.example"},
		// A request block above the deciding layer.
		r{LayerPreset, Allow, "veto.example"},
		r{LayerUser, Block, "DELETE veto.example/*"},
		// A request block in the same layer, as narrow or narrower.
		r{LayerUser, Allow, "same.example"},
		r{LayerUser, Block, "DELETE same.example/*"},
		r{LayerUser, Allow, "*.wide.example"},
		r{LayerUser, Block, "DELETE x.wide.example/*"},
		// A less narrow request rule in the same layer cannot decide.
		r{LayerUser, Allow, "x.narrow.example"},
		r{LayerUser, Block, "DELETE *.narrow.example/*"},
		// Ports: a request rule for another port does not count.
		r{LayerUser, Allow, "port.example"},
		r{LayerUser, Block, "DELETE port.example:8443/*"},
		// A denied name is never inspected.
		r{LayerUser, Block, "deny.example"},
		r{LayerUser, Block, "DELETE deny.example/*"},
	)
	tests := []struct {
		name    string
		port    uint16
		allow   bool
		inspect bool
	}{
		{"plain.example", 443, yes, no},
		{"ro.example", 443, yes, yes},
		{"over.example", 443, yes, no},
		{"veto.example", 443, yes, yes},
		{"same.example", 443, yes, yes},
		{"x.wide.example", 443, yes, yes},
		{"y.wide.example", 443, yes, no},
		{"x.narrow.example", 443, yes, no},
		{"port.example", 443, yes, no},
		{"port.example", 8443, yes, yes},
		{"port.example", 0, yes, no},
		{"deny.example", 443, no, no},
	}
	for _, tt := range tests {
		d := p.Name(tt.name, tt.port)
		if (d.Verdict == Allow) != tt.allow || d.Inspect != tt.inspect {
			t.Errorf("Name(%q, %d) = %v inspect %v (by %v); want %v inspect %v", tt.name, tt.port, d.Verdict, d.Inspect, d.Rule, verdict(tt.allow), tt.inspect)
		}
	}
	// A policy without request rules never inspects.
	if d := compile(t, r{LayerUser, Allow, "a.example"}).Name("a.example", 443); d.Inspect {
		t.Errorf("Name without request rules inspects: %+v", d)
	}
}

// TestPresetLayer: a preset sits above the named policies and below the
// user's and the project's rules, which can take back what it allows.
func TestPresetLayer(t *testing.T) {
	preset, err := FromEntries([]string{"api.anthropic.example", "claude.example", "GET,HEAD docs.example/*"}, Allow, LayerPreset, "preset claude")
	if err != nil {
		t.Fatal(err)
	}
	rules := append(preset, compile(t,
		r{LayerNamed, Block, "claude.example"},
		r{LayerNamed, Allow, "docs.example"},
		r{LayerUser, Block, "api.anthropic.example"},
		r{LayerProject, Block, "POST claude.example/upload/*"},
	).Rules()...)
	p := Compile(rules)
	checkName(t, p, []q{
		{"api.anthropic.example", 443, no, "api.anthropic.example", LayerUser},
		{"claude.example", 443, yes, "claude.example", LayerPreset}, // over the named policy's block
		{"docs.example", 443, yes, "GET,HEAD docs.example/*", LayerPreset},
	})
	checkRequest(t, p, []rq{
		{"claude.example", "POST", "/upload/x", no, "POST claude.example/upload/*", LayerProject},
		{"claude.example", "POST", "/v1/x", yes, "claude.example", LayerPreset},
		{"docs.example", "POST", "/x", no, "GET,HEAD docs.example/*", LayerPreset},
	})
	if src := p.Name("claude.example", 443).Rule.Source; src != "preset claude" {
		t.Errorf("source = %q", src)
	}
	if !(LayerNamed < LayerPreset && LayerPreset < LayerUser) {
		t.Errorf("layer order: named %d, preset %d, user %d", LayerNamed, LayerPreset, LayerUser)
	}
}

// TestRequestRulesImmutable: Rules and Compile copy the method lists.
func TestRequestRulesImmutable(t *testing.T) {
	in := []Rule{{Entry: "x", Name: "x.example", Action: Allow, Methods: []string{"GET"}}}
	p := Compile(in)
	in[0].Methods[0] = "POST"
	p.Rules()[0].Methods[0] = "POST"
	if d := p.Request("x.example", 443, "POST", "/"); d.Verdict == Allow {
		t.Errorf("changing the method lists changed the policy: %+v", d)
	}
	if got := p.Rules()[0].Methods[0]; got != "GET" {
		t.Errorf("Rules()[0].Methods = %q", got)
	}
}

func TestNormalizePath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/", "/"},
		{"/a/b", "/a/b"},
		{"/a/b/", "/a/b/"},
		{"/a/b?q=1", "/a/b"},
		{"/a/b#frag", "/a/b"},
		{"/a?b/../c", "/a"},
		{"/%61%62c", "/abc"},
		{"/%7e%7Euser", "/~~user"},
		{"/a%2fb", "/a%2Fb"},
		{"/a%2Fb/../c", "/c"},
		{"/a%252Fb", "/a%252Fb"},
		{"/a/./b", "/a/b"},
		{"/a/../b", "/b"},
		{"/a/b/..", "/a/"},
		{"/a/b/.", "/a/b/"},
		{"/../../a", "/a"},
		{"/..", "/"},
		{"/%2e%2E/a", "/a"},
		{"/.%2e/a", "/a"},
		{"//a///b//", "/a/b/"},
		{"/a b", "/a%20b"},
		{"/a%20b", "/a%20b"},
		{"/caf\u00e9", "/caf%C3%A9"},
		{"/a\\b", "/a%5Cb"},
		{"/a;b=c/d", "/a;b=c/d"},
		{"/a%3Bb", "/a%3Bb"},
		{"/@scope/pkg", "/@scope/pkg"},
		{"/a*b", "/a*b"},
		{"/.well-known/x", "/.well-known/x"},
		{"/a/..b/c", "/a/..b/c"},
	}
	for _, tt := range tests {
		got, err := NormalizePath(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("NormalizePath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			continue
		}
		if again, err := NormalizePath(got); err != nil || again != got {
			t.Errorf("NormalizePath(%q) = %q, %v; not idempotent", got, again, err)
		}
	}
	for _, in := range []string{"", "*", "a/b", "http://x/a", "?q", "/a%", "/a%2", "/a%zz", "/%g0"} {
		got, err := NormalizePath(in)
		if err == nil {
			t.Errorf("NormalizePath(%q) = %q, want an error", in, got)
			continue
		}
		if !errors.Is(err, ErrPath) {
			t.Errorf("NormalizePath(%q): %v is not ErrPath", in, err)
		}
	}
	// An error never quotes the path: it may hold a token.
	if _, err := NormalizePath("/secret-token-123/%zz"); err == nil || strings.Contains(err.Error(), "secret-token") {
		t.Errorf("NormalizePath error %v", err)
	}
}

func TestLoosePath(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{"/", "/", yes},
		{"/A/B/", "/a/b", yes},
		{"/a%2Fb", "/a/b", yes},
		{"/a%252Fb", "/a/b", yes},
		{"/a\\b", "/a/b", yes},
		{"/a;x/b;y=1", "/a/b", yes},
		{"/x/..;/admin", "/admin", yes},
		{"/a%zz", "/a%zz", yes},
		{"/a?%2F", "/a", yes},
		{"/%" + strings.Repeat("25", 8) + "41", "", no}, // nine decodings
		{"/%" + strings.Repeat("25", 7) + "41", "/a", yes},
		{"/%25%25", "/%%", yes},
		{"x", "", no},
		{"/%5C%5Cx", "/x", yes},
	}
	for _, tt := range tests {
		got, ok := loosePath(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("loosePath(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestGlob(t *testing.T) {
	tests := []struct {
		glob, path string
		want       bool
	}{
		{"/a", "/a", yes},
		{"/a", "/a/", no},
		{"/a", "/ab", no},
		{"/a*", "/a", yes},
		{"/a*", "/a/b/c", yes},
		{"/*", "/", yes},
		{"/*/x", "/a/b/x", yes},
		{"/*/x", "/a/b/x/y", no},
		{"/a*b*c", "/abc", yes},
		{"/a*b*c", "/a-b-b-c", yes},
		{"/a*b*c", "/acb", no},
		{"/a*bc*bc", "/abcbc", yes},
		{"/a*bc*bc", "/abc", no},
		{"/a**", "/a", yes},
		{"/*a*", "/xxaxx", yes},
	}
	for _, tt := range tests {
		g := glob{pieces: strings.Split(tt.glob, "*")}
		if got := g.match(tt.path); got != tt.want {
			t.Errorf("glob %q matches %q = %v, want %v", tt.glob, tt.path, got, tt.want)
		}
	}
}

// bigRequestPolicy is bigPolicy plus request rules for a few names, so
// BenchmarkRequest measures the path a policy with request rules takes.
func bigRequestPolicy(n int) *Policy {
	rules := bigPolicy(n).Rules()
	for i := 0; i < 100; i++ {
		for _, e := range []string{
			fmt.Sprintf("GET,HEAD code%d.example/*", i),
			fmt.Sprintf("code%d.example/api/*", i),
			fmt.Sprintf("block DELETE code%d.example/*", i),
		} {
			a := Action(Allow)
			if strings.HasPrefix(e, "block ") {
				a, e = Block, strings.TrimPrefix(e, "block ")
			}
			r, err := ParseEntry(e)
			if err != nil {
				panic(err)
			}
			r.Action, r.Layer = a, LayerUser
			rules = append(rules, r)
		}
	}
	return Compile(rules)
}

func BenchmarkRequest(b *testing.B) {
	p := bigRequestPolicy(100_000)
	reqs := []struct{ name, method, path string }{
		{"code7.example", "GET", "/owner/repo/info/refs?service=git-upload-pack"},
		{"code7.example", "POST", "/api/v1/things"},
		{"code7.example", "DELETE", "/api/v1/things/3"},
		{"code7.example", "POST", "/owner/repo.git/git-receive-pack"},
		{"code7.example", "GET", "/a/../b/%2e%2e/C%2Fd"},
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r := reqs[i%len(reqs)]
		p.Request(r.name, 443, r.method, r.path)
	}
}

// BenchmarkNameWithRequestRules is Name on a policy that has request
// rules, for a name that has some (Inspect is worked out) and one that
// has none.
func BenchmarkNameWithRequestRules(b *testing.B) {
	p := bigRequestPolicy(100_000)
	names := []string{"code7.example", "host4.block4.example"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p.Name(names[i%len(names)], 443)
	}
}
