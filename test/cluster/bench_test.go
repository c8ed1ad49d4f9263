package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"moat.dev/moat/internal/gateserve"
)

// firstOutputTargets are the claim-to-output benchmark's two kinds, for
// the API's figures and the CLI's alike: through the gate (template
// beta, its name resolved by the gate) and without it (template plain,
// the upstream's address directly).
var firstOutputTargets = []struct{ pool, url string }{
	{"beta", "http://beta.moat.test/first"},
	{"plain", "http://" + nodeAddr + "/first"},
}

// TestClaimToFirstOutput measures the claim-to-output benchmark (docs/kubernetes.md): from creating a
// claim on a warm pool to the first output of a command in the sandbox
// that fetches a page, through the gate (template beta: DNS and HTTP
// through the gate) and without it (a template the gate does not serve,
// as agent-sandbox gives it: the page fetched from the upstream's address
// directly). It logs each round; the figures go to docs/kubernetes.md.
// Rounds alternate so that the machine's load falls on both alike.
func TestClaimToFirstOutput(t *testing.T) {
	e := kinds(t)
	ctx := context.Background()
	if err := e.makeUngated(ctx); err != nil {
		t.Fatal(err)
	}
	const rounds = 3
	type sample struct{ claim, first time.Duration }
	got := map[string][]sample{}
	for i := range rounds {
		for _, v := range firstOutputTargets {
			if err := e.waitPool(ctx, v.pool); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%s-first-%d", v.pool, i)
			t0 := time.Now()
			_, pod, err := e.claim(ctx, name, v.pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			t1 := time.Now()
			out, err := e.exec(ctx, pod.Name, "get", v.url)
			if err != nil || !strings.Contains(out, "status=200") {
				t.Fatalf("%s: %s %v", v.pool, out, err)
			}
			s := sample{t1.Sub(t0), time.Since(t1)}
			got[v.pool] = append(got[v.pool], s)
			t.Logf("%-6s round %d: claim to Ready pod %s, first command's output %s, total %s",
				v.pool, i, s.claim.Round(time.Millisecond), s.first.Round(time.Millisecond), (s.claim + s.first).Round(time.Millisecond))
			e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Delete(ctx, name, metav1.DeleteOptions{})
		}
	}
	for pool, ss := range got {
		var tot []time.Duration
		for _, s := range ss {
			tot = append(tot, s.claim+s.first)
		}
		slices.Sort(tot)
		t.Logf("%-6s median claim to first output %s (of %v)", pool, tot[len(tot)/2].Round(time.Millisecond), tot)
	}
}

var ungatedOnce sync.Once
var ungatedErr error

// makeUngated makes template and pool "plain", once for the tests that
// share it: the same client, no policy annotation, the cluster's own DNS
// settings: what agent-sandbox gives without the gate.
func (e *env) makeUngated(ctx context.Context) error {
	ungatedOnce.Do(func() { ungatedErr = e.makeKindWith(ctx, sandboxKind{name: "plain"}, 1, false) })
	return ungatedErr
}

func (e *env) waitPool(ctx context.Context, name string) error {
	return poll(ctx, 3*time.Minute, func() (bool, string) {
		p, err := e.ext.ExtensionsV1beta1().SandboxWarmPools(e.sbNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.ReadyReplicas >= 1, fmt.Sprintf("warm pool %s has %d ready", name, p.Status.ReadyReplicas)
	})
}

// TestGateOverhead measures, from inside a sandbox pod, the mean time of
// a request on a new connection: directly to the upstream (an ungated
// template), through the gate spliced (plain HTTP, decided by Host), and
// through the gate intercepted (HTTPS with a secret swapped in: the
// gate terminates TLS with its CA and dials the upstream itself).
func TestGateOverhead(t *testing.T) {
	e := kinds(t)
	ctx := context.Background()
	if err := e.makeUngated(ctx); err != nil {
		t.Fatal(err)
	}
	const n = "200"
	for _, v := range []struct{ what, pool, url string }{
		{"direct (no gate)", "plain", "http://" + nodeAddr + "/bench"},
		{"through the gate, HTTP by Host", "beta", "http://beta.moat.test/bench"},
		{"through the gate, HTTPS intercepted, secret swapped", "alpha", "https://alpha.moat.test/bench"},
	} {
		if err := e.waitPool(ctx, v.pool); err != nil {
			t.Fatal(err)
		}
		name := v.pool + "-overhead"
		ann := map[string]string{}
		if v.pool == "alpha" {
			ann[gateserve.AnnotationSecret] = "alpha-token"
		}
		_, pod, err := e.claim(ctx, name, v.pool, ann)
		if err != nil {
			t.Fatal(err)
		}
		out, err := e.exec(ctx, pod.Name, "bench", v.url, n)
		if err != nil || !strings.Contains(out, "failed=0") {
			t.Fatalf("%s: %s %v", v.what, out, err)
		}
		t.Logf("%-52s %s", v.what, strings.TrimSpace(out))
		e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Delete(ctx, name, metav1.DeleteOptions{})
	}
}

// TestCLIClaimToFirstOutput is TestClaimToFirstOutput through the moat
// binary as a user types it: moat run --runtime kubernetes from its start
// to its exit (moat and moat-kube starting, the claim, the wait for a
// Ready pod, the exec and the command's output), through the gate
// (template beta) and without (template plain); then moat destroy. The
// figures go to docs/kubernetes.md beside the API's.
func TestCLIClaimToFirstOutput(t *testing.T) {
	e := kinds(t)
	ctx := context.Background()
	if err := e.makeUngated(ctx); err != nil {
		t.Fatal(err)
	}
	c := newCLI(t)
	const rounds = 3
	got := map[string][]time.Duration{}
	for i := range rounds {
		for _, v := range firstOutputTargets {
			if err := e.waitPool(ctx, v.pool); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%s-cli-%d", v.pool, i)
			r := c.run(t, "", "run", "--runtime", "kubernetes", "--namespace", e.sbNS, "--template", v.pool, "--gate-namespace", e.gateNS,
				"--name", name, "--", "/client", "get", v.url)
			if r.code != 0 || !strings.Contains(r.stdout, "status=200") {
				t.Fatalf("%s: exit %d %q %q", v.pool, r.code, r.stdout, r.stderr)
			}
			got[v.pool] = append(got[v.pool], r.took)
			t.Logf("%-6s round %d: moat run, claim to first output and exit: %s", v.pool, i, r.took.Round(time.Millisecond))
			if d := c.run(t, "", "destroy", name, "--yes"); d.code != 0 {
				t.Fatalf("moat destroy %s: %q", name, d.stderr)
			}
		}
	}
	for pool, ds := range got {
		slices.Sort(ds)
		t.Logf("%-6s median moat run %s (of %v)", pool, ds[len(ds)/2].Round(time.Millisecond), ds)
	}
}
