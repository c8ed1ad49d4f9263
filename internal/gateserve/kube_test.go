package gateserve

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	agentsfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"
	extfake "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned/fake"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"moat.dev/moat/internal/policy"
)

const testNS = "agents"

var yes = true

func owner(apiVersion, kind, name string, uid types.UID) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: &yes}}
}

func testPod(name string, uid types.UID, sandbox string, sbUID types.UID, ip string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: uid,
			OwnerReferences: owner("agents.x-k8s.io/v1beta1", "Sandbox", sandbox, sbUID)},
		Spec:   corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func testSandbox(name string, uid types.UID, template string, claim string, claimUID types.UID) *sandboxv1.Sandbox {
	sb := &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: uid,
		Annotations: map[string]string{sandboxv1.SandboxTemplateRefAnnotation: template}}}
	if claim != "" {
		sb.OwnerReferences = owner("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", claim, claimUID)
	} else {
		sb.OwnerReferences = owner("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool", "pool", "pool-uid")
	}
	return sb
}

func testTemplate(name string, uid types.UID, policy, secret string) *extv1.SandboxTemplate {
	a := map[string]string{AnnotationPolicy: policy}
	if secret != "" {
		a[AnnotationSecret] = secret
	}
	return &extv1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: uid, Annotations: a}}
}

func testClaim(name string, uid types.UID) *extv1.SandboxClaim {
	return &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: uid}}
}

func testPolicy(name, body string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: types.UID("cm-" + name), ResourceVersion: "1"},
		Data: map[string]string{PolicyKey: body}}
}

func testSecret(name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: types.UID("s-" + name), ResourceVersion: "1",
		Labels: map[string]string{LabelGateSecret: "true"}}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

// objects is kubeObjects from maps.
type objects struct {
	sandboxes map[string]*sandboxv1.Sandbox
	claims    map[string]*extv1.SandboxClaim
	templates map[string]*extv1.SandboxTemplate
	cms       map[string]*corev1.ConfigMap
	secrets   map[string]*corev1.Secret
}

func (o objects) Sandbox(ns, n string) *sandboxv1.Sandbox      { return o.sandboxes[n] }
func (o objects) Claim(ns, n string) *extv1.SandboxClaim       { return o.claims[n] }
func (o objects) Template(ns, n string) *extv1.SandboxTemplate { return o.templates[n] }
func (o objects) ConfigMap(ns, n string) *corev1.ConfigMap     { return o.cms[n] }
func (o objects) Secret(ns, n string) *corev1.Secret           { return o.secrets[n] }

const policyA = "[network]\nuse = [\"none\"]\nallow = [\"a.example\"]\n[secrets.TOKEN]\nfrom = \"env:token\"\nhosts = [\"a.example\"]\n"
const policyB = "[network]\nuse = [\"none\"]\nallow = [\"b.example\"]\n"

