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

func TestProjectAsksWidening(t *testing.T) {
	const user = "/root/.config/moat/config.toml"
	const proj = "/src/repo/moat.toml"
	cfg := config.Config{
		Network: config.Network{Layers: []config.NetworkLayer{
			{Source: user, Allow: []string{"mine.example"}, Use: []string{"corp"}},
			{Source: proj, Allow: []string{"a.example", "GET b.example/*"}, Use: []string{"default", "ads-ok"}, Mode: config.ModeReport},
		}},
		Shares: []config.Share{
			{Path: "/root/data", Target: "/data", Source: user},
			{Path: "/root/.aws", Target: "/aws", RW: true, Source: proj},
		},
		Files: []config.CopyFile{
			{Source: "/src/repo/conf/tool.yml", Target: "/etc/tool.yml", Origin: proj}, // inside the project: nothing new
			{Source: "/root/.netrc", Target: "/home/agent/.netrc", Origin: proj},
		},
		EnvVars: []config.EnvVar{
			{Name: "MODE", Value: "dev", Source: proj},
			{Name: "EDITOR", Pass: true, Source: user},
			{Name: "AWS_SECRET_ACCESS_KEY", Pass: true, Source: proj},
			{Name: "TOKEN", Value: "${GITHUB_TOKEN:-}", Source: proj},
		},
	}
	want := []string{
		proj + ": network.allow lets the sandbox reach a.example, GET b.example/*",
		proj + ": network.use adds the named policies ads-ok",
		proj + `: network.mode = "report" lets through everything the policy would deny`,
		proj + ": shares host path /root/.aws at /aws, read-write",
		proj + ": files copies host file /root/.netrc into the guest at /home/agent/.netrc",
		proj + ": env AWS_SECRET_ACCESS_KEY copies the host's $AWS_SECRET_ACCESS_KEY into the sandbox",
		proj + `: env TOKEN = "${GITHUB_TOKEN:-}" reads host variables into the sandbox`,
	}
	got := projectAsks(cfg, user)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A project's reverse forward opens a port of the host's loopback to the
// guest: asked, through the chain a user types (parsed, merged). Its
// forwards.ports and the user's own reverse forwards are not.
func TestProjectAsksForReverseForwards(t *testing.T) {
	const user, proj = "/root/.config/moat/config.toml", "/src/repo/moat.toml"
	u, err := config.Parse(user, []byte("[forwards]\nreverse = [6379]\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := config.Parse(proj, []byte("[forwards]\nports = [3000]\nreverse = [\"15432:5432\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := projectAsks(config.Merge(u, p), user)
	want := []string{proj + ": forwards.reverse lets the sandbox reach port 15432 on this host's loopback (at 10.88.0.1:5432 inside)"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
