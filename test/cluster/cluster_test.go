// Package cluster tests moat's gate on a real Kubernetes cluster with
// agent-sandbox (docs/kubernetes.md, "The cluster tests"): the gate service as a DaemonSet whose tenants
// are sandbox pods, known by their address through its informers.
//
// It needs root and the test cluster (scripts/cluster.sh up), and runs
// only when asked: MOAT_CLUSTER=1. Asked, it fails (never skips) when
// the cluster is not there. The admin kubeconfig is
// /var/lib/moat-cluster/pki/admin.kubeconfig, or MOAT_CLUSTER_KUBECONFIG.
//
//	scripts/cluster.sh up
//	MOAT_CLUSTER=1 go test -count=1 -v ./test/cluster
//
// Everything the pods reach is on this machine: an HTTPS server and a
// DNS server the test runs on the node's address (10.243.0.1), with a
// test CA the gate is made to trust.
package cluster

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	agentsclient "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned"
	extclient "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"moat.dev/moat/internal/gateserve"
	"moat.dev/moat/internal/tlsca"
)

// nodeAddr is the cluster node's address (scripts/cluster.sh): pods reach
// it, nothing off the machine does.
const nodeAddr = "10.243.0.1"

type env struct {
	rc     *rest.Config
	cs     kubernetes.Interface
	ag     agentsclient.Interface
	ext    extclient.Interface
	gateNS string // the gate's namespace
	sbNS   string // the sandboxes'
	gateIP string // the gate Service's clusterIP
	audit  string // the gate's audit directory on the node
	up     *upstream
	client string // the sandbox client's image
	token  string // the real secret value
}

func connect(t *testing.T) *env {
	t.Helper()
	if os.Getenv("MOAT_CLUSTER") != "1" {
		t.Skip("the cluster tests need the test cluster (scripts/cluster.sh up) and root; run them with MOAT_CLUSTER=1")
	}
	kc := os.Getenv("MOAT_CLUSTER_KUBECONFIG")
	if kc == "" {
		kc = "/var/lib/moat-cluster/pki/admin.kubeconfig"
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatalf("MOAT_CLUSTER=1 but no cluster: loading %s: %v; start one with scripts/cluster.sh up", kc, err)
	}
	rc.Timeout = 20 * time.Second
	e := &env{rc: rc}
	e.cs = kubernetes.NewForConfigOrDie(rc)
	e.ag = agentsclient.NewForConfigOrDie(rc)
	e.ext = extclient.NewForConfigOrDie(rc)
	if _, err := e.cs.Discovery().ServerVersion(); err != nil {
		t.Fatalf("MOAT_CLUSTER=1 but the cluster does not answer: %v; start it with scripts/cluster.sh up", err)
	}
	return e
}

var (
	shared     *env
	sharedErr  error
	sharedOnce sync.Once
)

// setUp starts, once for the package, the upstream servers, the gate and
// the sandboxes' namespace.
func setUp(t *testing.T) *env {
	t.Helper()
	e := connect(t)
	sharedOnce.Do(func() { sharedErr = e.deploy(t) })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil && os.Getenv("MOAT_CLUSTER_KEEP") == "" {
		shared.tearDown()
	}
	os.Exit(code)
}