// TestBindPods: which pod an address belongs to, and when none.
func TestBindPods(t *testing.T) {
	now := metav1.Now()
	base := func() objects {
		return objects{
			sandboxes: map[string]*sandboxv1.Sandbox{"sb-a": testSandbox("sb-a", "sb-a-uid", "tpl-a", "claim-a", "claim-a-uid")},
			claims:    map[string]*extv1.SandboxClaim{"claim-a": testClaim("claim-a", "claim-a-uid")},
			templates: map[string]*extv1.SandboxTemplate{"tpl-a": testTemplate("tpl-a", "tpl-a-uid", "pol-a", "sec-a")},
			cms:       map[string]*corev1.ConfigMap{"pol-a": testPolicy("pol-a", policyA)},
			secrets:   map[string]*corev1.Secret{"sec-a": testSecret("sec-a", map[string]string{"token": "value-of-a-123"})},
		}
	}
	ip := netip.MustParseAddr("10.244.0.7")
	for _, tc := range []struct {
		name    string
		pods    func() []*corev1.Pod
		objs    func(o objects) objects
		want    string // the pod bound at ip, "" for none
		claim   string
		secret  bool
		skipped bool // a reason is logged
	}{
		{name: "claimed", pods: func() []*corev1.Pod { return []*corev1.Pod{testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String())} },
			want: "p", claim: "claim-a", secret: true},
		{name: "warm pool's: no values", pods: func() []*corev1.Pod { return []*corev1.Pod{testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String())} },
			objs: func(o objects) objects {
				o.sandboxes["sb-a"] = testSandbox("sb-a", "sb-a-uid", "tpl-a", "", "")
				return o
			},
			want: "p"},
		{name: "claim names its own Secret", pods: func() []*corev1.Pod { return []*corev1.Pod{testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String())} },
			objs: func(o objects) objects {
				o.claims["claim-a"].Annotations = map[string]string{AnnotationSecret: "missing"}
				return o
			},
			want: "p", claim: "claim-a"},
		{name: "pending", pods: func() []*corev1.Pod {
			p := testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String())
			p.Status.Phase = corev1.PodPending
			return []*corev1.Pod{p}
		}},
		{name: "being deleted", pods: func() []*corev1.Pod {
			p := testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String())
			p.DeletionTimestamp = &now
			return []*corev1.Pod{p}
		}},
		{name: "sandbox of the same name, another uid", pods: func() []*corev1.Pod {
			return []*corev1.Pod{testPod("p", "p-uid", "sb-a", "old-uid", ip.String())}
		}, skipped: true},
		{name: "claim not known yet", pods: func() []*corev1.Pod { return []*corev1.Pod{testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String())} },
			objs: func(o objects) objects { delete(o.claims, "claim-a"); return o }, skipped: true},
		{name: "template without policy", pods: func() []*corev1.Pod { return []*corev1.Pod{testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String())} },
			objs: func(o objects) objects { o.templates["tpl-a"].Annotations = nil; return o }},
		{name: "not a sandbox's pod", pods: func() []*corev1.Pod {
			p := testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String())
			p.OwnerReferences = owner("apps/v1", "ReplicaSet", "rs", "rs-uid")
			return []*corev1.Pod{p}
		}},
		{name: "two pods on one address", pods: func() []*corev1.Pod {
			return []*corev1.Pod{testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String()), testPod("q", "q-uid", "sb-a", "sb-a-uid", ip.String())}
		}, skipped: true},
		{name: "an unserved pod on the address still blocks it", pods: func() []*corev1.Pod {
			q := testPod("q", "q-uid", "sb-x", "sb-x-uid", ip.String())
			return []*corev1.Pod{testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String()), q}
		}, skipped: true},
		{name: "host network", pods: func() []*corev1.Pod {
			p := testPod("p", "p-uid", "sb-a", "sb-a-uid", ip.String())
			p.Spec.HostNetwork = true
			return []*corev1.Pod{p}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			if tc.objs != nil {
				o = tc.objs(o)
			}
			got, skipped := bindPods(tc.pods(), o)
			b, ok := got[ip]
			switch {
			case tc.want == "" && ok:
				t.Fatalf("%s is bound to pod %s; want nothing", ip, b.id.Pod)
			case tc.want != "" && !ok:
				t.Fatalf("%s is bound to nothing (skipped %v); want pod %s", ip, skipped, tc.want)
			case ok && (b.id.Pod != tc.want || b.id.Claim != tc.claim || (b.secret != nil) != tc.secret):
				t.Fatalf("%s: pod %s claim %q secret %v; want pod %s claim %q secret %v", ip, b.id.Pod, b.id.Claim, b.secret != nil, tc.want, tc.claim, tc.secret)
			}
			if (len(skipped) > 0) != tc.skipped {
				t.Errorf("skipped %v; want a reason logged: %v", skipped, tc.skipped)
			}
		})
	}
}

