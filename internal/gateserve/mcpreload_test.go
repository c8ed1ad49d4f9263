package gateserve

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A reload that changes a tenant's [mcp] servers is refused whole: the
// gate decides calls by the declarations it was built with, and new
// files would otherwise allow a server's URL with the old tool rules
// (or none) deciding its calls.
func TestReloadRefusesChangedMCP(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "alpha.toml")
	writePol := func(tools, allow string) {
		t.Helper()
		b := fmt.Sprintf("[network]\nallow = [%s]\n\n[mcp.docs]\nurl = \"https://mcp.test/mcp\"\ntools = [%s]\n", allow, tools)
		if err := os.WriteFile(pol, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writePol(`"search"`, `"a.test"`)
	conf := fmt.Sprintf("[service]\nstate_dir = %q\n\n[listen]\ndns = [\"127.0.0.1:53\"]\nhttps = [\"127.0.0.1:443\"]\n\n[tenants.alpha]\nsources = [\"10.9.0.3\"]\npolicy = [%q]\n",
		filepath.Join(dir, "state"), pol)
	path := filepath.Join(dir, "gate.toml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{Config: cfg, Listeners: &Listeners{},
		Resolvers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")}, HostAddrs: []netip.Addr{}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, tools, allow string
		refused            bool
	}{
		{"unchanged", `"search"`, `"a.test"`, false},
		{"another rule, the same servers", `"search"`, `"a.test", "b.test"`, false},
		{"a tool added", `"search", "delete_*"`, `"a.test"`, true},
		{"back as it started", `"search"`, `"a.test"`, false},
	}
	for _, tt := range tests {
		writePol(tt.tools, tt.allow)
		err := svc.Reload()
		if got := err != nil; got != tt.refused {
			t.Errorf("%s: reload: %v, want refused %v", tt.name, err, tt.refused)
		}
		if err != nil && (!strings.Contains(err.Error(), "[mcp]") || !strings.Contains(err.Error(), "restart")) {
			t.Errorf("%s: %v; want it to name [mcp] and say restart", tt.name, err)
		}
	}
}