func (e *env) tearDown() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, ns := range []string{e.sbNS, e.gateNS} {
		e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	}
	e.cs.RbacV1().ClusterRoleBindings().Delete(ctx, e.gateNS, metav1.DeleteOptions{})
	e.cs.RbacV1().ClusterRoles().Delete(ctx, e.gateNS, metav1.DeleteOptions{})
	e.cs.RbacV1().ClusterRoles().Delete(ctx, e.gateNS+"-publish", metav1.DeleteOptions{})
	if e.up != nil {
		e.up.close()
	}
	if e.audit != "" {
		os.RemoveAll(e.audit) // MOAT_CLUSTER_KEEP=1 keeps it with the rest
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (e *env) deploy(t *testing.T) error {
	ctx := context.Background()
	id := randHex(3)
	e.gateNS, e.sbNS = "moat-gt-"+id, "moat-gt-"+id+"-sb"
	e.audit = "/var/log/moat-gate-test/" + id
	e.token = "real-token-" + randHex(12)
	var err error
	if e.up, err = startUpstream(); err != nil {
		return fmt.Errorf("starting the upstream servers on %s: %w", nodeAddr, err)
	}
	gateImage := buildImage(t, "moat.local/moat-gate", "./cmd/moat-gate")
	e.client = buildImage(t, "moat.local/moat-gate-client", "./test/cluster/client")
	shared = e

	for _, ns := range []string{e.gateNS, e.sbNS} {
		if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if err := e.deployGate(ctx, gateImage); err != nil {
		return err
	}
	return nil
}

// deployGate applies what deploy/kubernetes does, in the test's own
// namespace and with the test's addresses: ServiceAccount and RBAC, the
// CA Secret, gate.toml, the Service, the DaemonSet.
func (e *env) deployGate(ctx context.Context, image string) error {
	ns := e.gateNS
	labels := map[string]string{"app.kubernetes.io/name": "moat-gate", "moat.dev/test": ns}
	if _, err := e.cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "moat-gate"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	role := gateClusterRole(ns)
	if _, err := e.cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := e.cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: ns},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "moat-gate", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// The placeholders ConfigMaps are written in the sandboxes' namespace
	// only (gate-rbac.yaml, examples/sandbox-template.yaml).
	if _, err := e.cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-publish"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "update"}}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := e.cs.RbacV1().RoleBindings(e.sbNS).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "moat-gate-publish"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: ns + "-publish"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "moat-gate", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	caDir, err := os.MkdirTemp("", "moat-gate-ca-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(caDir)
	if _, err := tlsca.LoadOrCreate(caDir); err != nil {
		return err
	}
	caPEM, _ := os.ReadFile(caDir + "/" + tlsca.CertFile)
	keyPEM, _ := os.ReadFile(caDir + "/" + tlsca.KeyFile)
	if _, err := e.cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "moat-gate-ca"},
		Data: map[string][]byte{tlsca.CertFile: caPEM, tlsca.KeyFile: keyPEM}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	svc, err := e.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "moat-gate"},
		Spec: corev1.ServiceSpec{Selector: labels, InternalTrafficPolicy: ptr(corev1.ServiceInternalTrafficPolicyLocal),
			Ports: []corev1.ServicePort{
				{Name: "dns-udp", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt(53)},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(53)},
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(80)},
				{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(443)},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	e.gateIP = svc.Spec.ClusterIP
	gateToml := fmt.Sprintf(`[service]
state_dir = "/var/lib/moat-gate"
answer = %q
audit = "/var/log/moat-gate/unknown.jsonl"

[listen]
dns = ["0.0.0.0:53"]
http = ["0.0.0.0:80"]
https = ["0.0.0.0:443"]
metrics = "0.0.0.0:9153"

[upstream]
dns = [%q]

[kubernetes]
node = "env:NODE_NAME"
audit = "/var/log/moat-gate/kubernetes.jsonl"
`, e.gateIP, e.up.dnsAddr)
	if _, err := gateserve.ParseConfig("/etc/moat-gate/gate.toml", []byte(gateToml)); err != nil && !strings.Contains(err.Error(), "NODE_NAME") {
		return fmt.Errorf("the test's gate.toml: %w", err)
	}
	if _, err := e.cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "moat-gate-config"},
		Data: map[string]string{"gate.toml": gateToml, "upstream-ca.pem": string(e.up.caPEM)}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := e.cs.AppsV1().DaemonSets(ns).Create(ctx, gateDaemonSet(ns, image, labels, e.audit), metav1.CreateOptions{}); err != nil {
		return err
	}
	return e.waitGate(ctx, 3*time.Minute)
}

func ptr[T any](v T) *T { return &v }

func gateClusterRole(name string) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"agents.x-k8s.io"}, Resources: []string{"sandboxes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"extensions.agents.x-k8s.io"}, Resources: []string{"sandboxclaims", "sandboxtemplates"}, Verbs: []string{"get", "list", "watch"}},
	}}
}

