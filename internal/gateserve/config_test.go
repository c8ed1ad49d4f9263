package gateserve

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

const goodConfig = `
[service]
state_dir = "/var/lib/moat-gate"

[listen]
dns = ["10.0.0.1:53"]
https = ["10.0.0.1"]
metrics = "127.0.0.1:9153"

[tenants.alpha]
sources = ["10.0.1.0/24"]
policy = ["/etc/moat-gate/alpha.toml"]

[tenants.beta]
sources = ["10.0.2.7"]
policy = ["/etc/moat-gate/base.toml", "/etc/moat-gate/beta.toml"]
audit = "/var/log/beta.jsonl"
rules_at = "beta's repository, policy/gate.toml"
`

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig("/etc/gate.toml", []byte(goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.UID != defaultUID || cfg.GID != defaultUID {
		t.Errorf("uid, gid = %d, %d; want %d", cfg.UID, cfg.GID, defaultUID)
	}
	if got, want := cfg.HTTPS, []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:443")}; len(got) != 1 || got[0] != want[0] {
		t.Errorf("https = %v, want %v (a bare address gets 443)", got, want)
	}
	if cfg.CACert != "/var/lib/moat-gate/ca.pem" {
		t.Errorf("ca_cert = %q", cfg.CACert)
	}
	if len(cfg.Tenants) != 2 || cfg.Tenants[0].Name != "alpha" || cfg.Tenants[1].Name != "beta" {
		t.Fatalf("tenants = %+v", cfg.Tenants)
	}
	if got := cfg.Tenants[0].Audit; got != "/var/lib/moat-gate/audit/alpha.jsonl" {
		t.Errorf("alpha's audit = %q", got)
	}
	if got := cfg.Tenants[1].Audit; got != "/var/log/beta.jsonl" {
		t.Errorf("beta's audit = %q", got)
	}
	if got := cfg.Tenants[1].Sources; len(got) != 1 || got[0] != netip.MustParsePrefix("10.0.2.7/32") {
		t.Errorf("beta's sources = %v", got)
	}
	// What refusal pages name as the place for an allow rule: the top
	// policy file, unless rules_at says.
	if got := cfg.Tenants[0].RulesAt; got != "/etc/moat-gate/alpha.toml" {
		t.Errorf("alpha's rules_at = %q", got)
	}
	if got := cfg.Tenants[1].RulesAt; got != "beta's repository, policy/gate.toml" {
		t.Errorf("beta's rules_at = %q", got)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       []string // in the error's text
	}{
		{"unknown key", goodConfig + "\n[tenants.gamma]\nsource = [\"10.0.3.0/24\"]\n",
			[]string{"gate.toml:21:", "unknown key tenants.gamma.source"}},
		{"wrong type", strings.Replace(goodConfig, `dns = ["10.0.0.1:53"]`, `dns = "10.0.0.1:53"`, 1),
			[]string{"gate.toml:6:"}},
		{"overlap", strings.Replace(goodConfig, `"10.0.2.7"`, `"10.0.1.7"`, 1),
			[]string{"gate.toml:15:", "overlaps 10.0.1.0/24 of tenant alpha"}},
		{"host bits", strings.Replace(goodConfig, `"10.0.1.0/24"`, `"10.0.1.1/24"`, 1),
			[]string{"gate.toml:11:", "did you mean 10.0.1.0/24"}},
		{"root", strings.Replace(goodConfig, `[service]`, "[service]\nuid = 0", 1),
			[]string{"gate.toml:3:", "unprivileged"}},
		{"relative path", strings.Replace(goodConfig, `"/etc/moat-gate/alpha.toml"`, `"alpha.toml"`, 1),
			[]string{"gate.toml:12:", "absolute path"}},
		{"no state dir", strings.Replace(goodConfig, `state_dir = "/var/lib/moat-gate"`, "", 1),
			[]string{"gate.toml:2:", "service.state_dir: missing"}},
		{"wildcard dns without answer", strings.Replace(goodConfig, `dns = ["10.0.0.1:53"]`, `dns = ["0.0.0.0:53"]`, 1),
			[]string{"gate.toml:6:", "service.answer"}},
		{"no policy", strings.Replace(goodConfig, "policy = [\"/etc/moat-gate/alpha.toml\"]\n", "", 1),
			[]string{"tenants.alpha.policy: missing"}},
		{"bad tenant name", strings.Replace(goodConfig, "[tenants.alpha]", "[tenants.Alpha]", 1),
			[]string{"gate.toml:10:", "not a tenant name"}},
		{"names not a subnet", withNames("10.0.9.1"), []string{"gate.toml:3:", "service.names", "IPv4 subnet"}},
		{"names host bits", withNames("10.0.9.1/25"), []string{"gate.toml:3:", "did you mean 10.0.9.0/25"}},
		{"names too small", withNames("10.0.9.0/31"), []string{"gate.toml:3:", "/8 to /30"}},
		{"names IPv6", withNames("fd00::/64"), []string{"gate.toml:3:", "IPv4 subnet"}},
		{"names loopback", withNames("127.9.0.0/16"), []string{"gate.toml:3:", "overlaps 127.0.0.0/8"}},
		{"names holds a listener", withNames("10.0.0.0/24"), []string{"listen.dns", "inside service.names"}},
		{"names holds a client", withNames("10.0.1.128/25"), []string{"gate.toml:12:", "overlaps service.names"}},
		{"names and answer", strings.Replace(withNames("10.0.9.0/24"), "[service]", "[service]\nanswer = \"10.0.0.1\"", 1),
			[]string{"service.answer", "remove one"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig("/etc/gate.toml", []byte(tc.data))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not match ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func withNames(n string) string {
	return strings.Replace(goodConfig, "[service]", "[service]\nnames = \""+n+"\"", 1)
}

func TestParseConfigNames(t *testing.T) {
	// With a names range, listeners for 80 and 443 are optional: the
	// range's addresses take every port.
	data := strings.Replace(withNames("10.0.9.128/25"), "https = [\"10.0.0.1\"]\n", "", 1)
	cfg, err := ParseConfig("/etc/gate.toml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Names != netip.MustParsePrefix("10.0.9.128/25") || len(cfg.HTTPS) != 0 {
		t.Errorf("names = %v, https = %v; want 10.0.9.128/25 and none", cfg.Names, cfg.HTTPS)
	}
	// A wildcard DNS listener needs no answer address either.
	data = strings.Replace(data, `dns = ["10.0.0.1:53"]`, `dns = ["0.0.0.0:53"]`, 1)
	if _, err := ParseConfig("/etc/gate.toml", []byte(data)); err != nil {
		t.Errorf("a wildcard DNS listener with names: %v", err)
	}
}

func TestTenantLookup(t *testing.T) {
	a, b := &tenant{cfg: Tenant{Name: "a", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}}},
		&tenant{cfg: Tenant{Name: "b", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")}}}
	tt := newTable([]*tenant{a, b})
	for _, tc := range []struct {
		src  string
		want *tenant
	}{{"10.0.1.5", b}, {"10.0.2.5", a}, {"::ffff:10.0.1.5", b}, {"10.1.0.1", nil}, {"fd00::1", nil}} {
		if got := tt.lookup(netip.MustParseAddr(tc.src)); got != tc.want {
			t.Errorf("lookup(%s) = %v, want %v", tc.src, got, tc.want)
		}
	}
}

// FuzzParseConfig: whatever the file holds, ParseConfig returns a config
// or an error matching ErrInvalid, and never panics.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(goodConfig))
	f.Add([]byte("[tenants.a]\nsources = [\"::/0\"]\npolicy = [\"/p\"]\n"))
	f.Add([]byte("[listen]\ndns = [\"[::1]:53\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig("/etc/gate.toml", data)
		if err == nil && cfg == nil {
			t.Fatal("no config and no error")
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("error %q does not match ErrInvalid", err)
		}
	})
}
