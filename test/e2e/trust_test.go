package e2e

// End-to-end test of [network] trust for a host the gate splices: the gate
// verifies an upstream against the trust roots only when it terminates the connection; for a
// spliced host the guest verifies the upstream's own certificate, so the roots must be in the
// guest's trust stores too.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/test/inet"
)

const (
	corpIP = "198.51.100.60"
	// trustRunBound bounds one guest session of three clients against one host.
	trustRunBound = 30 * time.Second
)

// trustToml allows corp.test with no reason to intercept it (no secret, no method/path rule,
// inspect = false), so the gate splices it; %s is the trust line, or nothing.
const trustToml = `[network]
use = ["none"]
allow = ["corp.test"]
inspect = false
%s
`

// TestTrustSplicedHost: corp.test is served with a certificate of the test internet's CA, a
// private CA the guest's image does not ship. Without [network] trust every client in the guest
// refuses it; with it, curl (the system bundle), node (NODE_EXTRA_CA_CERTS) and python's urllib
// accept it; and after the trust line is removed again, the same sandbox, restarted with its
// writable layer (where init wrote the roots) kept, refuses it again.
func TestTrustSplicedHost(t *testing.T) {
	n := inet.Start(t)
	g := newGateEnv(t, n, "trust-e2e", fmt.Sprintf(trustToml, ""))
	g.serve("corp:443", n.HTTPS(t, corpIP, 443, []string{"corp.test"}, inet.Site("")), false)
	n.SetA("corp.test", corpIP)

	steps := []struct {
		name  string
		trust string
		want  bool // the clients accept corp.test's certificate
	}{
		{"without_trust", "", false},
		{"with_trust", fmt.Sprintf("trust = [%q]", g.ca), true},
		{"trust_removed", "", false},
	}
	for i, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(g.dir, "moat.toml"), []byte(fmt.Sprintf(trustToml, st.trust)), 0o644); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				g.up(t)
			} else if r := moat(t, g.dir, g.env, "up", "--reconfigure"); r.code != 0 {
				// A running sandbox keeps the configuration it was made with until this
				// restarts it; its writable layer, and what init wrote into it, stays.
				t.Fatalf("moat up --reconfigure: exit %d\nstderr: %s\n%s", r.code, r.stderr, g.daemonLog())
			}
			f := trustClients(t, g)
			// Spliced: the guest saw the upstream's own certificate, so it, not the gate,
			// verified it.
			if !strings.Contains(f["ISSUER"], "moat test internet CA") {
				t.Errorf("corp.test's issuer as the guest sees it: %q; want the test internet's CA (corp.test must be spliced)", f["ISSUER"])
			}
			for _, c := range []struct{ key, ok string }{
				{"CURL", "inet site corp.test/"},
				{"NODE", "200"},
				{"URLLIB", "200"},
			} {
				if got := strings.HasPrefix(f[c.key], c.ok); got != st.want {
					t.Errorf("%s in the guest: %q; accepted %v, want %v", c.key, f[c.key], got, st.want)
				}
			}
		})
	}
}

// trustClients asks corp.test from the guest with curl, node and python, each trusting only
// what the guest trusts by default, and returns what each printed.
func trustClients(t *testing.T, g *gateEnv) map[string]string {
	t.Helper()
	start := time.Now()
	r := moat(t, g.dir, g.env, "run", "--", "sh", "-c", `
echo "ISSUER=$(openssl s_client -connect corp.test:443 -servername corp.test </dev/null 2>/dev/null | openssl x509 -noout -issuer 2>&1)"
echo "CURL=$(curl -sS --max-time 10 https://corp.test/ 2>&1 | head -1)"
echo "NODE=$(node -e 'fetch("https://corp.test/echo").then(r => console.log(r.status)).catch(e => console.log("ERR", String(e.cause || e)))' 2>&1 | head -1)"
echo "URLLIB=$(python3 -c 'import urllib.request as u; print(u.urlopen("https://corp.test/echo", timeout=10).status)' 2>&1 | tail -1)"
`)
	if took := time.Since(start); took > trustRunBound {
		t.Errorf("one guest run took %v (bound %v)", took.Round(time.Millisecond), trustRunBound)
	}
	if r.code != 0 {
		t.Fatalf("guest script: exit %d\nstdout: %s\nstderr: %s\n%s", r.code, r.stdout, r.stderr, g.daemonLog())
	}
	t.Logf("guest:\n%s", r.stdout)
	return fields(r.stdout)
}
