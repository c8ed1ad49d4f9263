//go:build linux

// The moat-cni half of the cluster tests (docs/kubernetes.md, "Egress enforced outside the sandbox"):
//
//	scripts/cluster.sh up
//	MOAT_CLUSTER=1 go test -count=1 -v ./test/cluster -run TestCNI

package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"moat.dev/moat/internal/gatecni"
)

// The cluster's layout, as scripts/cluster.sh makes it.
const (
	cniRunDir        = "/run/moat-cluster"
	cniConfDir       = "/var/lib/moat-cluster/cni/net.d"
	cniBaseConflist  = cniConfDir + "/10-moat.conflist"
	cniContainerdLog = "/var/log/moat-cluster/containerd.log"
	cniNodeIP        = "10.243.0.1"
	cniAPIServiceIP  = "10.96.0.1"
	cniPodBridge     = "moat-cni0"
	// host-local's leases for the cluster's network "moat": a file per
	// address handed out.
	cniLeaseDir = "/var/lib/moat-cluster/cni/ipam/moat"
	// The metadata address clouds serve instance credentials on.
	cniMetadataIP = "169.254.169.254"
)

// cniTestConflist sorts before the cluster's own 10-moat.conflist, so
// containerd (which uses the first conflist of its directory) sets up new
// pods with it while the test runs.
const cniTestConflist = cniConfDir + "/05-moat-cni-test.conflist"

const cniProbeImage = "moat.local/cniprobe:test"

type cniCluster struct {
	cs     kubernetes.Interface
	binDir string // the running containerd's build directory
}

// cniConnect reaches the cluster, or skips without MOAT_CLUSTER=1; with it,
// a missing or sick cluster fails the test.
func cniConnect(t *testing.T) *cniCluster {
	t.Helper()
	if os.Getenv("MOAT_CLUSTER") != "1" {
		t.Skip("needs the test cluster: scripts/cluster.sh up, then MOAT_CLUSTER=1 go test ./test/cluster")
	}
	exe, err := os.ReadFile(filepath.Join(cniRunDir, "containerd.exe"))
	if err != nil {
		t.Fatalf("MOAT_CLUSTER=1 but the cluster's containerd is not running (%v); start it with scripts/cluster.sh up", err)
	}
	kubeconfig := os.Getenv("MOAT_CLUSTER_KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = "/var/lib/moat-cluster/pki/admin.kubeconfig"
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("MOAT_CLUSTER=1 but the cluster's kubeconfig does not load (%v); start it with scripts/cluster.sh up", err)
	}
	cfg.Timeout = 15 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("MOAT_CLUSTER=1 but the API server does not answer (%v); check scripts/cluster.sh status", err)
	}
	ready := false
	for _, n := range nodes.Items {
		for _, c := range n.Status.Conditions {
			ready = ready || c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		}
	}
	if !ready {
		t.Fatalf("MOAT_CLUSTER=1 but no node is Ready; check scripts/cluster.sh status")
	}
	return &cniCluster{cs: cs, binDir: filepath.Dir(strings.TrimSpace(string(exe)))}
}

func cniRun(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// install builds moat-cni into the CNI bin directory containerd uses, as a
// DaemonSet would drop it there, and cniprobe as an image in containerd.
func (c *cniCluster) install(t *testing.T) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	static := []string{"CGO_ENABLED=0"}
	cniRun(t, root, static, "go", "build", "-trimpath", "-o", filepath.Join(tmp, "moat-cni"), "./cmd/moat-cni")
	cniRun(t, root, static, "go", "build", "-trimpath", "-o", filepath.Join(tmp, "cniprobe"), "./test/cluster/cniprobe")
	// Renamed into place: a runtime may be running the previous binary.
	bin, err := os.ReadFile(filepath.Join(tmp, "moat-cni"))
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(c.binDir, "cni", "moat-cni")
	if err := os.WriteFile(dst+".new", bin, 0o755); err != nil {
		t.Fatalf("installing moat-cni: %v", err)
	}
	if err := os.Rename(dst+".new", dst); err != nil {
		t.Fatalf("installing moat-cni: %v", err)
	}
	archive := filepath.Join(tmp, "cniprobe.tar")
	cniRun(t, root, nil, filepath.Join(c.binDir, "clustertool"), "image", "-name", cniProbeImage, "-binary", filepath.Join(tmp, "cniprobe"), "-o", archive)
	cniRun(t, root, nil, filepath.Join(c.binDir, "ctr"), "--address", filepath.Join(cniRunDir, "containerd/containerd.sock"), "-n", "k8s.io", "images", "import", archive)
}

