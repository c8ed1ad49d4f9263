package gateserve

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolicyListRefused: a named policy that reads its rules from a list
// is refused, not compiled without them (the service loads no lists).
func TestPolicyListRefused(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "ads.txt")
	if err := os.WriteFile(list, []byte("ads.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(dir, "alpha.toml")
	body := "[network]\nuse = [\"ads\"]\nallow = [\"ok.example\"]\n\n[policies.ads]\nsource = \"" + list + "\"\n"
	if err := os.WriteFile(pol, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := readRules(Tenant{Name: "alpha", Policy: []string{pol}}, nil)
	if err == nil || !strings.Contains(err.Error(), "[policies.ads]") || !strings.Contains(err.Error(), "does not load yet") {
		t.Fatalf("readRules of a policy with a list: %v; want it refused, naming the policy", err)
	}
	// The same policy with its rules inline compiles.
	inline := "[network]\nuse = [\"ads\"]\nallow = [\"ok.example\"]\n\n[policies.ads]\nblock = [\"ads.example\"]\n"
	if err := os.WriteFile(pol, []byte(inline), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readRules(Tenant{Name: "alpha", Policy: []string{pol}}, nil); err != nil {
		t.Fatalf("readRules of an inline policy: %v", err)
	}
}

// TestPushedCommandSecret: a command: secret is refused (the jail cannot
// run it) unless its value is pushed over the control socket.
func TestPushedCommandSecret(t *testing.T) {
	pol := filepath.Join(t.TempDir(), "alpha.toml")
	body := "[network]\nallow = [\"api.test\"]\n[secrets.TOKEN]\nfrom = \"command:pass show token\"\nhosts = [\"api.test\"]\n"
	if err := os.WriteFile(pol, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readRules(Tenant{Name: "alpha", Policy: []string{pol}}, nil); err == nil || !strings.Contains(err.Error(), "cannot run commands") {
		t.Errorf("a command: secret not pushed: %v; want it refused", err)
	}
	if _, err := readRules(Tenant{Name: "alpha", Policy: []string{pol}, Pushed: []string{"TOKEN"}}, nil); err != nil {
		t.Errorf("a pushed command: secret: %v", err)
	}
}
