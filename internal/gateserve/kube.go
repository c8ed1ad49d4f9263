package gateserve

// Tenants on Kubernetes ([kubernetes] in gate.toml): every sandbox pod of
// agent-sandbox is a tenant of its own, known by its address, with the
// policy its SandboxTemplate names and, once a SandboxClaim has taken
// it, the secret values the claim names. This file is the decision:
// which pod an address belongs to and what that pod gets, from the
// objects the informers know (kube_source.go watches them). It does no
// I/O.
//
// The chain is followed from the pod up, each link checked by UID, never
// by what the pod says of itself (a pod's labels and annotations are
// written from the template, which its user may control):
//
//	Pod  --controller ownerRef (UID)-->  Sandbox
//	Sandbox --annotation agents.x-k8s.io/sandbox-template-ref--> SandboxTemplate
//	SandboxTemplate --annotation moat.dev/policy--> ConfigMap (key moat.toml)
//	Sandbox --controller ownerRef (UID)--> SandboxClaim   (absent: a warm pool's, unclaimed)
//	SandboxClaim --annotation moat.dev/secret (default: the template's)--> Secret
//
// Fail closed: a pod that is not Running, is being deleted, or whose
// chain breaks anywhere gets no tenant, and so nothing (DNS REFUSED,
// connections reset, audited as an unknown source). Two pods the
// informers both hold for one address (the old one's deletion not seen
// yet) leave the address to neither.

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// The names a user writes on their objects (frozen: they are in users'
// manifests).
const (
	// AnnotationPolicy on a SandboxTemplate names a ConfigMap of the
	// template's namespace whose key moat.toml is the policy of every
	// sandbox made from the template (moat.toml syntax: [network],
	// [policies], [secrets], [audit]). A template without it is not
	// served: its pods get nothing.
	AnnotationPolicy = "moat.dev/policy"
	// AnnotationSecret on a SandboxClaim names the Secret whose keys hold
	// the values of the policy's [secrets]; on a SandboxTemplate, the one
	// its claims get when they name none. Only a claimed sandbox gets
	// values; a warm pool's gets its placeholders and is refused at the
	// secrets' hosts until a claim takes it.
	AnnotationSecret = "moat.dev/secret"
	// LabelGateSecret must be "true" on a Secret the gate may read: the
	// gate watches only those, so a claim cannot bind any other Secret
	// of its namespace.
	LabelGateSecret = "moat.dev/gate-secret"
	// PolicyKey is the policy's key in the ConfigMap.
	PolicyKey = "moat.toml"
	// LabelPlaceholdersFor is on the ConfigMap the gate writes for each
	// served template (named PlaceholdersConfigMap(template)): its keys
	// are the secrets' placeholders and the CA certificate.
	LabelPlaceholdersFor = "moat.dev/placeholders-for"
	// CAKey is the gate CA's certificate in that ConfigMap.
	CAKey = "ca.pem"
	// StatusKey in that ConfigMap says "ok" or why the template's
	// sandboxes get nothing (its policy does not load).
	StatusKey = "status"
)

// PlaceholdersConfigMap is the name of the ConfigMap the gate writes for
// a template: the sandboxes' env takes each placeholder from it
// (configMapKeyRef), and their trust store its ca.pem.
func PlaceholdersConfigMap(template string) string { return "moat-" + template }

// kubeID is who a tenant is: what its audit records name.
type kubeID struct {
	Namespace   string
	Pod         string
	PodUID      types.UID
	Sandbox     string
	SandboxUID  types.UID
	Claim       string // "": unclaimed (a warm pool's)
	ClaimUID    types.UID
	Template    string
	TemplateUID types.UID
}

// kubeBinding is what one address gets.
type kubeBinding struct {
	id     kubeID
	policy *corev1.ConfigMap
	// secret holds the values; nil: every secret is pending (unclaimed,
	// or the Secret named is not there).
	secret *corev1.Secret
}

// fingerprint changes whenever the tenant must be built again: another
// pod, claim, policy or Secret version.
func (b kubeBinding) fingerprint() string {
	s := strings.Join([]string{string(b.id.PodUID), string(b.id.SandboxUID), string(b.id.ClaimUID), string(b.id.TemplateUID),
		string(b.policy.UID), b.policy.ResourceVersion}, "/")
	if b.secret != nil {
		s += "/" + string(b.secret.UID) + "/" + b.secret.ResourceVersion
	}
	return s
}

// kubeObjects is what the informers hold; nil for what they do not.
type kubeObjects interface {
	Sandbox(ns, name string) *sandboxv1.Sandbox
	Claim(ns, name string) *extv1.SandboxClaim
	Template(ns, name string) *extv1.SandboxTemplate
	ConfigMap(ns, name string) *corev1.ConfigMap
	Secret(ns, name string) *corev1.Secret // only those labelled LabelGateSecret=true
}

// unbound is a pod that gets no tenant, and why (for the log).
type unbound struct {
	pod string // namespace/name
	why string
}

