package cluster

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/gateserve"
)

// Two kinds of sandbox behind one gate: "alpha" may reach
// alpha.moat.test with the TOKEN secret; "beta" may reach beta.moat.test
// and has no secret. The address rule opens the node's private address,
// which the gate refuses as an upstream otherwise.
const (
	policyAlpha = `[network]
use = ["none"]
allow = ["alpha.moat.test", "` + nodeAddr + `"]

[secrets.TOKEN]
from = "env:token"
hosts = ["alpha.moat.test"]
`
	policyBeta = `[network]
use = ["none"]
allow = ["beta.moat.test", "` + nodeAddr + `"]
`
)

var kindsOnce sync.Once
var kindsErr error

// kinds makes both templates and warm pools once, and the alpha Secret.
func kinds(t *testing.T) *env {
	t.Helper()
	e := setUp(t)
	kindsOnce.Do(func() {
		ctx := context.Background()
		_, kindsErr = e.cs.CoreV1().Secrets(e.sbNS).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "alpha-token", Labels: map[string]string{gateserve.LabelGateSecret: "true"}},
			Data:       map[string][]byte{"token": []byte(e.token)},
		}, metav1.CreateOptions{})
		if kindsErr != nil {
			return
		}
		if kindsErr = e.makeKind(ctx, sandboxKind{name: "alpha", policy: policyAlpha}, 1); kindsErr != nil {
			return
		}
		kindsErr = e.makeKind(ctx, sandboxKind{name: "beta", policy: policyBeta}, 1)
	})
	if kindsErr != nil {
		t.Fatal(kindsErr)
	}
	return e
}

// records are the gate's audit records about sandbox, read on the node.
func (e *env) records(t *testing.T, sandbox string) []audit.Record {
	t.Helper()
	var out []audit.Record
	if err := audit.Read(e.audit+"/kubernetes.jsonl", func(r audit.Record) bool {
		if r.Sandbox == sandbox {
			out = append(out, r)
		}
		return true
	}); err != nil {
		t.Fatalf("reading the gate's audit log: %v", err)
	}
	return out
}

