package cluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"moat.dev/moat/internal/gatecni"
)

// The gate and moat-cni on one pod: a sandbox claimed through the CLI
// from a template whose pods moat-cni fences (by the moat.dev/egress
// annotation) to the gate's Service. Through the gate it reaches its
// allowed host with the secret swapped in and gets the gate's 403 at a
// denied one; straight to the upstream's address it reaches nothing,
// while the same command from an unfenced sandbox of the same policy
// does (the pod network here enforces no NetworkPolicy: moat-cni is the
// fence). TestCNIFence shows the fence with a stand-in gate; this shows
// the real gate behind it.
func TestGateBehindFence(t *testing.T) {
	e := cliKind(t)
	c := cniConnect(t)
	ctx := context.Background()
	c.install(t)
	// Gated by the annotation only: no pod of the test's namespaces is
	// gated by its namespace (a name no namespace has).
	c.writeConflist(t, e.gateIP, "moat-cni-none-"+randHex(3))
	t.Cleanup(func() { os.Remove(cniTestConflist) })
	k := sandboxKind{name: "fenced", policy: policyAlpha, secret: "alpha-token",
		podAnnotations: map[string]string{gatecni.AnnotationEgress: "gate"}}
	if err := e.makeKind(ctx, k, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.ext.ExtensionsV1beta1().SandboxWarmPools(e.sbNS).Delete(context.Background(), "fenced", metav1.DeleteOptions{})
	})
	if err := e.waitPool(ctx, "cli"); err != nil {
		t.Fatal(err)
	}

	cl := newCLI(t)
	for _, name := range []string{"fenced", "open"} {
		tpl := map[string]string{"fenced": "fenced", "open": "cli"}[name]
		r := cl.run(t, "", "run", "--runtime", "kubernetes", "--namespace", e.sbNS, "--template", tpl, "--gate-namespace", e.gateNS,
			"--name", name, "--", "/client", "say", "up", "", "0")
		if r.code != 0 {
			t.Fatalf("moat run --template %s: exit %d %q", tpl, r.code, r.stderr)
		}
		t.Cleanup(func() { cl.run(t, "", "destroy", name, "--yes") })
	}
	// moat-cni's own word on the fenced pod, in containerd's log.
	logb, err := os.ReadFile(cniContainerdLog)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("moat-cni: pod %s/%s ", e.sbNS, cl.kubeRecord(t, "fenced").Pod)
	verdict := fmt.Sprintf(" gated (annotation %s=gate): ", gatecni.AnnotationEgress)
	only := fmt.Sprintf("may reach only [%s] ", e.gateIP)
	found := false
	for _, line := range strings.Split(string(logb), "\n") {
		found = found || strings.Contains(line, want) && strings.Contains(line, verdict) && strings.Contains(line, only)
	}
	if !found {
		t.Errorf("containerd's log has no line %q…%q…%q: was the fenced pod made with the test's conflist?", want, verdict, only)
	}

	r := cl.run(t, "", "exec", "fenced", "--", "/client", "get", "https://alpha.moat.test/fenced")
	if !strings.Contains(r.stdout, "status=200") || strings.Contains(r.stdout, e.token) {
		t.Errorf("fenced, allowed host through the gate: %q %q; want 200 without the real value", r.stdout, r.stderr)
	}
	if !e.up.saw("alpha.moat.test", "/fenced", "Bearer "+e.token) {
		t.Errorf("the upstream never got /fenced with the real value")
	}
	if r := cl.run(t, "", "exec", "fenced", "--", "/client", "get", "https://beta.moat.test/fenced-denied"); !strings.Contains(r.stdout, "status=403") {
		t.Errorf("fenced, denied host: %q %q; want the gate's 403", r.stdout, r.stderr)
	}
	// Straight to the upstream's address, name and all: the gate is not
	// asked, so only the fence can stop it.
	direct := func(name string) string {
		t0 := time.Now()
		r := cl.run(t, "", "exec", name, "--", "/client", "get", "http://alpha.moat.test/direct-"+name, nodeAddr)
		t.Logf("%s, straight to %s: %s (%s)", name, nodeAddr, strings.TrimSpace(r.stdout), time.Since(t0).Round(time.Millisecond))
		return r.stdout
	}
	if out := direct("open"); !strings.Contains(out, "status=200") {
		t.Fatalf("the unfenced control did not reach the upstream directly (%q): the check below would prove nothing", out)
	}
	if out := direct("fenced"); !strings.Contains(out, "error=") || strings.Contains(out, "status=") {
		t.Errorf("the fenced sandbox reached the upstream around the gate: %q", out)
	}
	if e.up.saw("alpha.moat.test", "/direct-fenced", "") {
		t.Errorf("the upstream got the fenced sandbox's direct request")
	}
}