// bindPods decides which pod each address belongs to and what it gets.
// pods is every pod the gate serves (its node's); those that are no
// sandbox of a template with a policy are left out silently, others that
// fail a check are in the second result with the reason.
func bindPods(pods []*corev1.Pod, o kubeObjects) (map[netip.Addr]kubeBinding, []unbound) {
	out := map[netip.Addr]kubeBinding{}
	claimed := map[netip.Addr][]string{} // every running pod by address
	var skipped []unbound
	for _, p := range pods {
		addrs := podAddrs(p)
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || len(addrs) == 0 {
			continue
		}
		for _, a := range addrs {
			claimed[a] = append(claimed[a], p.Namespace+"/"+p.Name)
		}
		b, why := bindPod(p, o)
		if why != "" {
			if why != notOurs {
				skipped = append(skipped, unbound{p.Namespace + "/" + p.Name, why})
			}
			continue
		}
		for _, a := range addrs {
			out[a] = b
		}
	}
	for a, ps := range claimed {
		if len(ps) > 1 {
			if _, ok := out[a]; ok {
				delete(out, a)
				slices.Sort(ps)
				skipped = append(skipped, unbound{strings.Join(ps, ","), fmt.Sprintf("address %s is held by %d pods at once (one is going away): it gets nothing until one is gone", a, len(ps))})
			}
		}
	}
	return out, skipped
}

// notOurs: the pod is no sandbox of a template with a policy.
const notOurs = "not a moat-gated sandbox"

func bindPod(p *corev1.Pod, o kubeObjects) (kubeBinding, string) {
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != "Sandbox" || groupOf(ref.APIVersion) != sandboxv1.GroupVersion.Group {
		return kubeBinding{}, notOurs
	}
	sb := o.Sandbox(p.Namespace, ref.Name)
	if sb == nil || sb.UID != ref.UID {
		return kubeBinding{}, fmt.Sprintf("its Sandbox %s (uid %s) is not known yet", ref.Name, ref.UID)
	}
	if sb.DeletionTimestamp != nil {
		return kubeBinding{}, "its Sandbox is being deleted"
	}
	tname := sb.Annotations[sandboxv1.SandboxTemplateRefAnnotation]
	if tname == "" {
		return kubeBinding{}, notOurs
	}
	tpl := o.Template(p.Namespace, tname)
	if tpl == nil {
		return kubeBinding{}, notOurs
	}
	cmName := tpl.Annotations[AnnotationPolicy]
	if cmName == "" {
		return kubeBinding{}, notOurs
	}
	cm := o.ConfigMap(p.Namespace, cmName)
	if cm == nil {
		return kubeBinding{}, fmt.Sprintf("template %s names policy ConfigMap %s, which does not exist", tname, cmName)
	}
	if _, ok := cm.Data[PolicyKey]; !ok {
		return kubeBinding{}, fmt.Sprintf("ConfigMap %s has no key %s", cmName, PolicyKey)
	}
	b := kubeBinding{policy: cm, id: kubeID{Namespace: p.Namespace, Pod: p.Name, PodUID: p.UID,
		Sandbox: sb.Name, SandboxUID: sb.UID, Template: tpl.Name, TemplateUID: tpl.UID}}
	cref := metav1.GetControllerOf(sb)
	if cref == nil || cref.Kind != extv1.SandboxClaimKind || groupOf(cref.APIVersion) != extv1.GroupVersion.Group {
		return b, "" // a warm pool's, or made by hand: no values
	}
	cl := o.Claim(p.Namespace, cref.Name)
	if cl == nil || cl.UID != cref.UID {
		return kubeBinding{}, fmt.Sprintf("its claim %s (uid %s) is not known yet", cref.Name, cref.UID)
	}
	if cl.DeletionTimestamp != nil {
		return kubeBinding{}, "its claim is being deleted"
	}
	b.id.Claim, b.id.ClaimUID = cl.Name, cl.UID
	sname := cl.Annotations[AnnotationSecret]
	if sname == "" {
		sname = tpl.Annotations[AnnotationSecret]
	}
	if sname != "" {
		b.secret = o.Secret(p.Namespace, sname) // nil: pending, refused at its hosts
	}
	return b, ""
}

func groupOf(apiVersion string) string {
	g, _, ok := strings.Cut(apiVersion, "/")
	if !ok {
		return ""
	}
	return g
}

// podAddrs is a pod's addresses; none for a host-network pod, whose
// address is the node's and no tenant's.
func podAddrs(p *corev1.Pod) []netip.Addr {
	if p.Spec.HostNetwork {
		return nil
	}
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

var placeholderB32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// templatePlaceholder is the placeholder of secret name for every
// sandbox of a template: fixed, so a warm pool's pods are made with it
// before any claim, and every gate pod (one per node) computes the same
// without talking to the others. Placeholders are not secret
// (internal/secret): one only ever stands for a value in a request from a
// sandbox whose claim binds that value. The template's UID makes a
// template deleted and made again a new one.
func templatePlaceholder(ns string, templateUID types.UID, name string) string {
	h := sha256.Sum256([]byte("moat gate placeholder v1\x00" + ns + "\x00" + string(templateUID) + "\x00" + name))
	return "moat-ph-" + placeholderB32.EncodeToString(h[:20])
}