// gateDaemonSet is deploy/kubernetes/gate-daemonset.yaml with the test's
// image, config and audit directory. hostUsers is left true: the
// cluster's runc (Debian's 1.1.5) predates user namespaces for pods.
func gateDaemonSet(ns, image string, labels map[string]string, auditDir string) *appsv1.DaemonSet {
	caps := []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID", "SETPCAP", "SYS_ADMIN"}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt(9153)}},
		PeriodSeconds: 2, TimeoutSeconds: 2, FailureThreshold: 1}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "moat-gate", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:            "moat-gate",
					AutomountServiceAccountToken:  ptr(false), // the gate's container alone mounts it
					EnableServiceLinks:            ptr(false),
					TerminationGracePeriodSeconds: ptr(int64(5)),
					SecurityContext:               &corev1.PodSecurityContext{FSGroup: ptr(int64(65534)), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
					Containers: []corev1.Container{{
						Name: "gate", Image: image, ImagePullPolicy: corev1.PullNever,
						Args: []string{"serve", "--config", "/etc/moat-gate/gate.toml"},
						Env: []corev1.EnvVar{
							{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
							{Name: "SSL_CERT_FILE", Value: "/etc/moat-gate/upstream-ca.pem"},
						},
						SecurityContext: &corev1.SecurityContext{
							RunAsUser: ptr(int64(0)), RunAsGroup: ptr(int64(0)), RunAsNonRoot: ptr(false), Privileged: ptr(false),
							AllowPrivilegeEscalation: ptr(false), ReadOnlyRootFilesystem: ptr(true),
							SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined},
							Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: caps},
						},
						ReadinessProbe: probe,
						VolumeMounts: []corev1.VolumeMount{
							{Name: "config", MountPath: "/etc/moat-gate", ReadOnly: true},
							{Name: "state", MountPath: "/var/lib/moat-gate"},
							{Name: "ca", MountPath: "/var/lib/moat-gate/ca", ReadOnly: true},
							{Name: "audit", MountPath: "/var/log/moat-gate"},
							{Name: "tmp", MountPath: "/tmp"},
							{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
						},
					}, {
						// The audit follower: the node's records on its
						// stdout, which moat network audit reads.
						Name: "audit", Image: image, ImagePullPolicy: corev1.PullNever,
						Args: []string{"audit-follow", "/var/log/moat-gate/kubernetes.jsonl"},
						SecurityContext: &corev1.SecurityContext{
							RunAsUser: ptr(int64(65534)), RunAsGroup: ptr(int64(65534)), RunAsNonRoot: ptr(true), Privileged: ptr(false),
							AllowPrivilegeEscalation: ptr(false), ReadOnlyRootFilesystem: ptr(true),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "audit", MountPath: "/var/log/moat-gate", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{
						{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
							DefaultMode: ptr(int32(0o444)),
							Sources: []corev1.VolumeProjection{
								{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr(int64(3607))}},
								{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
									Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
								{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
									{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
							}}}},
						{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "moat-gate-config"}}}},
						{Name: "ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "moat-gate-ca", DefaultMode: ptr(int32(0o400))}}},
						{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "audit", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: auditDir, Type: ptr(corev1.HostPathDirectoryOrCreate)}}},
						{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
					},
				},
			},
		},
	}
}

// waitGate waits for the gate's pod to be Ready (its informers synced).
func (e *env) waitGate(ctx context.Context, limit time.Duration) error {
	return poll(ctx, limit, func() (bool, string) {
		pods, err := e.cs.CoreV1().Pods(e.gateNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var states []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && podReady(&p) {
				return true, ""
			}
			states = append(states, p.Name+":"+string(p.Status.Phase)+":"+containerStates(&p))
		}
		return false, "gate pods: " + strings.Join(states, ", ") + e.gateLogs(ctx)
	})
}

func (e *env) gateLogs(ctx context.Context) string {
	pods, err := e.cs.CoreV1().Pods(e.gateNS).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) == 0 {
		return ""
	}
	tail := int64(15)
	b, _ := e.cs.CoreV1().Pods(e.gateNS).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
	return "\ngate log:\n" + string(b)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func containerStates(p *corev1.Pod) string {
	var out []string
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			out = append(out, c.State.Waiting.Reason+" "+c.State.Waiting.Message)
		case c.State.Terminated != nil:
			out = append(out, fmt.Sprintf("terminated %d %s", c.State.Terminated.ExitCode, c.State.Terminated.Message))
		case c.State.Running != nil:
			out = append(out, "running")
		}
	}
	return strings.Join(out, ";")
}

// poll calls cond every 250 ms until it holds or limit passes; the error
// says what cond last saw.
func poll(ctx context.Context, limit time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %s", limit, why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// upstream is the "internet" of the tests: an HTTPS and HTTP server on
// the node's address that answers any name under moat.test and records
// each request's Authorization header, and a DNS server that resolves
// those names to the node's address.
type upstream struct {
	caPEM    []byte
	dnsAddr  string
	https    *http.Server
	http     *http.Server
	dns      *dns.Server
	mu       sync.Mutex
	requests []seen
}

type seen struct {
	host, path, auth string
}

func (u *upstream) seenBy(host string) []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []seen
	for _, s := range u.requests {
		if s.host == host {
			out = append(out, s)
		}
	}
	return out
}

