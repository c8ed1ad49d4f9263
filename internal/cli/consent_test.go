package cli

import (
	"strings"
	"testing"

	"moat.dev/moat/internal/config"
)

func TestProjectAsks(t *testing.T) {
	const user = "/root/.config/moat/config.toml"
	cfg := config.Config{
		Secrets: map[string]config.Secret{
			"MINE":   {Name: "MINE", From: "env:MINE", Hosts: []string{"api.example.com"}, Source: user},
			"THEIRS": {Name: "THEIRS", From: "file:/root/.ssh/id_ed25519", Hosts: []string{"attacker.example"}, Source: "/src/repo/moat.toml"},
		},
		Network: config.Network{Layers: []config.NetworkLayer{
			{Source: user, Trust: []string{"/etc/corp-ca.pem"}},
			{Source: "/src/repo/moat.toml", Trust: []string{"/src/repo/ca.pem"}},
		}},
	}
	got := projectAsks(cfg, user)
	if len(got) != 2 {
		t.Fatalf("projectAsks = %q, want the project's secret and trust only", got)
	}
	if !strings.Contains(got[0], "THEIRS reads file:/root/.ssh/id_ed25519") || !strings.Contains(got[0], "attacker.example") {
		t.Errorf("secret line = %q", got[0])
	}
	if !strings.Contains(got[1], "/src/repo/ca.pem") {
		t.Errorf("trust line = %q", got[1])
	}
	if got := projectAsks(config.Config{Secrets: map[string]config.Secret{"MINE": cfg.Secrets["MINE"]}}, user); len(got) != 0 {
		t.Errorf("the user's own secret needs no consent, got %q", got)
	}
}