// writeConflist puts the cluster's own conflist with moat-cni chained
// after it first in containerd's directory, and takes it away when the
// test ends (after the test's namespaces, whose pods' DEL needs it).
func (c *cniCluster) writeConflist(t *testing.T, gateIP, gatedNS string) {
	t.Helper()
	base, err := os.ReadFile(cniBaseConflist)
	if err != nil {
		t.Fatalf("reading the cluster's conflist: %v", err)
	}
	var list map[string]any
	if err := json.Unmarshal(base, &list); err != nil {
		t.Fatalf("%s: %v", cniBaseConflist, err)
	}
	// The same name as the cluster's list: host-local keeps its leases
	// per network name, and two names on one subnet would hand out one
	// address twice.
	// Without the cluster's own moat-cni (scripts/cluster.sh chains one
	// for namespace agents): one moat-cni a pod, the test's.
	var plugins []any
	all, _ := list["plugins"].([]any)
	for _, p := range all {
		if m, ok := p.(map[string]any); ok && m["type"] == "moat-cni" {
			continue
		}
		plugins = append(plugins, p)
	}
	list["plugins"] = append(plugins, map[string]any{
		"type":         "moat-cni",
		"gate":         map[string]any{"addresses": []string{gateIP}, "ports": []string{"53/udp", "53/tcp", "80/tcp", "443/tcp"}},
		"namespaces":   []string{gatedNS},
		"capabilities": map[string]bool{"io.kubernetes.cri.pod-annotations": true},
	})
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	// containerd reads only .conf, .conflist and .json: the rename makes
	// it appear whole.
	if err := os.WriteFile(cniTestConflist+".tmp", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(cniTestConflist+".tmp", cniTestConflist); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", cniTestConflist, b)
	// containerd's conf syncer reloads on the directory's inotify event;
	// the pods' set-up below is checked against moat-cni's own log lines.
	time.Sleep(2 * time.Second)
}

func (c *cniCluster) namespace(t *testing.T, prefix string) string {
	t.Helper()
	suffix := make([]byte, 3)
	rand.Read(suffix)
	name := prefix + hex.EncodeToString(suffix)
	ctx := context.Background()
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		// Waited for, so that the conflist the pods' DEL runs is still
		// there (cleanups run last-registered first).
		c.cs.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			_, err := c.cs.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(time.Second)
		}
		t.Logf("namespace %s is still terminating after 90 s", name)
	})
	return name
}

func cniPod(ns, name, runtimeClass string, annotations map[string]string, args ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}, Annotations: annotations},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			AutomountServiceAccountToken:  new(bool),
			Containers: []corev1.Container{{
				Name: "probe", Image: cniProbeImage, ImagePullPolicy: corev1.PullNever,
				Command: append([]string{"/cniprobe"}, args...),
			}},
		},
	}
	if runtimeClass != "" {
		p.Spec.RuntimeClassName = &runtimeClass
		// Root in the guest with the capabilities that reconfigure its
		// network: under gVisor they act on runsc's netstack only.
		root := int64(0)
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{
			RunAsUser:    &root,
			Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}},
		}
	}
	return p
}

