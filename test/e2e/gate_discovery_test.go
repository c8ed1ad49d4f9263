package e2e

// The package registries only the host's tools know (GOPROXY in the environment, what
// `npm config get registry` answers) are allowed from a sandbox's first command on. The daemon
// asks the tools off the start path; a connection to a destination no rule decides waits for
// their answer before it is refused.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"moat.dev/moat/test/inet"
)

func TestRegistryFromHostToolsAtFirstCommand(t *testing.T) {
	n := inet.Start(t)
	const proxyIP = "198.51.100.72"
	n.HTTP(t, proxyIP, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "module proxy\n")
	}))
	n.SetA("goproxy.test", proxyIP)
	n.SetA("notaproxy.test", proxyIP)

	// The default policy, which carries what discovery finds; the proxy is named only in the
	// environment the sandbox is started from, never in a file discovery reads at the start.
	g := newGateEnv(t, n, "gate-e2e-discovery", "[network]\nuse = [\"default\"]\n")
	g.env = append(g.env, "GOPROXY=http://goproxy.test", "GOSUMDB=off")

	// The sandbox starts with this command, its first: the tools are still being asked.
	r := moat(t, g.dir, g.env, "run", "--", "curl", "-sS", "-m", curlMaxTimeS, "http://goproxy.test/")
	if r.code != 0 || r.stdout != "module proxy\n" {
		t.Fatalf("first command to the proxy only GOPROXY names: exit %d, stdout %q, stderr %s\n%s", r.code, r.stdout, r.stderr, g.daemonLog())
	}
	if a, ok := g.expect(t, 0, match{Proto: "tcp", Name: "goproxy.test", Verdict: "allow"}); ok && !strings.Contains(a.Rule, "goproxy.test") {
		t.Errorf("allow record for goproxy.test without its discovered rule: %v", a)
	}
	// What discovery does not name is still refused, with the 403 page.
	r = moat(t, g.dir, g.env, "run", "--", "curl", "-sS", "-m", curlMaxTimeS, "http://notaproxy.test/")
	if !strings.Contains(r.stdout, "moat network allow") {
		t.Errorf("a name discovery does not give went through: exit %d, stdout %q", r.code, r.stdout)
	}
	if _, ok := g.expect(t, 0, match{Proto: "tcp", Name: "notaproxy.test", Verdict: "deny"}); !ok {
		t.Error("no deny record for notaproxy.test")
	}
}
