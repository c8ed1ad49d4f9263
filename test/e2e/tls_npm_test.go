package e2e

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// claudePackage is Claude Code's npm package.
const claudePackage = "@anthropic-ai/claude-code"

// TestTLSNpmClaudePreset checks TLS through the gate against a real outside service: with the npm
// registry this host's npm uses reachable, `npm install -g` of Claude Code works inside a sandbox
// through the gate, and `moat run claude -- --version` runs the installed agent. Like the
// Debian test it runs wherever that registry answers and is skipped, saying why, where it does
// not (MOAT_TEST_NPM=0 skips it too). It reads the registry from the host's npm configuration,
// so no registry is named here.
func TestTLSNpmClaudePreset(t *testing.T) {
	if os.Getenv("MOAT_TEST_NPM") == "0" {
		t.Skip("skipped: MOAT_TEST_NPM=0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "npm", "config", "get", "registry").Output()
	if err != nil {
		t.Skipf("skipped: no npm on the host to read the registry from (npm config get registry: %v); this test runs where npm is installed and its registry answers", err)
	}
	reg := strings.TrimSpace(string(out))
	u, err := url.Parse(reg)
	if err != nil || u.Hostname() == "" || u.Scheme != "https" {
		t.Fatalf("the host's npm registry %q is not an https URL", reg)
	}
	if err := answers(reg); err != nil {
		t.Skipf("skipped: the host cannot reach its npm registry (HEAD %s: %v); this test runs where it answers", reg, err)
	}
	dir := project(t, "tls-npm")
	// The project allows the registry on top of the default policy; the claude preset adds the
	// hosts it needs itself.
	toml := "[network]\nallow = [\"" + u.Hostname() + "\"]\n"
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := moatWithin(t, dir, 10*time.Minute, "run", "--", "sudo", "-n", "npm", "install", "-g", "--no-fund", "--no-audit", "--registry", reg, claudePackage)
	if r.code != 0 {
		t.Fatalf("npm install -g %s through the gate: exit %d\nstdout: %s\nstderr: %s", claudePackage, r.code, tail(r.stdout, 30), tail(r.stderr, 30))
	}
	t.Logf("npm install -g %s through the gate: %v", claudePackage, time.Since(start).Round(time.Second))
	r = moatWithin(t, dir, 2*time.Minute, "run", "claude", "--", "--version")
	if r.code != 0 || !strings.Contains(r.stdout, "Claude Code") {
		t.Fatalf("moat run claude -- --version: exit %d\nstdout: %s\nstderr: %s", r.code, tail(r.stdout, 20), tail(r.stderr, 20))
	}
	t.Logf("moat run claude -- --version: %s", strings.TrimSpace(r.stdout))
}
