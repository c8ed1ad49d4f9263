package dockerrt

import (
	"net/netip"
	"slices"
	"testing"

	toml "github.com/pelletier/go-toml/v2"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/gateserve"
)

func TestPickSubnet(t *testing.T) {
	for _, tc := range []struct {
		name string
		used []string
		want string
	}{
		{"empty", nil, "10.213.0.0/24"},
		{"first taken", []string{"10.213.0.0/24"}, "10.213.1.0/24"},
		{"wider route", []string{"10.213.0.0/23", "10.0.0.0/16"}, "10.213.2.0/24"},
		{"unrelated", []string{"172.17.0.0/16", "192.168.0.0/16"}, "10.213.0.0/24"},
	} {
		var used []netip.Prefix
		for _, u := range tc.used {
			used = append(used, netip.MustParsePrefix(u))
		}
		got, err := PickSubnet(used)
		if err != nil || got.String() != tc.want {
			t.Errorf("%s: PickSubnet = %v, %v; want %s", tc.name, got, err, tc.want)
		}
	}
	if _, err := PickSubnet([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}); err != ErrNoSubnet {
		t.Errorf("a full pool: err = %v, want ErrNoSubnet", err)
	}
}

// The service must accept what moat writes for it, and serve only the
// workload.
func TestGateConfig(t *testing.T) {
	gate, work := netip.MustParseAddr("10.213.4.2"), netip.MustParseAddr("10.213.4.3")
	data := GateConfig(gate, work, []netip.AddrPort{netip.MustParseAddrPort("198.51.100.1:53")})
	cfg, err := gateserve.ParseConfig("/moat-gate/gate.toml", data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if len(cfg.Tenants) != 1 || !slices.Equal(cfg.Tenants[0].Sources, []netip.Prefix{netip.PrefixFrom(work, 32)}) {
		t.Errorf("tenants = %+v, want one with source %s", cfg.Tenants, work)
	}
	for _, l := range [][]netip.AddrPort{cfg.DNS, cfg.HTTP, cfg.HTTPS} {
		if len(l) != 1 || l[0].Addr() != gate {
			t.Errorf("listener %v is not on the gate's internal address only", l)
		}
	}
	if len(cfg.Upstream) != 1 {
		t.Errorf("upstream = %v", cfg.Upstream)
	}
}

func TestPolicyFile(t *testing.T) {
	files := map[string][]byte{
		"user":    []byte("[network]\nallow = [\"a.test\"]\n[sandbox]\ncpus = 2\n"),
		"project": []byte("[sandbox]\nruntime = \"docker\"\n[network]\nallow = [\"b.test\"]\nblock = [\"c.test\"]\n[secrets.TOKEN]\nfrom = \"env:TOKEN\"\nhosts = [\"a.test\"]\n[audit]\nmax_size = \"1MiB\"\n"),
	}
	var asked []string
	trust := func(p string) (string, error) { asked = append(asked, p); return "/moat-gate/trust/1.pem", nil }
	b, dropped, err := PolicyFile(files, []string{"user", "project"}, trust)
	if err != nil {
		t.Fatal(err)
	}
	if !dropped {
		t.Error("a [secrets] table was dropped without saying so")
	}
	f, err := config.Parse("/moat-gate/policy.toml", b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if f.Sandbox != (config.SandboxLayer{}) || len(f.Secrets) != 0 {
		t.Errorf("policy keeps tables the service refuses:\n%s", b)
	}
	c := config.Merge(f)
	if got, want := c.Network.Allow, []string{"a.test", "b.test"}; !slices.Equal(got, want) {
		t.Errorf("allow = %v, want %v", got, want)
	}
	if got := c.Network.Block; !slices.Equal(got, []string{"c.test"}) {
		t.Errorf("block = %v", got)
	}
	if len(asked) != 0 {
		t.Errorf("trust asked for %v, which no file names", asked)
	}
	// A trust path becomes the gate's copy.
	files["user"] = []byte("[network]\ntrust = [\"/etc/corp.pem\"]\n")
	b, _, err = PolicyFile(files, []string{"user"}, trust)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Network struct{ Trust []string } }
	if err := toml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(asked, []string{"/etc/corp.pem"}) || !slices.Equal(doc.Network.Trust, []string{"/moat-gate/trust/1.pem"}) {
		t.Errorf("trust: asked %v, got %v", asked, doc.Network.Trust)
	}
}