// TestTemplatePlaceholder: a placeholder the secret package accepts as
// its own, the same for one template and secret, different otherwise.
func TestTemplatePlaceholder(t *testing.T) {
	a := templatePlaceholder("ns", "uid-1", "TOKEN")
	if a != templatePlaceholder("ns", "uid-1", "TOKEN") {
		t.Fatal("not deterministic")
	}
	for _, other := range []string{templatePlaceholder("ns", "uid-2", "TOKEN"), templatePlaceholder("ns", "uid-1", "OTHER"), templatePlaceholder("ns2", "uid-1", "TOKEN")} {
		if other == a {
			t.Fatalf("%s repeats for another template or secret", a)
		}
	}
	if !strings.HasPrefix(a, "moat-ph-") || len(a) != len("moat-ph-")+32 {
		t.Fatalf("%q is not a well-formed placeholder", a)
	}
}

// kubeHarness is a Service with a Kubernetes source over fake clientsets.
type kubeHarness struct {
	svc  *Service
	core *fake.Clientset
	ag   *agentsfake.Clientset
	ext  *extfake.Clientset
}

func newKubeHarness(t *testing.T) *kubeHarness {
	t.Helper()
	dir := t.TempDir()
	cfg, err := ParseConfig(filepath.Join(dir, "gate.toml"), []byte(`
[service]
state_dir = "`+dir+`"
[listen]
dns = ["127.0.0.1:53"]
https = ["127.0.0.1:443"]
[kubernetes]
node = "n1"
`))
	if err != nil {
		t.Fatal(err)
	}
	h := &kubeHarness{core: fake.NewClientset(), ag: agentsfake.NewSimpleClientset(), ext: extfake.NewSimpleClientset()}
	h.svc, err = New(Options{Config: cfg, Listeners: &Listeners{}, Log: slog.New(slog.DiscardHandler),
		Resolvers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
		Kube:      &KubeClients{Core: h.core, Agents: h.ag, Ext: h.ext}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.svc.kube.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; h.svc.kube.audit.Close(); h.svc.unknown.Close() })
	return h
}