// saw reports whether host got a request for path, with the
// Authorization auth when auth is not "".
func (u *upstream) saw(host, path, auth string) bool {
	for _, s := range u.seenBy(host) {
		if s.path == path && (auth == "" || s.auth == auth) {
			return true
		}
	}
	return false
}

func startUpstream() (*upstream, error) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "moat cluster test upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "moat.test"},
		DNSNames: []string{"*.moat.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	u := &upstream{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.requests = append(u.requests, seen{host: strings.Split(r.Host, ":")[0], path: r.URL.Path, auth: r.Header.Get("Authorization")})
		u.mu.Unlock()
		// Echoed: the gate must scrub the value back to the placeholder.
		fmt.Fprintf(w, "hello from %s; you sent %s", r.Host, r.Header.Get("Authorization"))
	})
	tlsLn, err := net.Listen("tcp", nodeAddr+":443")
	if err != nil {
		return nil, err
	}
	httpLn, err := net.Listen("tcp", nodeAddr+":80")
	if err != nil {
		tlsLn.Close()
		return nil, err
	}
	u.https = &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}}}
	u.http = &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go u.https.ServeTLS(tlsLn, "", "")
	go u.http.Serve(httpLn)
	pc, err := net.ListenPacket("udp", nodeAddr+":0")
	if err != nil {
		u.close()
		return nil, err
	}
	u.dnsAddr = pc.LocalAddr().String()
	u.dns = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, qq := range q.Question {
			if qq.Qtype == dns.TypeA && strings.HasSuffix(qq.Name, "moat.test.") {
				rr, _ := dns.NewRR(qq.Name + " 5 IN A " + nodeAddr)
				m.Answer = append(m.Answer, rr)
			}
		}
		w.WriteMsg(m)
	})}
	go u.dns.ActivateAndServe()
	return u, nil
}

func (u *upstream) close() {
	if u.https != nil {
		u.https.Close()
	}
	if u.http != nil {
		u.http.Close()
	}
	if u.dns != nil {
		u.dns.Shutdown()
	}
}

// exec runs the client in a sandbox pod through the API (as moat run
// --runtime kubernetes will) and returns its stdout.
func (e *env) exec(ctx context.Context, pod string, args ...string) (string, error) {
	req := e.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(e.sbNS).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "agent", Command: append([]string{"/client"}, args...), Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(e.rc, "GET", req.URL().String())
	if err != nil {
		return "", err
	}
	spdy, err := remotecommand.NewSPDYExecutor(e.rc, "POST", req.URL())
	if err != nil {
		return "", err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool { return true })
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return stdout.String(), fmt.Errorf("exec %v in %s: %w (stderr %q)", args, pod, err, stderr.String())
	}
	return stdout.String(), nil
}

// sandboxKind is one template with its warm pool.
type sandboxKind struct {
	name   string // template, pool and policy ConfigMap
	policy string // moat.toml
	secret string // the Secret its claims get; "" none
	// podAnnotations go on its pods (moat-cni's moat.dev/egress).
	podAnnotations map[string]string
}

// makeKind creates a template whose sandboxes run the client, its policy
// and a warm pool of replicas.
func (e *env) makeKind(ctx context.Context, k sandboxKind, replicas int32) error {
	return e.makeKindWith(ctx, k, replicas, true)
}