// waitPod waits until the pod's phase is one of want and returns it.
func (c *cniCluster) waitPod(t *testing.T, ns, name string, timeout time.Duration, want ...corev1.PodPhase) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *corev1.Pod
	for time.Now().Before(deadline) {
		p, err := c.cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			last = p
			for _, w := range want {
				if p.Status.Phase == w {
					return p
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	phase := "absent"
	if last != nil {
		phase = string(last.Status.Phase)
	}
	t.Fatalf("pod %s/%s is %s after %v, want %v; events: %s", ns, name, phase, timeout, want, c.events(ns, name))
	return nil
}

func (c *cniCluster) events(ns, name string) string {
	evs, err := c.cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

type cniVerdict struct {
	Target string `json:"target"`
	OK     bool   `json:"ok"`
	Err    string `json:"err"`
}

func (c *cniCluster) verdicts(t *testing.T, ns, name string) map[string]cniVerdict {
	t.Helper()
	raw, err := c.cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("reading %s/%s's log: %v", ns, name, err)
	}
	out := map[string]cniVerdict{}
	done := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := sc.Text()
		if line == "probe: done" {
			done = true
			continue
		}
		var v cniVerdict
		if err := json.Unmarshal([]byte(line), &v); err == nil && v.Target != "" {
			out[v.Target] = v
		}
	}
	if !done {
		t.Fatalf("%s/%s did not finish probing; its log:\n%s", ns, name, raw)
	}
	return out
}

// cniSpareAddrs are n addresses of the pod subnet that host-local has not
// handed out, from the top of the range (it hands out from the bottom),
// for probes that send from an address that is not theirs.
func cniSpareAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for i := 254; i > 200 && len(out) < n; i-- {
		a := fmt.Sprintf("10.244.0.%d", i)
		if _, err := os.Stat(filepath.Join(cniLeaseDir, a)); os.IsNotExist(err) {
			out = append(out, a)
		}
	}
	if len(out) < n {
		t.Fatalf("no %d unleased addresses at the top of the pod subnet (%s)", n, cniLeaseDir)
	}
	return out
}

// cniNodeListeners listens on the node's address (TCP and UDP, one port) and
// on the pod bridge's IPv6 link-local address, for the pods to try.
func cniNodeListeners(t *testing.T) (tcp4, udp4, tcp6 string) {
	t.Helper()
	l, err := net.Listen("tcp4", cniNodeIP+":0")
	if err != nil {
		t.Fatalf("listening on the node's address: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	go cniServe(l)
	pc, err := net.ListenPacket("udp4", cniNodeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	br, err := net.InterfaceByName(cniPodBridge)
	if err != nil {
		t.Fatalf("the pod bridge %s: %v", cniPodBridge, err)
	}
	addrs, _ := br.Addrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() == nil && ipn.IP.IsLinkLocalUnicast() {
			l6, err := net.Listen("tcp6", "["+ipn.IP.String()+"%"+cniPodBridge+"]:0")
			if err != nil {
				t.Fatalf("listening on %s's IPv6 link-local address: %v", cniPodBridge, err)
			}
			t.Cleanup(func() { l6.Close() })
			go cniServe(l6)
			// From the pod, the same address is on the other side of eth0.
			tcp6 = fmt.Sprintf("[%s%%eth0]:%d", ipn.IP, l6.Addr().(*net.TCPAddr).Port)
			break
		}
	}
	return l.Addr().String(), pc.LocalAddr().String(), tcp6
}

func cniServe(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Write([]byte("ok\n"))
		c.Close()
	}
}

// cniWaitReachable waits until the node reaches addr (a Service's clusterIP:
// kube-proxy has programmed it).
func cniWaitReachable(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			buf := make([]byte, 3)
			c.SetDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(buf)
			c.Close()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node cannot reach %s after 60 s: %v", addr, err)
		}
		time.Sleep(time.Second)
	}
}