// waitFor polls the table until cond holds, for at most 5 s.
func (h *kubeHarness) waitFor(t *testing.T, what string, cond func(tt *tenantTable) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond(h.svc.tenants.Load()) {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *kubeHarness) create(t *testing.T, objs ...any) {
	t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Pod:
			_, err = h.core.CoreV1().Pods(testNS).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ConfigMap:
			_, err = h.core.CoreV1().ConfigMaps(testNS).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Secret:
			_, err = h.core.CoreV1().Secrets(testNS).Create(ctx, o, metav1.CreateOptions{})
		case *sandboxv1.Sandbox:
			_, err = h.ag.AgentsV1beta1().Sandboxes(testNS).Create(ctx, o, metav1.CreateOptions{})
		case *extv1.SandboxClaim:
			_, err = h.ext.ExtensionsV1beta1().SandboxClaims(testNS).Create(ctx, o, metav1.CreateOptions{})
		case *extv1.SandboxTemplate:
			_, err = h.ext.ExtensionsV1beta1().SandboxTemplates(testNS).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("create %T", o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// swapped is what tenant tn sends upstream for a request to host that
// carries placeholder ph, or the error that refused it.
func swapped(tn *tenant, host, ph string) (string, error) {
	h := http.Header{"Authorization": {"Bearer " + ph}}
	if _, err := tn.creds.Request(host, h, &url.URL{Path: "/"}); err != nil {
		return "", err
	}
	return h.Get("Authorization"), nil
}

// TestKubeAddressReuse drives the source through the informers: a
// claimed pod gets its claim's secret; deleted, its address gets
// nothing; the address given to another template's pod gets that pod's
// rules, never the old secret; and a new pod seen while the old one is
// still listed leaves the address to neither.
func TestKubeAddressReuse(t *testing.T) {
	h := newKubeHarness(t)
	ip := netip.MustParseAddr("10.244.0.9")
	h.create(t, testPolicy("pol-a", policyA), testPolicy("pol-b", policyB),
		testSecret("sec-a", map[string]string{"token": "real-value-of-a"}),
		testTemplate("tpl-a", "tpl-a-uid", "pol-a", "sec-a"), testTemplate("tpl-b", "tpl-b-uid", "pol-b", ""),
		testClaim("claim-a", "claim-a-uid"), testSandbox("sb-a", "sb-a-uid", "tpl-a", "claim-a", "claim-a-uid"),
		testClaim("claim-b", "claim-b-uid"), testSandbox("sb-b", "sb-b-uid", "tpl-b", "claim-b", "claim-b-uid"))
	h.create(t, testPod("pod-a", "pod-a-uid", "sb-a", "sb-a-uid", ip.String()))
	h.waitFor(t, "pod-a served", func(tt *tenantTable) bool { return tt.lookup(ip) != nil })
	ta := h.svc.tenants.Load().lookup(ip)
	phA := templatePlaceholder(testNS, "tpl-a-uid", "TOKEN")
	if got, err := swapped(ta, "a.example", phA); err != nil || got != "Bearer real-value-of-a" {
		t.Fatalf("pod-a's request to a.example: %q, %v; want the claim's value swapped in", got, err)
	}

	// The claim's Secret changed to lack the key: pending, and the refusal
	// says where the value was to come from.
	sec, _ := h.core.CoreV1().Secrets(testNS).Get(context.Background(), "sec-a", metav1.GetOptions{})
	sec.Data = map[string][]byte{"other": []byte("something-else-1")}
	sec.ResourceVersion = "2"
	if _, err := h.core.CoreV1().Secrets(testNS).Update(context.Background(), sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "pod-a rebound without the value", func(tt *tenantTable) bool {
		tn := tt.lookup(ip)
		return tn != nil && tn != ta
	})
	if _, err := swapped(h.svc.tenants.Load().lookup(ip), "a.example", phA); err == nil || !strings.Contains(err.Error(), "claim claim-a binds no Secret") {
		t.Fatalf("a request to a.example without the value: %v; want it refused, naming the claim", err)
	}
	first := ta
	ta = h.svc.tenants.Load().lookup(ip)

	// A second pod on the same address while pod-a is still listed (its
	// deletion not seen yet): the address is nobody's.
	h.create(t, testPod("pod-b", "pod-b-uid", "sb-b", "sb-b-uid", ip.String()))
	h.waitFor(t, "the address left to neither pod", func(tt *tenantTable) bool { return tt.lookup(ip) == nil })
	for _, tn := range []*tenant{ta, first} {
		select {
		case <-tn.gone.Done():
		default:
			t.Fatal("pod-a's tenant (or the one it replaced when rebound) was dropped but its connections were not cut")
		}
	}

	if err := h.core.CoreV1().Pods(testNS).Delete(context.Background(), "pod-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "pod-b served once pod-a is gone", func(tt *tenantTable) bool { return tt.lookup(ip) != nil })
	tb := h.svc.tenants.Load().lookup(ip)
	if tb.gateKey != gateKey(kubeID{Namespace: testNS, Sandbox: "sb-b", PodUID: "pod-b-uid"}) {
		t.Fatalf("the address is served as %s; want pod-b", tb.gateKey)
	}
	if d := tb.gate.Policy().Name("a.example", 443); d.Verdict == policy.Allow {
		t.Errorf("pod-b may reach a.example, pod-a's host")
	}
	if got, err := swapped(tb, "a.example", phA); err == nil && strings.Contains(got, "real-value-of-a") {
		t.Fatalf("pod-b's request with pod-a's placeholder got pod-a's value")
	}

	// Deleted: nothing at once.
	if err := h.core.CoreV1().Pods(testNS).Delete(context.Background(), "pod-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "nothing for the address once pod-b is gone", func(tt *tenantTable) bool { return tt.lookup(ip) == nil })
}

// TestKubePublish: the gate writes each served template's ConfigMap with
// the placeholders and its CA, or the reason its sandboxes get nothing.
func TestKubePublish(t *testing.T) {
	h := newKubeHarness(t)
	h.create(t, testPolicy("pol-a", policyA), testPolicy("pol-bad", "[network]\nallow = [\"a.example\"]\n[secrets.T]\nfrom = \"file:/etc/x\"\nhosts = [\"a.example\"]\n"),
		testTemplate("tpl-a", "tpl-a-uid", "pol-a", ""), testTemplate("tpl-bad", "tpl-bad-uid", "pol-bad", ""))
	get := func(name string) *corev1.ConfigMap {
		cm, err := h.core.CoreV1().ConfigMaps(testNS).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return cm
	}
	deadline := time.Now().Add(5 * time.Second)
	for get(PlaceholdersConfigMap("tpl-a")) == nil || get(PlaceholdersConfigMap("tpl-bad")) == nil {
		if time.Now().After(deadline) {
			t.Fatal("after 5 s the gate has not written both templates' ConfigMaps")
		}
		time.Sleep(5 * time.Millisecond)
	}
	a := get(PlaceholdersConfigMap("tpl-a"))
	if a.Data[StatusKey] != "ok" || a.Data["TOKEN"] != templatePlaceholder(testNS, "tpl-a-uid", "TOKEN") || !strings.Contains(a.Data[CAKey], "BEGIN CERTIFICATE") {
		t.Errorf("tpl-a's ConfigMap: %v; want status ok, TOKEN's placeholder and the CA", a.Data)
	}
	if len(a.OwnerReferences) != 1 || a.OwnerReferences[0].UID != "tpl-a-uid" {
		t.Errorf("tpl-a's ConfigMap is owned by %v; want the template, so it goes with it", a.OwnerReferences)
	}
	if bad := get(PlaceholdersConfigMap("tpl-bad")); !strings.Contains(bad.Data[StatusKey], "env:KEY") {
		t.Errorf("tpl-bad's status: %q; want why its policy is refused (%v)", bad.Data[StatusKey], bad.Data)
	}
}

// TestKubeConfig: [kubernetes] and what it may not be set with, each
// refusal naming the line.
func TestKubeConfig(t *testing.T) {
	const head = "[service]\nstate_dir = \"/var/lib/moat-gate\"\n[listen]\ndns = [\"10.0.0.1:53\"]\nhttps = [\"10.0.0.1\"]\n"
	t.Setenv("MOAT_TEST_NODE", "node-7")
	cfg, err := ParseConfig("/etc/gate.toml", []byte(head+"[kubernetes]\nnode = \"env:MOAT_TEST_NODE\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kube == nil || cfg.Kube.Node != "node-7" || cfg.Kube.Audit != "/var/lib/moat-gate/audit/kubernetes.jsonl" || cfg.Kube.Kubeconfig != "" {
		t.Fatalf("[kubernetes] = %+v; want node-7, the default audit log, in-cluster", cfg.Kube)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"with tenants", "[tenants.a]\nsources = [\"10.0.1.0/24\"]\npolicy = [\"/p.toml\"]\n[kubernetes]\n", "gate.toml:9: kubernetes: set with [tenants]"},
		{"node from an unset variable", "[kubernetes]\nnode = \"env:MOAT_TEST_UNSET\"\n", "gate.toml:7: kubernetes.node: \"env:MOAT_TEST_UNSET\": the variable MOAT_TEST_UNSET is not set"},
		{"relative kubeconfig", "[kubernetes]\nkubeconfig = \"admin.kubeconfig\"\n", "kubernetes.kubeconfig: \"admin.kubeconfig\": write an absolute path"},
		{"unknown key", "[kubernetes]\nnamespace = \"agents\"\n", "unknown key kubernetes.namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig("/etc/gate.toml", []byte(head+tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want one with %q", err, tc.want)
			}
		})
	}
}
