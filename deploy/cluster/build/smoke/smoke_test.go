// Package smoke checks a running test cluster (scripts/cluster.sh up) end
// to end: a pod of RuntimeClass gvisor runs under runsc, a pod without it
// does not, and agent-sandbox gives a claim from a warm pool a Ready
// Sandbox. It talks to the cluster with the admin kubeconfig that
// `scripts/cluster.sh status` prints; with no cluster it skips, saying so.
//
//	scripts/cluster.sh up
//	cd deploy/cluster/build && go test -count=1 -v ./smoke
package smoke

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// helloImage is imported by scripts/cluster.sh up; see cmd/hello.
const helloImage = "moat.local/hello:1"

// gvisorBanner is the first line gVisor's kernel log prints at boot
// (runsc's pkg/sentry/kernel: "Starting gVisor...").
const gvisorBanner = "Starting gVisor"

var (
	templates  = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}
	warmPools  = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
	claims     = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	sandboxes  = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	kubeconfig = envOr("MOAT_CLUSTER_KUBECONFIG", "/var/lib/moat-cluster/pki/admin.kubeconfig")
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type cluster struct {
	cs  kubernetes.Interface
	dyn dynamic.Interface
	ns  string
}

// newCluster connects and makes a namespace of the test's own, deleted when
// the test ends (with everything in it).
func newCluster(t *testing.T) *cluster {
	t.Helper()
	if _, err := os.Stat(kubeconfig); err != nil {
		t.Skipf("no test cluster (%v); start one with scripts/cluster.sh up, or set MOAT_CLUSTER_KUBECONFIG", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("loading %s: %v", kubeconfig, err)
	}
	cfg.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "smoke-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the test's namespace (is the cluster up? scripts/cluster.sh status): %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", ns.Name, err)
		}
	})
	return &cluster{cs: cs, dyn: dyn, ns: ns.Name}
}

// poll calls f every half second until it returns true or an error, or
// until timeout, when it reports what f last said.
func poll(ctx context.Context, timeout time.Duration, f func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		done, err := f(ctx)
		if done || (err != nil && !errors.Is(err, errNotYet)) {
			return err
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not done after %s: %w", timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// errNotYet wraps what poll reports as progress rather than failure.
var errNotYet = errors.New("not yet")

func helloPod(name, runtimeClass string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: new(false),
			EnableServiceLinks:           new(false),
			Containers: []corev1.Container{{
				Name:            "hello",
				Image:           helloImage,
				ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	if runtimeClass != "" {
		pod.Spec.RuntimeClassName = &runtimeClass
	}
	return pod
}

// runToCompletion runs pod and returns its log once it has exited.
func (c *cluster) runToCompletion(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	ctx := context.Background()
	pods := c.cs.CoreV1().Pods(c.ns)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
	var phase corev1.PodPhase
	err := poll(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase = p.Status.Phase
		if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			return true, nil
		}
		return false, fmt.Errorf("%w: pod %s is %s %s", errNotYet, pod.Name, phase, waitingReasons(p))
	})
	if err != nil {
		t.Fatal(err)
	}
	logs, err := pods.GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("reading the log of pod %s: %v", pod.Name, err)
	}
	if phase != corev1.PodSucceeded {
		t.Fatalf("pod %s %s; its log:\n%s", pod.Name, phase, logs)
	}
	return string(logs)
}

func waitingReasons(p *corev1.Pod) string {
	var rs []string
	for _, s := range p.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil {
			rs = append(rs, w.Reason+": "+w.Message)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			rs = append(rs, string(c.Type)+": "+c.Message)
		}
	}
	return strings.Join(rs, "; ")
}

func TestPodRuntime(t *testing.T) {
	c := newCluster(t)
	tests := []struct {
		name         string
		runtimeClass string
		wantGVisor   bool
	}{
		{"gvisor", "gvisor", true},
		// The control: the same image on the default runtime (runc) must
		// not print gVisor's banner, or the check above proves nothing.
		{"default", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			log := c.runToCompletion(t, helloPod("hello-"+tt.name, tt.runtimeClass))
			t.Logf("pod ran to completion in %s", time.Since(start).Round(time.Millisecond))
			if !strings.Contains(log, "hello from the moat test cluster") {
				t.Fatalf("the pod's log lacks the greeting:\n%s", log)
			}
			if got := strings.Contains(log, gvisorBanner); got != tt.wantGVisor {
				t.Fatalf("log has gVisor's banner = %v, want %v; log:\n%s", got, tt.wantGVisor, log)
			}
		})
	}
}