// TestCNIFence: from a gVisor pod that moat-cni gates (by its namespace,
// or by its annotation), as root in its guest, only the gate's address on
// the gate's ports answers; the node, the metadata address, another pod,
// the API server, a cluster DNS Service and IPv6 are dead. The same
// probes from an ungated gVisor pod are the control: what they reach the
// gated pods could have reached but for the fence. Each probe, root with
// NET_ADMIN in its guest, also adds another address of the pod subnet to
// its eth0 and sends to the gate from it: only the ungated one's datagram
// arrives. A pod with a misspelt annotation never gets a network.
//
// The gate here is a stand-in: a Service in front of a pod that answers
// on the gate's ports, so the test does not depend on item 2's gate; the
// plugin knows the gate only by its Service address and ports.
func TestCNIFence(t *testing.T) {
	c := cniConnect(t)
	ctx := context.Background()
	c.install(t)

	openNS := c.namespace(t, "moat-cni-open-")
	gatedNS := c.namespace(t, "moat-cni-gated-")

	// The server is a runc pod in the open namespace: behind the
	// stand-in gate Service, behind a DNS stand-in Service, and as
	// "another pod" itself.
	if _, err := c.cs.CoreV1().Pods(openNS).Create(ctx, cniPod(openNS, "server", "", nil, "serve"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	server := c.waitPod(t, openNS, "server", 90*time.Second, corev1.PodRunning)
	port := func(name string, proto corev1.Protocol, p, target int32) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Protocol: proto, Port: p, TargetPort: intstr.FromInt32(target)}
	}
	svc := func(name string, ports ...corev1.ServicePort) string {
		s, err := c.cs.CoreV1().Services(openNS).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "server"}, Ports: ports},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Spec.ClusterIP
	}
	gateIP := svc("gate",
		port("dns-udp", corev1.ProtocolUDP, 53, 8053), port("dns-tcp", corev1.ProtocolTCP, 53, 8053),
		port("http", corev1.ProtocolTCP, 80, 8080), port("https", corev1.ProtocolTCP, 443, 8443),
		port("other", corev1.ProtocolTCP, 8080, 8080))
	dnsIP := svc("dns", port("dns-udp", corev1.ProtocolUDP, 53, 8053), port("dns-tcp", corev1.ProtocolTCP, 53, 8053))
	cniWaitReachable(t, net.JoinHostPort(gateIP, "443"))
	cniWaitReachable(t, net.JoinHostPort(dnsIP, "53"))

	nodeTCP, nodeUDP, node6 := cniNodeListeners(t)
	c.writeConflist(t, gateIP, gatedNS)
	t.Cleanup(func() { os.Remove(cniTestConflist) }) // runs after the namespaces are gone

	type target struct {
		what, addr string
		gated      bool // reached from a gated pod
		control    bool // reached from the ungated pod; false where the cluster drops it for every pod
	}
	targets := []target{
		{"the gate 443/tcp", "tcp:" + net.JoinHostPort(gateIP, "443"), true, true},
		{"the gate 80/tcp", "tcp:" + net.JoinHostPort(gateIP, "80"), true, true},
		{"the gate 53/tcp", "tcp:" + net.JoinHostPort(gateIP, "53"), true, true},
		{"the gate 53/udp", "udp:" + net.JoinHostPort(gateIP, "53"), true, true},
		{"the gate's address on another port", "tcp:" + net.JoinHostPort(gateIP, "8080"), false, true},
		{"another pod", "tcp:" + net.JoinHostPort(server.Status.PodIP, "8443"), false, true},
		{"a cluster DNS Service 53/udp", "udp:" + net.JoinHostPort(dnsIP, "53"), false, true},
		{"a cluster DNS Service 53/tcp", "tcp:" + net.JoinHostPort(dnsIP, "53"), false, true},
		{"the API server's Service", "tcp:" + net.JoinHostPort(cniAPIServiceIP, "443"), false, true},
		{"the API server on the node", "tcp:" + net.JoinHostPort(cniNodeIP, "6443"), false, true},
		{"the node, TCP", "tcp:" + nodeTCP, false, true},
		{"the node, UDP", "udp:" + nodeUDP, false, true},
		// The cluster's FORWARD chain drops what any pod sends off the
		// pod network, so no pod reaches it (docs/kubernetes.md); the
		// fence drops it before that, in the pod's namespace.
		{"the metadata address", "tcp:" + cniMetadataIP + ":80", false, false},
	}
	if dns, err := c.cs.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{}); err == nil {
		targets = append(targets, target{"kube-dns", "udp:" + net.JoinHostPort(dns.Spec.ClusterIP, "53"), false, true})
	}
	if node6 != "" {
		targets = append(targets, target{"the node over IPv6 (link-local)", "tcp:" + node6, false, true})
	}
	var args []string
	for _, tg := range targets {
		args = append(args, tg.addr)
	}
	args = append([]string{"probe"}, args...)

	spare := cniSpareAddrs(t, 3)
	probes := []struct {
		ns, name    string
		annotations map[string]string
		gated       bool
		spoof       string // an address the probe adds to its eth0 and sends from
	}{
		{gatedNS, "by-namespace", nil, true, spare[0]},
		{openNS, "by-annotation", map[string]string{gatecni.AnnotationEgress: "gate"}, true, spare[1]},
		{openNS, "ungated", nil, false, spare[2]},
	}
	spoofTarget := func(src string) string { return "udp:" + net.JoinHostPort(gateIP, "53") + "@" + src }
	for _, p := range probes {
		pargs := append(append([]string{}, args...), spoofTarget(p.spoof))
		if _, err := c.cs.CoreV1().Pods(p.ns).Create(ctx, cniPod(p.ns, p.name, "gvisor", p.annotations, pargs...), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A value moat-cni does not know fails the pod's network set-up.
	if _, err := c.cs.CoreV1().Pods(openNS).Create(ctx, cniPod(openNS, "misspelt", "gvisor", map[string]string{gatecni.AnnotationEgress: "gated"}, "serve"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, p := range probes {
		c.waitPod(t, p.ns, p.name, 3*time.Minute, corev1.PodSucceeded, corev1.PodFailed)
		got := c.verdicts(t, p.ns, p.name)
		for _, tg := range targets {
			v, ok := got[tg.addr]
			if !ok {
				t.Errorf("%s: no verdict for %s", p.name, tg.addr)
				continue
			}
			want := tg.control
			if p.gated {
				want = tg.gated
			}
			t.Logf("%-13s %-36s %-5v %s", p.name, tg.what, v.OK, v.Err)
			if v.OK != want {
				t.Errorf("%s (gated %v): %s (%s) reached = %v, want %v (%s)", p.name, p.gated, tg.what, tg.addr, v.OK, want, v.Err)
			}
		}
		// From another address of the pod subnet, which root in the guest
		// put on its eth0: the gate must never see it, since it tells
		// tenants apart by source address.
		v := got[spoofTarget(p.spoof)]
		t.Logf("%-13s %-36s %-5v %s", p.name, "the gate 53/udp from "+p.spoof, v.OK, v.Err)
		if strings.HasPrefix(v.Err, "setup:") {
			t.Errorf("%s: %s", p.name, v.Err)
		} else if v.OK != !p.gated {
			t.Errorf("%s (gated %v): the gate from a spoofed source %s reached = %v (%s)", p.name, p.gated, p.spoof, v.OK, v.Err)
		}
	}
	// The server's own log says what reached it, whatever the probes saw.
	serverLog, err := c.cs.CoreV1().Pods(openNS).GetLogs("server", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probes {
		if arrived := strings.Contains(string(serverLog), "from "+p.spoof+":"); arrived == p.gated {
			t.Errorf("%s (gated %v): a datagram from the spoofed %s arrived at the gate's server = %v", p.name, p.gated, p.spoof, arrived)
		}
	}
	if t.Failed() {
		t.Logf("the server's log:\n%s", serverLog)
	}

	// Each pod went through moat-cni: its log line names the decision.
	logb, err := os.ReadFile(cniContainerdLog)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probes {
		want := fmt.Sprintf("moat-cni: pod %s/%s ", p.ns, p.name)
		verdict := " not gated: "
		if p.gated {
			verdict = " gated ("
		}
		found := false
		for _, line := range strings.Split(string(logb), "\n") {
			found = found || strings.Contains(line, want) && strings.Contains(line, verdict)
		}
		if !found {
			t.Errorf("containerd's log has no moat-cni line %q…%q: was the test's conflist loaded?", want, verdict)
		}
	}

	// The misspelt pod never runs, and says why.
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := c.cs.CoreV1().Pods(openNS).Get(ctx, "misspelt", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning || p.Status.PodIP != "" {
			t.Fatalf("the pod annotated %s=gated got a network (phase %s, IP %q)", gatecni.AnnotationEgress, p.Status.Phase, p.Status.PodIP)
		}
		if ev := c.events(openNS, "misspelt"); strings.Contains(ev, "FailedCreatePodSandBox") && strings.Contains(ev, "moat-cni") && strings.Contains(ev, "the only value is") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no FailedCreatePodSandBox event naming moat-cni's refusal for the misspelt pod; events: %s", c.events(openNS, "misspelt"))
		}
		time.Sleep(time.Second)
	}
}
