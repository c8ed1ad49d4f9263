package dockerrt

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
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
	subnet := netip.MustParsePrefix("10.213.4.0/24")
	gate, work := netip.MustParseAddr("10.213.4.2"), netip.MustParseAddr("10.213.4.3")
	data := GateConfig(subnet, gate, work, []netip.AddrPort{netip.MustParseAddrPort("198.51.100.1:53")}, []string{"A", "TOKEN"})
	cfg, err := gateserve.ParseConfig("/moat-gate/gate.toml", data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if len(cfg.Tenants) != 1 || !slices.Equal(cfg.Tenants[0].Sources, []netip.Prefix{netip.PrefixFrom(work, 32)}) {
		t.Errorf("tenants = %+v, want one with source %s", cfg.Tenants, work)
	}
	// Pushed secrets come over the control socket, whose host path is
	// the container's through the gate directory's bind.
	if len(cfg.Tenants) == 1 && !slices.Equal(cfg.Tenants[0].Pushed, []string{"A", "TOKEN"}) {
		t.Errorf("pushed = %v, want [A TOKEN]", cfg.Tenants[0].Pushed)
	}
	if want := gateDir + strings.TrimPrefix(ControlSocket("/state/x"), "/state/x/gate"); cfg.Control != want {
		t.Errorf("control = %q, want %q (ControlSocket under the gate directory's bind)", cfg.Control, want)
	}
	for _, l := range [][]netip.AddrPort{cfg.DNS, cfg.HTTP, cfg.HTTPS} {
		if len(l) != 1 || l[0].Addr() != gate {
			t.Errorf("listener %v is not on the gate's internal address only", l)
		}
	}
	if len(cfg.Upstream) != 1 {
		t.Errorf("upstream = %v", cfg.Upstream)
	}
	// The names range is the half Docker never assigns, and holds none
	// of the sandbox's own addresses.
	if want := netip.MustParsePrefix("10.213.4.128/25"); cfg.Names != want {
		t.Errorf("names = %v, want %v", cfg.Names, want)
	}
	assign := AssignRange(subnet)
	if assign.String() != "10.213.4.0/25" || assign.Overlaps(cfg.Names) {
		t.Errorf("Docker's range %v overlaps names %v", assign, cfg.Names)
	}
	for _, a := range []netip.Addr{HostAt(subnet, 1), gate, work} {
		if !assign.Contains(a) || cfg.Names.Contains(a) {
			t.Errorf("%s: in Docker's range %v: %v, in names %v: %v", a, assign, assign.Contains(a), cfg.Names, cfg.Names.Contains(a))
		}
	}
}

func TestPolicyFile(t *testing.T) {
	files := map[string][]byte{
		"user": []byte("[network]\nallow = [\"a.test\"]\n[sandbox]\ncpus = 2\n" +
			"[secrets.GONE]\nfrom = \"file:/etc/gone\"\nhosts = [\"a.test\"]\n"),
		"project": []byte("[sandbox]\nruntime = \"docker\"\n[network]\nallow = [\"b.test\"]\nblock = [\"c.test\"]\n" +
			"[secrets.TOKEN]\nfrom = \"env:TOKEN\"\nhosts = [\"a.test\"]\n" +
			"[secrets.GONE]\nfrom = \"env:GONE\"\nhosts = [\"a.test\"]\n" +
			"[secrets.KEY]\nfrom = \"file:/run/key\"\nhosts = [\"b.test\"]\n" +
			"[secrets.CMD]\nfrom = \"command:pass show x\"\nhosts = [\"b.test\"]\n" +
			"[secrets.REL]\nfrom = \"file:rel/key\"\nhosts = [\"b.test\"]\n[audit]\nmax_size = \"1MiB\"\n"),
	}
	var asked []string
	trust := func(p string) (string, error) { asked = append(asked, p); return "/moat-gate/trust/1.pem", nil }
	pol, err := PolicyFile(files, []string{"user", "project"}, trust)
	if err != nil {
		t.Fatal(err)
	}
	// env: and command: secrets are pushed; a wider file's secret of
	// the same name is replaced, source and all; a relative file: is
	// dropped.
	if got, want := pol.Pushed, map[string]string{"CMD": "command:pass show x", "GONE": "env:GONE", "TOKEN": "env:TOKEN"}; !maps.Equal(got, want) {
		t.Errorf("pushed = %v, want %v", got, want)
	}
	if want := []string{"CMD", "GONE", "TOKEN"}; !slices.Equal(pol.PushedNames(), want) {
		t.Errorf("pushed names = %v, want %v", pol.PushedNames(), want)
	}
	if want := []string{"REL"}; !slices.Equal(pol.Dropped, want) {
		t.Errorf("dropped = %v, want %v", pol.Dropped, want)
	}
	if want := []string{"/etc/gone", "/run/key"}; !slices.Equal(pol.SecretFiles, want) {
		t.Errorf("secret files = %v, want %v", pol.SecretFiles, want)
	}
	var raw struct{ Secrets map[string]any }
	if err := toml.Unmarshal(pol.TOML, &raw); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(raw.Secrets); !slices.Equal(got, []string{"CMD", "GONE", "KEY", "TOKEN"}) {
		t.Errorf("secrets in the policy = %v, want [CMD GONE KEY TOKEN]:\n%s", got, pol.TOML)
	}
	// Parsed as the service does (config.Parse reads no secret values).
	f, err := config.Parse("/moat-gate/policy.toml", pol.TOML)
	if err != nil {
		t.Fatalf("%v\n%s", err, pol.TOML)
	}
	if f.Sandbox != (config.SandboxLayer{}) {
		t.Errorf("policy keeps [sandbox], which the service refuses:\n%s", pol.TOML)
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
	pol, err = PolicyFile(files, []string{"user"}, trust)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Network struct{ Trust []string } }
	if err := toml.Unmarshal(pol.TOML, &doc); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(asked, []string{"/etc/corp.pem"}) || !slices.Equal(doc.Network.Trust, []string{"/moat-gate/trust/1.pem"}) {
		t.Errorf("trust: asked %v, got %v", asked, doc.Network.Trust)
	}
}

func keysOf(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestChooseRuntime(t *testing.T) {
	for _, c := range []struct {
		want     string
		hasRunsc bool
		got      string
		err      bool
	}{
		{"", true, "runsc", false},
		{"", false, "runc", false},
		{"runc", true, "runc", false},
		{"runsc", true, "runsc", false},
		{"runsc", false, "", true},
		{"kata", true, "", true},
	} {
		got, err := ChooseRuntime(c.want, c.hasRunsc)
		if got != c.got || (err != nil) != c.err {
			t.Errorf("ChooseRuntime(%q, %v) = %q, %v; want %q, error %v", c.want, c.hasRunsc, got, err, c.got, c.err)
		}
	}
}