// TestServiceFromGVisorPod dials the kubernetes Service's clusterIP from a
// gVisor pod: the path kube-proxy gives in-cluster clients (the gate's
// informers) and the one the gate's fixed clusterIP will use.
func TestServiceFromGVisorPod(t *testing.T) {
	c := newCluster(t)
	svc, err := c.cs.CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting the kubernetes Service: %v", err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "443")
	pod := helloPod("dial", "gvisor")
	pod.Spec.Containers[0].Args = []string{"dial", addr}
	log := c.runToCompletion(t, pod)
	if want := "dial " + addr + ": connected"; !strings.Contains(log, want) {
		t.Fatalf("the pod's log lacks %q:\n%s", want, log)
	}
}

// TestSandboxClaim takes a sandbox from a warm pool of one, as moat on
// Kubernetes will: template, pool, claim, and the claim's Sandbox Ready on
// a gVisor pod.
func TestSandboxClaim(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	create := func(gvr schema.GroupVersionResource, obj map[string]any) {
		t.Helper()
		u := &unstructured.Unstructured{Object: obj}
		if _, err := c.dyn.Resource(gvr).Namespace(c.ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	create(templates, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
		"kind":       "SandboxTemplate",
		"metadata":   map[string]any{"name": "smoke"},
		"spec": map[string]any{
			"podTemplate": map[string]any{"spec": map[string]any{
				"runtimeClassName":             "gvisor",
				"automountServiceAccountToken": false,
				"containers": []any{map[string]any{
					"name": "agent", "image": helloImage, "imagePullPolicy": "Never",
					"args": []any{"sleep"},
				}},
			}},
		},
	})
	create(warmPools, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
		"kind":       "SandboxWarmPool",
		"metadata":   map[string]any{"name": "smoke"},
		"spec":       map[string]any{"replicas": int64(1), "sandboxTemplateRef": map[string]any{"name": "smoke"}},
	})
	start := time.Now()
	err := poll(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		pool, err := c.dyn.Resource(warmPools).Namespace(c.ns).Get(ctx, "smoke", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready, _, _ := unstructured.NestedInt64(pool.Object, "status", "readyReplicas")
		if ready >= 1 {
			return true, nil
		}
		return false, fmt.Errorf("%w: warm pool has %d ready; pods: %s", errNotYet, ready, c.podStates(ctx))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("warm pool ready in %s", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	create(claims, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
		"kind":       "SandboxClaim",
		"metadata":   map[string]any{"name": "smoke"},
		"spec":       map[string]any{"warmPoolRef": map[string]any{"name": "smoke"}},
	})
	var sandboxName string
	err = poll(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		claim, err := c.dyn.Resource(claims).Namespace(c.ns).Get(ctx, "smoke", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		sandboxName, _, _ = unstructured.NestedString(claim.Object, "status", "sandbox", "name")
		if sandboxName == "" || !conditionTrue(claim, "Ready") {
			return false, fmt.Errorf("%w: claim: sandbox %q, conditions %v", errNotYet, sandboxName, conditions(claim))
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("claim Ready with sandbox %s in %s", sandboxName, time.Since(start).Round(time.Millisecond))

	sb, err := c.dyn.Resource(sandboxes).Namespace(c.ns).Get(ctx, sandboxName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting the claim's sandbox: %v", err)
	}
	if !conditionTrue(sb, "Ready") {
		t.Fatalf("sandbox %s is not Ready: %v", sandboxName, conditions(sb))
	}
	pods, err := c.cs.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, p := range pods.Items {
		for _, o := range p.OwnerReferences {
			if o.Kind == "Sandbox" && o.Name == sandboxName {
				found = true
				if rc := p.Spec.RuntimeClassName; rc == nil || *rc != "gvisor" {
					t.Errorf("the sandbox's pod %s has runtimeClassName %v, want gvisor", p.Name, rc)
				}
				if p.Status.Phase != corev1.PodRunning {
					t.Errorf("the sandbox's pod %s is %s, want Running", p.Name, p.Status.Phase)
				}
			}
		}
	}
	if !found {
		t.Errorf("no pod in %s is owned by sandbox %s", c.ns, sandboxName)
	}
}

func (c *cluster) podStates(ctx context.Context) string {
	pods, err := c.cs.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return "none"
		}
		return err.Error()
	}
	var s []string
	for i := range pods.Items {
		p := &pods.Items[i]
		s = append(s, fmt.Sprintf("%s %s %s", p.Name, p.Status.Phase, waitingReasons(p)))
	}
	return strings.Join(s, ", ")
}

func conditions(u *unstructured.Unstructured) []metav1.Condition {
	raw, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var out []metav1.Condition
	for _, r := range raw {
		m, _ := r.(map[string]any)
		typ, _ := m["type"].(string)
		status, _ := m["status"].(string)
		reason, _ := m["reason"].(string)
		msg, _ := m["message"].(string)
		out = append(out, metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg})
	}
	return out
}

func conditionTrue(u *unstructured.Unstructured, typ string) bool {
	return meta.IsStatusConditionTrue(conditions(u), typ)
}
