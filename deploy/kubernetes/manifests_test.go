package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/yaml"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/gateserve"
)

// The cluster's address plan the manifests are written for (their comments
// say so): a conventional kubeadm service CIDR.
var serviceCIDR = netip.MustParsePrefix("10.96.0.0/12")

// gatePorts are what the gate serves its clients, in the pod and in the
// Service alike.
var gatePorts = []portProto{{53, "UDP"}, {53, "TCP"}, {80, "TCP"}, {443, "TCP"}}

type portProto struct {
	port  int32
	proto corev1.Protocol
}

func (p portProto) String() string { return fmt.Sprintf("%d/%s", p.port, p.proto) }

// manifest is one decoded YAML document.
type manifest struct {
	where string // file:document
	obj   runtime.Object
}

func newScheme(t testing.TB) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme,
		networkingv1.AddToScheme, rbacv1.AddToScheme, extv1beta1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// decodeAll decodes every document of data strictly into the type its
// apiVersion and kind name: an unknown field, a duplicate key or a kind
// the scheme does not know is an error naming the document.
func decodeAll(s *runtime.Scheme, name string, data []byte) ([]manifest, error) {
	dec := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, s, s, kjson.SerializerOptions{Yaml: true, Strict: true})
	r := kyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []manifest
	var errs []error
	for i := 1; i < 100; i++ {
		doc, err := r.Read()
		if err == io.EOF {
			return out, errors.Join(errs...)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		where := fmt.Sprintf("%s: document %d", name, i)
		if j, err := yaml.YAMLToJSON(doc); err == nil && string(bytes.TrimSpace(j)) == "null" {
			continue // comments only
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		out = append(out, manifest{where: where, obj: obj})
	}
	return nil, fmt.Errorf("%s: more than 100 documents", name)
}

// loadManifests decodes every .yaml file under this directory.
func loadManifests(t *testing.T) (all []manifest, files map[string][]byte) {
	t.Helper()
	s := newScheme(t)
	files = map[string][]byte{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".yaml" {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[p] = data
		ms, err := decodeAll(s, p, data)
		if err != nil {
			t.Error(err)
		}
		all = append(all, ms...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no .yaml files found")
	}
	return all, files
}

// TestStrictDecoding shows that the decoder the manifests go through
// refuses what a cluster would ignore or refuse: a misspelled field, one
// in the wrong case, a kind it does not know.
func TestStrictDecoding(t *testing.T) {
	s := newScheme(t)
	good := "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  clusterIP: 10.96.0.53\n"
	if ms, err := decodeAll(s, "good.yaml", []byte(good)); err != nil || len(ms) != 1 {
		t.Fatalf("decoding a good Service: %v, %d objects", err, len(ms))
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"misspelled", strings.Replace(good, "clusterIP", "clusterIPP", 1), `unknown field "spec.clusterIPP"`},
		{"wrong case", strings.Replace(good, "clusterIP", "clusterIp", 1), `unknown field "spec.clusterIp"`},
		{"duplicate", good + "  clusterIP: 10.96.0.54\n", `key "clusterIP" already set`},
		{"unknown kind", strings.Replace(good, "kind: Service", "kind: Servise", 1), `no kind "Servise"`},
		{"template typo", "apiVersion: extensions.agents.x-k8s.io/v1beta1\nkind: SandboxTemplate\nmetadata:\n  name: x\nspec:\n  networkPolicy:\n    egres: []\n",
			`unknown field "spec.networkPolicy.egres"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeAll(s, "bad.yaml", []byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one with %q", err, tc.want)
			}
		})
	}
}

// cluster is the manifests sorted by what the checks need.
type cluster struct {
	namespaces map[string]*corev1.Namespace
	configMaps []*corev1.ConfigMap
	daemonSets []*appsv1.DaemonSet
	services   []*corev1.Service
	policies   []*networkingv1.NetworkPolicy
	templates  []*extv1beta1.SandboxTemplate
	accounts   []*corev1.ServiceAccount
	roles      []*rbacv1.ClusterRole
	bindings   []*rbacv1.ClusterRoleBinding
	nsBindings []*rbacv1.RoleBinding
}

func sortManifests(t *testing.T, all []manifest) *cluster {
	c := &cluster{namespaces: map[string]*corev1.Namespace{}}
	for _, m := range all {
		switch o := m.obj.(type) {
		case *corev1.Namespace:
			c.namespaces[o.Name] = o
		case *corev1.ConfigMap:
			c.configMaps = append(c.configMaps, o)
		case *appsv1.DaemonSet:
			c.daemonSets = append(c.daemonSets, o)
		case *corev1.Service:
			c.services = append(c.services, o)
		case *networkingv1.NetworkPolicy:
			c.policies = append(c.policies, o)
		case *extv1beta1.SandboxTemplate:
			c.templates = append(c.templates, o)
		case *corev1.ServiceAccount:
			c.accounts = append(c.accounts, o)
		case *rbacv1.ClusterRole:
			c.roles = append(c.roles, o)
		case *rbacv1.ClusterRoleBinding:
			c.bindings = append(c.bindings, o)
		case *rbacv1.RoleBinding:
			c.nsBindings = append(c.nsBindings, o)
		default:
			// Decoded, but nothing below checks it: add the checks that
			// matter for it before adding it.
			t.Errorf("%s: %T is not checked by this test", m.where, o)
		}
	}
	return c
}

// namespaceLabels are a namespace's labels as the API server keeps them:
// with kubernetes.io/metadata.name, which it sets on every namespace.
func (c *cluster) namespaceLabels(name string) labels.Set {
	l := labels.Set{"kubernetes.io/metadata.name": name}
	if ns := c.namespaces[name]; ns != nil {
		for k, v := range ns.Labels {
			l[k] = v
		}
	}
	return l
}

func TestManifests(t *testing.T) {
	all, files := loadManifests(t)
	c := sortManifests(t, all)
	for _, o := range append(append(append([]metav1.Object{}, objs(c.configMaps)...), objs(c.daemonSets)...),
		append(append(append(objs(c.services), objs(c.policies)...), objs(c.templates)...), objs(c.accounts)...)...) {
		if c.namespaces[o.GetNamespace()] == nil {
			t.Errorf("%s is in namespace %q, which no manifest creates", o.GetName(), o.GetNamespace())
		}
	}
	if len(c.daemonSets) != 1 || len(c.services) != 1 || len(c.templates) != 1 {
		t.Fatalf("%d DaemonSets, %d Services, %d SandboxTemplates; the checks below expect one of each",
			len(c.daemonSets), len(c.services), len(c.templates))
	}
	gate, svc, tmpl := c.daemonSets[0], c.services[0], c.templates[0]
	ctr := checkGatePod(t, gate)
	if ctr == nil {
		return
	}
	cfg := checkGateConfig(t, c, gate, ctr)
	checkService(t, svc, gate, ctr)
	if cfg != nil {
		if got, want := cfg.Answer, netip.MustParseAddr(svc.Spec.ClusterIP); got != want {
			t.Errorf("gate.toml: service.answer = %v, want the Service's clusterIP %v: DNS would send clients elsewhere", got, want)
		}
	}
	checkTemplate(t, c, tmpl, gate, svc, files)
	checkRBAC(t, c, gate, tmpl)
	checkGatePolicy(t, c, gate, tmpl)
	checkSecretsOnlyInGate(t, gate, tmpl)
}

func objs[T metav1.Object](list []T) []metav1.Object {
	out := make([]metav1.Object, len(list))
	for i, o := range list {
		out[i] = o
	}
	return out
}

// checkGatePod checks the gate container's privileges and probes and
// returns it.
func checkGatePod(t *testing.T, d *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 2 || len(spec.InitContainers) != 0 || spec.Containers[0].Name != "gate" || spec.Containers[1].Name != "audit" {
		t.Fatalf("DaemonSet %s: %d containers and %d init containers, want the gate and its audit follower", d.Name, len(spec.Containers), len(spec.InitContainers))
	}
	checkAuditContainer(t, &spec.Containers[1])
	ctr := &spec.Containers[0]
	if ctr.Image != "moat-gate:dev" || ctr.ImagePullPolicy != corev1.PullNever {
		t.Errorf("gate image %q pulled %q, want moat-gate:dev, Never (built and loaded locally)", ctr.Image, ctr.ImagePullPolicy)
	}
	if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("DaemonSet %s: selector %v does not select its own pods (%v)", d.Name, d.Spec.Selector, err)
	}
	// The informers need the API; the ServiceAccount's rights are
	// checked by checkRBAC.
	// The token is mounted into the gate's container alone, not by the
	// automatic mount, which would give it to the audit container too.
	if spec.ServiceAccountName != "moat-gate" || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		auto := "unset (on)"
		if a := spec.AutomountServiceAccountToken; a != nil {
			auto = fmt.Sprint(*a)
		}
		t.Errorf("gate pod: ServiceAccount %q, automatic token mount %s; want moat-gate's, mounted by hand into the gate's container only", spec.ServiceAccountName, auto)
	}
	tokenVols := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil {
					tokenVols[v.Name] = true
				}
			}
		}
	}
	for i, c := range spec.Containers {
		has := false
		for _, m := range c.VolumeMounts {
			if tokenVols[m.Name] {
				has = true
				if i == 0 && m.MountPath != "/var/run/secrets/kubernetes.io/serviceaccount" {
					t.Errorf("gate container: the token at %s, want the ServiceAccount's usual path, which the informers read", m.MountPath)
				}
			}
		}
		if has != (i == 0) {
			t.Errorf("container %s: ServiceAccount token mounted %v; want it in the gate's container only", c.Name, has)
		}
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Error("gate pod shares a host namespace")
	}
	// The gate must start as root to build its jail (gate-daemonset.yaml
	// says why); what makes that root not the node's is a user namespace.
	if spec.HostUsers == nil || *spec.HostUsers {
		t.Error("gate pod: hostUsers is not false; its root and capabilities would be the node's")
	}
	sc := ctr.SecurityContext
	if sc == nil {
		t.Fatal("gate container has no securityContext")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("gate container is privileged")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("gate container: allowPrivilegeEscalation is not false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("gate container: readOnlyRootFilesystem is not true")
	}
	// The pod's default filter is the runtime's, for any container added
	// later. The gate's container leaves it (the runtimes' default refuses
	// pivot_root), and installs its own filter before it reads anything a
	// client sends.
	if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil ||
		spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("gate pod: the default seccomp profile is not RuntimeDefault")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("gate container: capabilities drop %v, want [ALL]", sc.Capabilities)
	} else {
		// Each one the jail's set-up needs; the manifest says why, and the
		// gate drops them all once jailed. Anything else is a mistake.
		// (Spelled without CAP_: the API refuses CAP_SYS_ADMIN beside
		// allowPrivilegeEscalation false.)
		want := []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "NET_BIND_SERVICE", "SETGID", "SETPCAP", "SETUID", "SYS_ADMIN"}
		got := slices.Sorted(slices.Values(sc.Capabilities.Add))
		if !slices.Equal(got, want) {
			t.Errorf("gate container: capabilities add %v, want exactly %v", got, want)
		}
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
	}{{"liveness", ctr.LivenessProbe}, {"readiness", ctr.ReadinessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("gate container: no %s probe over HTTP", p.name)
			continue
		}
		if g := p.probe.HTTPGet; g.Path != "/healthz" || g.Port.String() != "metrics" {
			t.Errorf("gate container: %s probe GET %s on port %s, want /healthz on port metrics", p.name, g.Path, g.Port.String())
		}
	}
	return ctr
}

// checkAuditContainer checks the container whose log is the node's audit
// records (moat network audit reads it): the gate's image following the
// audit file, read-only, as the jailed gate's uid, without capabilities.
func checkAuditContainer(t *testing.T, c *corev1.Container) {
	t.Helper()
	if c.Image != "moat-gate:dev" || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("audit container: image %q pulled %q, want moat-gate:dev, Never", c.Image, c.ImagePullPolicy)
	}
	if !slices.Equal(c.Args, []string{"audit-follow", "/var/log/moat-gate/kubernetes.jsonl"}) {
		t.Errorf("audit container: args %q, want audit-follow of the [kubernetes] audit log", c.Args)
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65534 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		(sc.Privileged != nil && *sc.Privileged) || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("audit container: securityContext %+v; want uid 65534, non-root, no escalation, read-only root, every capability dropped", sc)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "audit" || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("audit container: mounts %+v, want the audit volume alone, read-only", c.VolumeMounts)
	}
}

// containerPort finds a port of c by name.
func containerPort(c *corev1.Container, name string) (corev1.ContainerPort, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p, true
		}
	}
	return corev1.ContainerPort{}, false
}

// mountOf finds the volume mounted at dir in c.
func mountOf(spec corev1.PodSpec, c *corev1.Container, dir string) (corev1.Volume, bool) {
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) != path.Clean(dir) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name {
				return v, true
			}
		}
	}
	return corev1.Volume{}, false
}

// checkGateConfig loads the gate's configuration from its ConfigMap with
// the gate's own loader, and each tenant's policy files with moat.toml's
// parser, and checks them against the pod they are mounted into.
func checkGateConfig(t *testing.T, c *cluster, d *appsv1.DaemonSet, ctr *corev1.Container) *gateserve.Config {
	t.Helper()
	spec := d.Spec.Template.Spec
	i := slices.Index(ctr.Args, "--config")
	if i < 0 || i+1 >= len(ctr.Args) || !slices.Equal(ctr.Args[:i], []string{"serve"}) {
		t.Errorf("gate container args %q, want serve --config FILE (the image's entry point is moat-gate)", ctr.Args)
		return nil
	}
	cfgPath := ctr.Args[i+1]
	// file reads a file of the gate's as mounted from a ConfigMap.
	file := func(p string) ([]byte, error) {
		v, ok := mountOf(spec, ctr, path.Dir(p))
		if !ok || v.ConfigMap == nil {
			return nil, fmt.Errorf("%s: no ConfigMap is mounted at %s", p, path.Dir(p))
		}
		for _, cm := range c.configMaps {
			if cm.Name == v.ConfigMap.Name && cm.Namespace == d.Namespace {
				if data, ok := cm.Data[path.Base(p)]; ok {
					return []byte(data), nil
				}
				return nil, fmt.Errorf("%s: ConfigMap %s has no key %s", p, cm.Name, path.Base(p))
			}
		}
		return nil, fmt.Errorf("%s: no manifest creates ConfigMap %s in %s", p, v.ConfigMap.Name, d.Namespace)
	}
	data, err := file(cfgPath)
	if err != nil {
		t.Error(err)
		return nil
	}
	t.Setenv("NODE_NAME", testNode) // the downward API's, in the pod
	cfg, err := gateserve.ParseConfig(cfgPath, data)
	if err != nil {
		t.Errorf("the gate would refuse its configuration: %v", err)
		return nil
	}

	// Listeners: the container's ports, and the probes' port.
	for _, l := range []struct {
		key  string
		aps  []netip.AddrPort
		port string
	}{{"listen.dns", cfg.DNS, "dns-udp"}, {"listen.dns", cfg.DNS, "dns-tcp"}, {"listen.http", cfg.HTTP, "http"},
		{"listen.https", cfg.HTTPS, "https"}, {"listen.metrics", []netip.AddrPort{cfg.Metrics}, "metrics"}} {
		p, ok := containerPort(ctr, l.port)
		if !ok {
			t.Errorf("gate container: no port named %s", l.port)
			continue
		}
		if len(l.aps) != 1 || int32(l.aps[0].Port()) != p.ContainerPort || !l.aps[0].Addr().IsUnspecified() {
			t.Errorf("gate.toml: %s = %v, want the pod's addresses on port %d (container port %s)", l.key, l.aps, p.ContainerPort, l.port)
		}
	}

	// State: a volume of its own, writable, with the CA Secret at ca/.
	if v, ok := mountOf(spec, ctr, cfg.StateDir); !ok || v.EmptyDir == nil {
		t.Errorf("gate.toml: state_dir %s is not an emptyDir mounted into the gate", cfg.StateDir)
	}
	if v, ok := mountOf(spec, ctr, path.Join(cfg.StateDir, "ca")); !ok || v.Secret == nil {
		t.Errorf("gate.toml: %s/ca is not a Secret (the CA must outlive the pod, or sandboxes stop trusting it)", cfg.StateDir)
	}

	// Tenants are the sandbox pods of the gate's node.
	if cfg.Kube == nil {
		t.Error("gate.toml: no [kubernetes]: the gate would serve no sandbox pod")
		return cfg
	}
	if len(cfg.Tenants) != 0 {
		t.Errorf("gate.toml: [tenants] beside [kubernetes]")
	}
	var nodeFromAPI bool
	for _, e := range ctr.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeFromAPI = true
		}
	}
	if cfg.Kube.Node != testNode || !nodeFromAPI {
		t.Errorf("gate.toml: kubernetes.node is %q with NODE_NAME from the downward API %v; want env:NODE_NAME, the pod's node", cfg.Kube.Node, nodeFromAPI)
	}
	for _, a := range []string{cfg.Audit, cfg.Kube.Audit} {
		if v, ok := mountOf(spec, ctr, path.Dir(a)); !ok || v.HostPath == nil {
			t.Errorf("gate.toml: audit log %s is not on a hostPath: it would go with the pod", a)
		}
	}
	return cfg
}

// checkService checks the Service the sandboxes name as their nameserver.
func checkService(t *testing.T, svc *corev1.Service, d *appsv1.DaemonSet, ctr *corev1.Container) {
	t.Helper()
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !serviceCIDR.Contains(ip) {
		t.Errorf("Service %s: clusterIP %q is not a fixed address in the service CIDR %v", svc.Name, svc.Spec.ClusterIP, serviceCIDR)
	}
	if svc.Namespace != d.Namespace || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service %s does not select the gate's pods", svc.Name)
	}
	var got []portProto
	for _, p := range svc.Spec.Ports {
		got = append(got, portProto{p.Port, p.Protocol})
		// The same number in the pod: the sandboxes' NetworkPolicy sees
		// the pod's port, and lists the gate's ports.
		cp, ok := containerPort(ctr, p.TargetPort.String())
		if !ok || cp.ContainerPort != p.Port || cp.Protocol != p.Protocol {
			t.Errorf("Service port %s targets %q, which is not the gate's %d/%s", p.Name, p.TargetPort.String(), p.Port, p.Protocol)
		}
	}
	if !sameSet(got, gatePorts) {
		t.Errorf("Service ports %v, want %v", got, gatePorts)
	}
}

// checkTemplate checks the sandboxes' DNS and egress: the gate and nothing
// else.
func checkTemplate(t *testing.T, c *cluster, tmpl *extv1beta1.SandboxTemplate, gate *appsv1.DaemonSet, svc *corev1.Service, files map[string][]byte) {
	t.Helper()
	spec := tmpl.Spec.PodTemplate.Spec
	if spec.RuntimeClassName == nil || *spec.RuntimeClassName != "gvisor" {
		t.Errorf("SandboxTemplate %s: runtimeClassName %v, want gvisor", tmpl.Name, spec.RuntimeClassName)
	}
	if spec.DNSPolicy != corev1.DNSNone {
		t.Errorf("SandboxTemplate %s: dnsPolicy %q, want None (else the cluster's DNS answers too)", tmpl.Name, spec.DNSPolicy)
	}
	if spec.DNSConfig == nil || !slices.Equal(spec.DNSConfig.Nameservers, []string{svc.Spec.ClusterIP}) {
		var ns []string
		if spec.DNSConfig != nil {
			ns = spec.DNSConfig.Nameservers
		}
		t.Errorf("SandboxTemplate %s: nameservers %v, want only the gate's %s", tmpl.Name, ns, svc.Spec.ClusterIP)
	} else if len(spec.DNSConfig.Searches) != 0 {
		t.Errorf("SandboxTemplate %s: search domains %v; a name should reach the gate as written", tmpl.Name, spec.DNSConfig.Searches)
	}
	if spec.HostNetwork {
		t.Errorf("SandboxTemplate %s: hostNetwork bypasses every policy", tmpl.Name)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("SandboxTemplate %s: automountServiceAccountToken is not false", tmpl.Name)
	}
	checkTemplatePolicy(t, c, tmpl)

	np := tmpl.Spec.NetworkPolicy
	if m := tmpl.Spec.NetworkPolicyManagement; m != "" && m != extv1beta1.NetworkPolicyManagementManaged {
		t.Errorf("SandboxTemplate %s: networkPolicyManagement %q; Unmanaged ignores the egress rules", tmpl.Name, m)
	}
	if np == nil || len(np.Egress) == 0 {
		// Managed with no rules is agent-sandbox's default: the public
		// internet.
		t.Fatalf("SandboxTemplate %s: no egress rules", tmpl.Name)
	}
	if len(np.Ingress) != 0 {
		t.Errorf("SandboxTemplate %s: ingress rules %v; nothing should connect to a sandbox", tmpl.Name, np.Ingress)
	}
	gateNS, gatePods := c.namespaceLabels(gate.Namespace), labels.Set(gate.Spec.Template.Labels)
	var allowed []portProto
	for i, r := range np.Egress {
		if len(r.To) == 0 || len(r.Ports) == 0 {
			t.Errorf("egress rule %d: empty to or ports, which allows every destination or port", i)
		}
		for _, peer := range r.To {
			if peer.IPBlock != nil {
				t.Errorf("egress rule %d: ipBlock %v; only the gate's pods may be allowed", i, peer.IPBlock)
				continue
			}
			if peer.NamespaceSelector == nil || peer.PodSelector == nil {
				t.Errorf("egress rule %d: a peer without both namespace and pod selectors reaches more than the gate", i)
				continue
			}
			ns, err1 := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
			pods, err2 := metav1.LabelSelectorAsSelector(peer.PodSelector)
			if err := errors.Join(err1, err2); err != nil {
				t.Errorf("egress rule %d: %v", i, err)
				continue
			}
			if ns.Empty() || pods.Empty() || !ns.Matches(gateNS) || !pods.Matches(gatePods) {
				t.Errorf("egress rule %d: peer %v/%v is not exactly the gate's pods (%v in %v)", i, ns, pods, gatePods, gateNS)
			}
			// Nothing else of the cluster: another namespace, or another
			// pod of the gate's namespace.
			if ns.Matches(c.namespaceLabels(tmpl.Namespace)) || pods.Matches(labels.Set{"app.kubernetes.io/name": "other"}) {
				t.Errorf("egress rule %d: peer %v/%v also matches pods that are not the gate", i, ns, pods)
			}
		}
		for _, p := range r.Ports {
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			if p.Port == nil || p.EndPort != nil || p.Port.IntValue() == 0 {
				t.Errorf("egress rule %d: port %v is not a single numbered port", i, p)
				continue
			}
			allowed = append(allowed, portProto{int32(p.Port.IntValue()), proto})
		}
	}
	if !sameSet(allowed, gatePorts) {
		t.Errorf("SandboxTemplate %s: egress ports %v, want %v", tmpl.Name, allowed, gatePorts)
	}
	for name, data := range files {
		if strings.Contains(string(data), "kind: SandboxTemplate") {
			for _, all := range []string{"0.0.0.0/0", "::/0"} {
				if bytes.Contains(data, []byte(all)) {
					t.Errorf("%s: mentions %s", name, all)
				}
			}
		}
	}
}

// checkGatePolicy checks that the gate's own NetworkPolicy lets the
// template's pods reach it on every port they are allowed to use: two
// policies that do not agree drop the traffic silently.
func checkGatePolicy(t *testing.T, c *cluster, gate *appsv1.DaemonSet, tmpl *extv1beta1.SandboxTemplate) {
	t.Helper()
	var np *networkingv1.NetworkPolicy
	for _, p := range c.policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err == nil && p.Namespace == gate.Namespace && !sel.Empty() && sel.Matches(labels.Set(gate.Spec.Template.Labels)) {
			np = p
		}
	}
	if np == nil {
		t.Fatal("no NetworkPolicy selects the gate's pods")
	}
	if types := slices.Sorted(slices.Values(np.Spec.PolicyTypes)); !slices.Equal(types, []networkingv1.PolicyType{"Egress", "Ingress"}) {
		t.Errorf("NetworkPolicy %s: policyTypes %v, want Ingress and Egress", np.Name, np.Spec.PolicyTypes)
	}
	sandboxNS, sandboxPods := c.namespaceLabels(tmpl.Namespace), labels.Set(tmpl.Spec.PodTemplate.ObjectMeta.Labels)
	var reach []portProto
	for _, r := range np.Spec.Ingress {
		admits := false
		for _, peer := range r.From {
			ns, err1 := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
			pods, err2 := metav1.LabelSelectorAsSelector(peer.PodSelector)
			if err1 == nil && err2 == nil && peer.NamespaceSelector != nil && peer.PodSelector != nil &&
				ns.Matches(sandboxNS) && pods.Matches(sandboxPods) {
				admits = true
			}
		}
		if !admits {
			continue
		}
		for _, p := range r.Ports {
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			if p.Port != nil {
				reach = append(reach, portProto{int32(p.Port.IntValue()), proto})
			}
		}
	}
	if !sameSet(reach, gatePorts) {
		t.Errorf("NetworkPolicy %s admits the sandboxes on %v, want %v", np.Name, reach, gatePorts)
	}
}

// secretRefs lists the Secrets a pod spec uses, in volumes or the
// environment, and the containers that can read each.
func secretRefs(spec corev1.PodSpec) map[string][]string {
	refs := map[string][]string{}
	volSecrets := map[string][]string{}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			volSecrets[v.Name] = append(volSecrets[v.Name], v.Secret.SecretName)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.Secret != nil {
					volSecrets[v.Name] = append(volSecrets[v.Name], s.Secret.Name)
				}
			}
		}
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, m := range c.VolumeMounts {
			for _, s := range volSecrets[m.Name] {
				refs[s] = append(refs[s], c.Name)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				refs[e.ValueFrom.SecretKeyRef.Name] = append(refs[e.ValueFrom.SecretKeyRef.Name], c.Name)
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				refs[e.SecretRef.Name] = append(refs[e.SecretRef.Name], c.Name)
			}
		}
	}
	return refs
}

// checkSecretsOnlyInGate checks that the gate's Secrets (real values, the
// CA's key) reach the gate container and no sandbox.
func checkSecretsOnlyInGate(t *testing.T, gate *appsv1.DaemonSet, tmpl *extv1beta1.SandboxTemplate) {
	t.Helper()
	refs := secretRefs(gate.Spec.Template.Spec)
	if len(refs) == 0 {
		t.Error("the gate mounts no Secret: where do its secrets' values come from?")
	}
	for s, ctrs := range refs {
		if !slices.Equal(slices.Compact(slices.Sorted(slices.Values(ctrs))), []string{"gate"}) {
			t.Errorf("Secret %s is read by containers %v, want the gate alone", s, ctrs)
		}
	}
	if r := secretRefs(tmpl.Spec.PodTemplate.Spec); len(r) != 0 {
		t.Errorf("SandboxTemplate %s: its pods read Secrets %v; real values belong to the gate only", tmpl.Name, r)
	}
	if len(tmpl.Spec.VolumeClaimTemplates) != 0 {
		t.Logf("SandboxTemplate %s: volume claim templates are not checked for secrets", tmpl.Name)
	}
}

// sameSet compares a and b as sets.
func sameSet[T fmt.Stringer](a, b []T) bool {
	key := func(l []T) []string {
		var s []string
		for _, x := range l {
			s = append(s, x.String())
		}
		sort.Strings(s)
		return slices.Compact(s)
	}
	return slices.Equal(key(a), key(b)) && len(a) == len(b)
}

// testNode stands for the node the downward API gives the gate.
const testNode = "node-1"

// checkTemplatePolicy checks what the gate reads for the template: its
// policy ConfigMap loads as the gate loads it, and its pods take their
// placeholders and the CA from the ConfigMap the gate writes.
func checkTemplatePolicy(t *testing.T, c *cluster, tmpl *extv1beta1.SandboxTemplate) {
	t.Helper()
	name := tmpl.Annotations[gateserve.AnnotationPolicy]
	var cm *corev1.ConfigMap
	for _, x := range c.configMaps {
		if x.Namespace == tmpl.Namespace && x.Name == name {
			cm = x
		}
	}
	if cm == nil {
		t.Errorf("SandboxTemplate %s: annotation %s names ConfigMap %q, which no manifest creates in %s", tmpl.Name, gateserve.AnnotationPolicy, name, tmpl.Namespace)
		return
	}
	f, err := config.Parse(cm.Name, []byte(cm.Data[gateserve.PolicyKey]))
	if err != nil {
		t.Errorf("ConfigMap %s: %v", cm.Name, err)
		return
	}
	if len(f.Network.Allow) == 0 {
		t.Errorf("ConfigMap %s allows no host; the example should show one", cm.Name)
	}
	want := gateserve.PlaceholdersConfigMap(tmpl.Name)
	envs := map[string]bool{}
	for _, ctr := range tmpl.Spec.PodTemplate.Spec.Containers {
		for _, e := range ctr.Env {
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil && e.ValueFrom.ConfigMapKeyRef.Name == want {
				envs[e.ValueFrom.ConfigMapKeyRef.Key] = true
			}
		}
	}
	for n, sec := range f.Secrets {
		if !strings.HasPrefix(sec.From, "env:") {
			t.Errorf("ConfigMap %s: secret %s from %q; on Kubernetes write env:KEY, a key of the claim's Secret", cm.Name, n, sec.From)
		}
		if !envs[n] {
			t.Errorf("SandboxTemplate %s: no env %s from ConfigMap %s key %s: its pods would not have the placeholder", tmpl.Name, n, want, n)
		}
	}
}

// checkRBAC checks the gate's rights: read what its informers watch,
// cluster-wide; write ConfigMaps (the placeholders) only in the
// template's namespace; nothing else.
func checkRBAC(t *testing.T, c *cluster, gate *appsv1.DaemonSet, tmpl *extv1beta1.SandboxTemplate) {
	t.Helper()
	sa := gate.Spec.Template.Spec.ServiceAccountName
	subject := func(ss []rbacv1.Subject) bool {
		for _, s := range ss {
			if s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == gate.Namespace {
				return true
			}
		}
		return false
	}
	rulesOf := func(role string) []rbacv1.PolicyRule {
		for _, r := range c.roles {
			if r.Name == role {
				return r.Rules
			}
		}
		t.Errorf("no manifest makes ClusterRole %s", role)
		return nil
	}
	rights := func(rules []rbacv1.PolicyRule, into map[string][]string) {
		for _, r := range rules {
			if len(r.ResourceNames) != 0 || len(r.NonResourceURLs) != 0 {
				t.Errorf("rule %v: resource names or URLs are not expected", r)
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					into[g+"/"+res] = slices.Sorted(slices.Values(append(into[g+"/"+res], r.Verbs...)))
				}
			}
		}
	}
	compare := func(where string, got, want map[string][]string) {
		for k, v := range want {
			if !slices.Equal(got[k], slices.Sorted(slices.Values(v))) {
				t.Errorf("the gate's rights on %s %s: %v, want %v", k, where, got[k], v)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("the gate has rights on %s %s, which it does not use", k, where)
			}
		}
	}
	cluster := map[string][]string{}
	for _, b := range c.bindings {
		if subject(b.Subjects) {
			rights(rulesOf(b.RoleRef.Name), cluster)
		}
	}
	read := []string{"get", "list", "watch"}
	compare("cluster-wide", cluster, map[string][]string{
		"/pods": read, "/secrets": read, "/configmaps": read,
		"agents.x-k8s.io/sandboxes": read, "extensions.agents.x-k8s.io/sandboxclaims": read, "extensions.agents.x-k8s.io/sandboxtemplates": read,
	})
	inNS := map[string][]string{}
	for _, b := range c.nsBindings {
		if !subject(b.Subjects) {
			continue
		}
		if b.Namespace != tmpl.Namespace {
			t.Errorf("RoleBinding %s gives the gate rights in %s, where no gated template is", b.Name, b.Namespace)
		}
		rights(rulesOf(b.RoleRef.Name), inNS)
	}
	compare("in "+tmpl.Namespace, inNS, map[string][]string{"/configmaps": {"create", "update"}})
}