// makeKindWith is makeKind; without gated, the template names no policy
// and its pods keep the cluster's DNS settings and reach what the pod
// network lets them: agent-sandbox without the gate.
func (e *env) makeKindWith(ctx context.Context, k sandboxKind, replicas int32, gated bool) error {
	ann := map[string]string{}
	if gated {
		if _, err := e.cs.CoreV1().ConfigMaps(e.sbNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: k.name + "-policy"},
			Data: map[string]string{gateserve.PolicyKey: k.policy}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		ann[gateserve.AnnotationPolicy] = k.name + "-policy"
	}
	if k.secret != "" {
		ann[gateserve.AnnotationSecret] = k.secret
	}
	phCM := gateserve.PlaceholdersConfigMap(k.name)
	tpl := &extv1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: k.name, Annotations: ann},
		Spec: extv1.SandboxTemplateSpec{SandboxBlueprint: sandboxv1.SandboxBlueprint{PodTemplate: sandboxv1.PodTemplate{
			ObjectMeta: sandboxv1.PodMetadata{Labels: map[string]string{"moat.dev/gate-tenant": k.name}, Annotations: k.podAnnotations},
			Spec: corev1.PodSpec{
				RuntimeClassName:             ptr("gvisor"),
				AutomountServiceAccountToken: ptr(false),
				EnableServiceLinks:           ptr(false),
				DNSPolicy:                    corev1.DNSNone,
				DNSConfig:                    &corev1.PodDNSConfig{Nameservers: []string{e.gateIP}, Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("1")}}},
				Containers: []corev1.Container{{
					Name: "agent", Image: e.client, ImagePullPolicy: corev1.PullNever, Args: []string{"sleep"},
					Env: []corev1.EnvVar{
						{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
							LocalObjectReference: corev1.LocalObjectReference{Name: phCM}, Key: "TOKEN", Optional: ptr(true)}}},
						{Name: "SSL_CERT_FILE", Value: "/etc/moat-gate-ca/ca.pem"},
					},
					VolumeMounts: []corev1.VolumeMount{{Name: "gate-ca", MountPath: "/etc/moat-gate-ca", ReadOnly: true}},
				}},
				Volumes: []corev1.Volume{{Name: "gate-ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: phCM}, Items: []corev1.KeyToPath{{Key: gateserve.CAKey, Path: "ca.pem"}}}}}},
			},
		}}},
	}
	if !gated {
		spec := &tpl.Spec.PodTemplate.Spec
		spec.DNSPolicy, spec.DNSConfig, spec.Volumes = corev1.DNSDefault, nil, nil
		spec.Containers[0].Env, spec.Containers[0].VolumeMounts = nil, nil
	}
	if _, err := e.ext.ExtensionsV1beta1().SandboxTemplates(e.sbNS).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		return err
	}
	// The gate publishes the placeholders before any pod can start.
	if err := poll(ctx, time.Minute, func() (bool, string) {
		if !gated {
			return true, ""
		}
		cm, err := e.cs.CoreV1().ConfigMaps(e.sbNS).Get(ctx, phCM, metav1.GetOptions{})
		if err != nil {
			return false, "the gate has not written " + phCM + ": " + err.Error()
		}
		if cm.Data[gateserve.StatusKey] != "ok" {
			return false, "status: " + cm.Data[gateserve.StatusKey]
		}
		return true, ""
	}); err != nil {
		return err
	}
	_, err := e.ext.ExtensionsV1beta1().SandboxWarmPools(e.sbNS).Create(ctx, &extv1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: k.name},
		Spec:       extv1.SandboxWarmPoolSpec{Replicas: ptr(replicas), TemplateRef: extv1.SandboxTemplateRef{Name: k.name}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	return poll(ctx, 4*time.Minute, func() (bool, string) {
		p, err := e.ext.ExtensionsV1beta1().SandboxWarmPools(e.sbNS).Get(ctx, k.name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.ReadyReplicas >= replicas, fmt.Sprintf("warm pool %s: %d ready; pods: %s", k.name, p.Status.ReadyReplicas, e.podStates(ctx))
	})
}

func (e *env) podStates(ctx context.Context) string {
	pods, err := e.cs.CoreV1().Pods(e.sbNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Name+":"+string(p.Status.Phase)+":"+containerStates(&p))
	}
	return strings.Join(out, ", ")
}

// claim takes a sandbox from pool and returns its Sandbox and pod.
func (e *env) claim(ctx context.Context, name, pool string, ann map[string]string) (sandbox string, pod *corev1.Pod, err error) {
	_, err = e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Create(ctx, &extv1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec:       extv1.SandboxClaimSpec{WarmPoolRef: extv1.SandboxWarmPoolRef{Name: pool}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", nil, err
	}
	err = poll(ctx, 2*time.Minute, func() (bool, string) {
		c, err := e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		sandbox = c.Status.SandboxStatus.Name
		if sandbox == "" {
			return false, "claim " + name + " has no sandbox yet"
		}
		pod = e.podOf(ctx, sandbox)
		if pod == nil || pod.Status.Phase != corev1.PodRunning || pod.Labels[extv1.SandboxIDLabel] != string(c.UID) {
			return false, "sandbox " + sandbox + "'s pod not running with the claim's label yet: " + e.podStates(ctx)
		}
		return true, ""
	})
	return sandbox, pod, err
}

func (e *env) podOf(ctx context.Context, sandbox string) *corev1.Pod {
	pods, err := e.cs.CoreV1().Pods(e.sbNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	for _, p := range pods.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "Sandbox" && ref.Name == sandbox && p.DeletionTimestamp == nil {
			return &p
		}
	}
	return nil
}

var errNoRecord = errors.New("no such audit record")

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