// waitRecord waits for a record of sandbox that match accepts.
func (e *env) waitRecord(t *testing.T, sandbox, what string, match func(audit.Record) bool) audit.Record {
	t.Helper()
	var found audit.Record
	err := poll(context.Background(), 10*time.Second, func() (bool, string) {
		for _, r := range e.records(t, sandbox) {
			if match(r) {
				found = r
				return true, ""
			}
		}
		return false, "no audit record of sandbox " + sandbox + ": " + what
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func mustExec(t *testing.T, e *env, pod string, args ...string) string {
	t.Helper()
	out, err := e.exec(context.Background(), pod, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: client %s:\n%s", pod, strings.Join(args, " "), out)
	return out
}

// TestGatedClaim: a claim from a warm pool reaches its allowed host
// through the gate, with the claim's secret swapped in, while the pod
// never holds the value; a denied host gets the gate's 403 and an audit
// record naming the sandbox and the claim.
func TestGatedClaim(t *testing.T) {
	e := kinds(t)
	ctx := context.Background()
	t0 := time.Now()
	sb, pod, err := e.claim(ctx, "alpha-1", "alpha", map[string]string{gateserve.AnnotationSecret: "alpha-token"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("claim alpha-1: sandbox %s, pod %s at %s, in %s", sb, pod.Name, pod.Status.PodIP, time.Since(t0).Round(time.Millisecond))
	claim, err := e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Get(ctx, "alpha-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	out := mustExec(t, e, pod.Name, "get", "https://alpha.moat.test/allowed")
	if !strings.Contains(out, "status=200") {
		t.Fatalf("the allowed host through the gate: %s; want status 200", out)
	}
	if strings.Contains(out, e.token) {
		t.Errorf("the response the pod got carries the secret's value: %s", out)
	}
	var got []string
	for _, s := range e.up.seenBy("alpha.moat.test") {
		got = append(got, s.auth)
	}
	if len(got) == 0 || got[len(got)-1] != "Bearer "+e.token {
		t.Fatalf("the upstream saw Authorization %q; want the claim's real value swapped in", got)
	}
	e.waitRecord(t, sb, "an allowed request to alpha.moat.test naming claim alpha-1", func(r audit.Record) bool {
		return r.Verdict == audit.Allow && r.Name == "alpha.moat.test" && r.Claim == "alpha-1" && r.ClaimUID == string(claim.UID) &&
			r.Namespace == e.sbNS && r.Pod == pod.Name && r.Template == "alpha"
	})

	// Denied: the name gets no answer, and a connection that names it
	// anyway gets the gate's refusal.
	out = mustExec(t, e, pod.Name, "get", "http://denied.moat.test/x", e.gateIP)
	if !strings.Contains(out, "status=403") {
		t.Fatalf("a denied host: %s; want the gate's 403", out)
	}
	if n := len(e.up.seenBy("denied.moat.test")); n != 0 {
		t.Fatalf("the upstream saw %d requests for the denied host", n)
	}
	rec := e.waitRecord(t, sb, "a denial of denied.moat.test", func(r audit.Record) bool {
		return r.Verdict == audit.Deny && r.Name == "denied.moat.test"
	})
	if rec.Claim != "alpha-1" || rec.ClaimUID != string(claim.UID) || rec.SandboxUID == "" || rec.Namespace != e.sbNS {
		t.Errorf("the denial's record: sandbox %q (uid %q) claim %q (uid %q) namespace %q; want sandbox %s, claim alpha-1 (uid %s) in %s",
			rec.Sandbox, rec.SandboxUID, rec.Claim, rec.ClaimUID, rec.Namespace, sb, claim.UID, e.sbNS)
	}

	// The value is nowhere the pod can read: not its environment, not a
	// file, and not the API objects it is made from.
	out = mustExec(t, e, pod.Name, "find", hex.EncodeToString([]byte(e.token)))
	if strings.Contains(out, "found=") {
		t.Errorf("the sandbox pod holds the secret's value: %s", out)
	}
	if !strings.Contains(out, "searched=") {
		t.Errorf("the search did not finish: %s", out)
	}
	ph := mustExec(t, e, pod.Name, "find", hex.EncodeToString([]byte("moat-ph-")))
	if !strings.Contains(ph, "found=env") {
		t.Errorf("the pod's environment has no placeholder: %s", ph)
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("the sandbox pod mounts a ServiceAccount token: it could read API objects")
	}
	e.noValueIn(t, ctx, pod.Name, sb, "alpha-1")
}

// noValueIn checks that the API objects a sandbox is made of do not
// carry the value (only the Secret, which the pod cannot read, does).
func (e *env) noValueIn(t *testing.T, ctx context.Context, pod, sandbox, claim string) {
	t.Helper()
	var objs []any
	p, _ := e.cs.CoreV1().Pods(e.sbNS).Get(ctx, pod, metav1.GetOptions{})
	sb, _ := e.ag.AgentsV1beta1().Sandboxes(e.sbNS).Get(ctx, sandbox, metav1.GetOptions{})
	cl, _ := e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Get(ctx, claim, metav1.GetOptions{})
	tpl, _ := e.ext.ExtensionsV1beta1().SandboxTemplates(e.sbNS).Get(ctx, "alpha", metav1.GetOptions{})
	cms, _ := e.cs.CoreV1().ConfigMaps(e.sbNS).List(ctx, metav1.ListOptions{})
	objs = append(objs, p, sb, cl, tpl, cms)
	for _, o := range objs {
		if s := fmt.Sprintf("%+v", o); strings.Contains(s, e.token) {
			t.Errorf("an API object of the sandbox carries the secret's value: %T", o)
		}
	}
}

// TestTwoTenants: behind one gate, each sandbox gets its own policy and
// nothing of the other's.
func TestTwoTenants(t *testing.T) {
	e := kinds(t)
	ctx := context.Background()
	sbA, podA, err := e.claim(ctx, "alpha-2", "alpha", map[string]string{gateserve.AnnotationSecret: "alpha-token"})
	if err != nil {
		t.Fatal(err)
	}
	sbB, podB, err := e.claim(ctx, "beta-2", "beta", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pod, url, want string
	}{
		{podA.Name, "https://alpha.moat.test/two", "status=200"},
		{podA.Name, "http://beta.moat.test/two", "status=403"},
		// beta has no secret, so the gate splices its TLS and the pod
		// would see the test upstream's own certificate: plain HTTP.
		{podB.Name, "http://beta.moat.test/two", "status=200"},
		{podB.Name, "http://alpha.moat.test/two", "status=403"},
	} {
		out := mustExec(t, e, c.pod, "get", c.url, e.gateIP)
		if !strings.Contains(out, c.want) {
			t.Errorf("%s -> %s: %s; want %s", c.pod, c.url, out, c.want)
		}
	}
	// beta's request carried no value: it has none, and alpha's
	// placeholder means nothing in its requests.
	for _, s := range e.up.seenBy("beta.moat.test") {
		if strings.Contains(s.auth, e.token) {
			t.Errorf("beta's request reached its host with alpha's secret value")
		}
	}
	e.waitRecord(t, sbB, "beta's denial of alpha.moat.test", func(r audit.Record) bool {
		return r.Verdict == audit.Deny && r.Name == "alpha.moat.test" && r.Claim == "beta-2"
	})
	e.waitRecord(t, sbA, "alpha's denial of beta.moat.test", func(r audit.Record) bool {
		return r.Verdict == audit.Deny && r.Name == "beta.moat.test" && r.Claim == "alpha-2"
	})
}

// ipamDir is where the cluster's host-local IPAM keeps its leases
// (scripts/cluster.sh's CNI configuration).
const ipamDir = "/var/lib/moat-cluster/cni/ipam/moat"

// nextAddress makes host-local give addr to the next pod: it hands out
// the address after the last one it reserved.
func nextAddress(t *testing.T, addr netip.Addr) {
	t.Helper()
	lock, err := os.OpenFile(filepath.Join(ipamDir, "lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("opening host-local's lock: %v", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	if err := os.WriteFile(filepath.Join(ipamDir, "last_reserved_ip.0"), []byte(addr.Prev().String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestAddressReuse: a sandbox's pod is deleted and its address given to
// another sandbox's pod; the new pod gets its own rules, never the old
// tenant's, nor its secret even when it sends the old placeholder.
func TestAddressReuse(t *testing.T) {
	e := kinds(t)
	ctx := context.Background()
	sbA, podA, err := e.claim(ctx, "alpha-3", "alpha", map[string]string{gateserve.AnnotationSecret: "alpha-token"})
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr(podA.Status.PodIP)
	if out := mustExec(t, e, podA.Name, "get", "https://alpha.moat.test/reuse-before"); !strings.Contains(out, "status=200") {
		t.Fatalf("alpha before the reuse: %s", out)
	}
	phCM, err := e.cs.CoreV1().ConfigMaps(e.sbNS).Get(ctx, gateserve.PlaceholdersConfigMap("alpha"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alphaPH := phCM.Data["TOKEN"]

	if err := e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Delete(ctx, "alpha-3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 2*time.Minute, func() (bool, string) {
		_, err := e.cs.CoreV1().Pods(e.sbNS).Get(ctx, podA.Name, metav1.GetOptions{})
		_, lease := os.Stat(filepath.Join(ipamDir, addr.String()))
		return err != nil && lease != nil, fmt.Sprintf("pod %s still there (%v) or %s still leased", podA.Name, err, addr)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("sandbox %s's pod %s is gone and %s is free", sbA, podA.Name, addr)

	nextAddress(t, addr)
	pool, err := e.ext.ExtensionsV1beta1().SandboxWarmPools(e.sbNS).Get(ctx, "beta", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool.Spec.Replicas = ptr(*pool.Spec.Replicas + 1)
	if _, err := e.ext.ExtensionsV1beta1().SandboxWarmPools(e.sbNS).Update(ctx, pool, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var podB *corev1.Pod
	if err := poll(ctx, 2*time.Minute, func() (bool, string) {
		pods, err := e.cs.CoreV1().Pods(e.sbNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Status.PodIP == addr.String() && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				podB = &p
				return true, ""
			}
		}
		return false, "no running pod at " + addr.String() + " yet: " + e.podStates(ctx)
	}); err != nil {
		t.Fatal(err)
	}
	ref := metav1.GetControllerOf(podB)
	if ref == nil || !strings.HasPrefix(ref.Name, "beta") {
		t.Fatalf("the pod at %s is %s, owned by %v; want a beta sandbox's", addr, podB.Name, ref)
	}
	sbB := ref.Name
	t.Logf("beta sandbox %s's pod %s has %s", sbB, podB.Name, addr)

	out := mustExec(t, e, podB.Name, "get", "https://alpha.moat.test/reuse-after", e.gateIP, alphaPH)
	if !strings.Contains(out, "status=403") && !strings.Contains(out, "error=") {
		t.Errorf("the new pod reached alpha's host: %s", out)
	}
	for _, s := range e.up.seenBy("alpha.moat.test") {
		if s.path == "/reuse-after" {
			t.Errorf("alpha's host got a request from the new pod, Authorization %q", s.auth)
		}
	}
	if out := mustExec(t, e, podB.Name, "get", "http://beta.moat.test/reuse-after"); !strings.Contains(out, "status=200") {
		t.Errorf("the new pod does not get its own rules: %s", out)
	}
	for _, r := range e.records(t, sbA) {
		if r.Pod == podB.Name {
			t.Errorf("a record of the new pod names the old sandbox: %+v", r)
		}
	}
	e.waitRecord(t, sbB, "beta's request at the reused address", func(r audit.Record) bool {
		return r.Verdict == audit.Allow && r.Name == "beta.moat.test" && r.Pod == podB.Name && r.Claim == ""
	})
}

// TestGateRestart: the gate's pod is deleted while a sandbox sends
// requests; every request that reached the upstream has an audit record,
// and none passes while no gate serves.
func TestGateRestart(t *testing.T) {
	e := kinds(t)
	ctx := context.Background()
	sb, pod, err := e.claim(ctx, "beta-4", "beta", nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 150
	done := make(chan string, 1)
	go func() {
		out, err := e.exec(ctx, pod.Name, "loop", "http://beta.moat.test/restart", fmt.Sprint(n))
		if err != nil {
			out += "\nexec: " + err.Error()
		}
		done <- out
	}()
	time.Sleep(2 * time.Second)
	gates, err := e.cs.CoreV1().Pods(e.gateNS).List(ctx, metav1.ListOptions{})
	if err != nil || len(gates.Items) == 0 {
		t.Fatalf("listing the gate's pods: %v", err)
	}
	t0 := time.Now()
	if err := e.cs.CoreV1().Pods(e.gateNS).Delete(ctx, gates.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.waitGate(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("the gate's pod was replaced in %s", time.Since(t0).Round(time.Millisecond))
	var out string
	select {
	case out = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the client's loop did not end")
	}
	ok := strings.Count(out, "status=200")
	failed := strings.Count(out, "error=")
	t.Logf("of %d requests: %d answered 200, %d failed", n, ok, failed)
	if failed == 0 {
		t.Logf("no request failed: the restart fell between requests")
	}
	allowed := map[string]bool{}
	for _, r := range e.records(t, sb) {
		if r.Verdict == audit.Allow && r.Name == "beta.moat.test" {
			allowed[r.Path] = true
		}
	}
	var seen int
	for _, s := range e.up.seenBy("beta.moat.test") {
		if !strings.HasPrefix(s.path, "/restart/") {
			continue
		}
		seen++
		if !allowed[s.path] {
			t.Errorf("the upstream got %s, which no audit record allows", s.path)
		}
	}
	if seen != ok {
		t.Errorf("the upstream saw %d requests, the client got %d answers", seen, ok)
	}
	if seen == 0 {
		t.Fatalf("nothing reached the upstream: %s", out)
	}
}

// TestUnknownPod: a pod the gate does not serve (its template names no
// policy) gets nothing from the gate: its connection is refused, nothing
// reaches the upstream, and the gate records the address as unknown.
func TestUnknownPod(t *testing.T) {
	e := kinds(t)
	ctx := context.Background()
	if err := e.makeUngated(ctx); err != nil {
		t.Fatal(err)
	}
	_, pod, err := e.claim(ctx, "plain-unknown", "plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	out := mustExec(t, e, pod.Name, "get", "http://beta.moat.test/unknown", e.gateIP)
	if strings.Contains(out, "status=") {
		t.Errorf("a pod the gate does not serve got an answer through it: %s", out)
	}
	if e.up.saw("beta.moat.test", "/unknown", "") {
		t.Errorf("the upstream got a request from a pod the gate does not serve")
	}
	err = poll(ctx, 10*time.Second, func() (bool, string) {
		var found bool
		audit.Read(e.audit+"/unknown.jsonl", func(r audit.Record) bool {
			if r.Verdict == audit.Deny && r.RejectedBy == audit.StepSource && strings.Contains(string(r.Reason), pod.Status.PodIP) {
				found = true
			}
			return !found
		})
		return found, "no record of " + pod.Status.PodIP + " in unknown.jsonl"
	})
	if err != nil {
		t.Fatal(err)
	}
}
