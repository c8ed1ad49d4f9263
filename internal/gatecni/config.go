// Package gatecni is moat-cni, a chained CNI plugin that fences a pod's
// network to moat's gate: from a gated pod the node's kernel passes
// nothing but packets to the gate's addresses and ports and the gate's
// replies, whatever the pod's guest does as root (docs/kubernetes.md,
// "Egress enforced outside the sandbox").
//
// Why a plugin of moat's own rather than an enforcing NetworkPolicy
// engine: a CNI ADD runs before any container of the pod starts and the
// pod does not start if it fails, so the fence is in place from the first
// packet; a policy engine programs its rules after it sees the new pod
// through the API server, a window in which the pod is open, and it
// brings a controller and a datastore for what is here one rule per gate
// port. The rules live in the pod's own network namespace, on the netdev
// hooks of its interface, because that is where a gVisor guest's packets
// can be seen in it: runsc's netstack sends them through an AF_PACKET
// socket on the pod's interface, which bypasses the namespace's iptables
// (inet) hooks entirely but passes the device's egress hook. The
// namespace dies with the pod, and the rules with it.
//
// A pod is gated when its namespace is in the configuration's
// namespaces (no annotation can open it) or when its annotation
// moat.dev/egress says "gate" and the runtime passes annotations (the
// capability io.kubernetes.cri.pod-annotations). Anything the plugin
// cannot decide or install fails the pod's network set-up, so a pod
// meant to be gated never starts open.
//
// The configuration, as a plugin of a conflist after the one that gives
// the pod its address (bridge with host-local):
//
//	{"type": "moat-cni",
//	 "gate": {"addresses": ["10.96.0.53"], "ports": ["53/udp", "53/tcp", "80/tcp", "443/tcp"]},
//	 "namespaces": ["agents"],
//	 "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
package gatecni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// AnnotationEgress is the pod annotation that gates a pod outside the
// configured namespaces. Frozen: templates carry it.
const AnnotationEgress = "moat.dev/egress"

// annotationGate is the one value AnnotationEgress takes.
const annotationGate = "gate"

// capabilityAnnotations is the runtimeConfig key under which containerd's
// CRI passes a pod's annotations to a plugin that declares it.
const capabilityAnnotations = "io.kubernetes.cri.pod-annotations"

// Proto is a transport protocol a gate port is open on.
type Proto uint8

// The protocols' IP protocol numbers, as the rules match them.
const (
	TCP Proto = 6
	UDP Proto = 17
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return "proto(" + strconv.Itoa(int(p)) + ")"
}

// Port is one of the gate's ports.
type Port struct {
	Proto Proto
	Num   uint16
}

func (p Port) String() string { return fmt.Sprintf("%d/%s", p.Num, p.Proto) }

// Config is the plugin's configuration, checked.
type Config struct {
	CNIVersion string
	Name       string
	// Gates are the addresses a gated pod may reach, each on every port
	// of Ports: the gate Service's clusterIP, as the pod addresses it
	// (kube-proxy's DNAT happens after, in the node's namespace).
	Gates []netip.Addr
	Ports []Port
	// Namespaces are gated whole.
	Namespaces []string
	// Annotations says whether the runtime was asked for the pod's
	// annotations (the capability); if so, it must pass them.
	Annotations bool
	// PrevResult is the previous plugin's result, in the conflist's
	// version, as JSON; nil if there was none.
	PrevResult json.RawMessage
	// RuntimeAnnotations is what the runtime passed, if anything.
	RuntimeAnnotations    map[string]string
	runtimeHasAnnotations bool
}

// rawConfig is the wire form (the CNI spec's plugin configuration).
type rawConfig struct {
	CNIVersion   string          `json:"cniVersion"`
	Name         string          `json:"name"`
	Type         string          `json:"type"`
	Capabilities map[string]bool `json:"capabilities"`
	Gate         *struct {
		Addresses []string `json:"addresses"`
		Ports     []string `json:"ports"`
	} `json:"gate"`
	Namespaces    []string                   `json:"namespaces"`
	RuntimeConfig map[string]json.RawMessage `json:"runtimeConfig"`
	PrevResult    json.RawMessage            `json:"prevResult"`
}

// ErrConfig marks a configuration the plugin refuses.
var ErrConfig = errors.New("moat-cni configuration")

func configErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, a...))
}

// ParseConfig reads the plugin's configuration from the bytes the runtime
// sends on stdin.
func ParseConfig(stdin []byte) (*Config, error) {
	var raw rawConfig
	dec := json.NewDecoder(strings.NewReader(string(stdin)))
	if err := dec.Decode(&raw); err != nil {
		return nil, configErr("not JSON: %v", err)
	}
	c := &Config{CNIVersion: raw.CNIVersion, Name: raw.Name, PrevResult: raw.PrevResult}
	if raw.Gate == nil {
		return nil, configErr(`no "gate": give {"addresses": [the gate Service's clusterIP], "ports": ["53/udp", ...]}`)
	}
	if len(raw.Gate.Addresses) == 0 {
		return nil, configErr(`"gate.addresses" is empty: give the gate Service's clusterIP`)
	}
	for _, s := range raw.Gate.Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, configErr("gate address %q: %v", s, err)
		}
		// IPv6 is refused whole in a gated pod (the rules pass IPv4 only),
		// so an IPv6 gate would be a gate nobody reaches.
		if !a.Is4() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() {
			return nil, configErr("gate address %q: want one unicast IPv4 address (a Service's clusterIP)", s)
		}
		if slices.Contains(c.Gates, a) {
			return nil, configErr("gate address %q is listed twice", s)
		}
		c.Gates = append(c.Gates, a)
	}
	if len(raw.Gate.Ports) == 0 {
		return nil, configErr(`"gate.ports" is empty: give the gate's ports, e.g. ["53/udp", "53/tcp", "443/tcp"]`)
	}
	for _, s := range raw.Gate.Ports {
		p, err := parsePort(s)
		if err != nil {
			return nil, configErr("gate port %q: %v", s, err)
		}
		if slices.Contains(c.Ports, p) {
			return nil, configErr("gate port %q is listed twice", s)
		}
		c.Ports = append(c.Ports, p)
	}
	for _, ns := range raw.Namespaces {
		if !validNamespace(ns) {
			return nil, configErr("namespace %q is not a Kubernetes namespace name (lower-case letters, digits and '-', at most 63)", ns)
		}
		c.Namespaces = append(c.Namespaces, ns)
	}
	c.Annotations = raw.Capabilities[capabilityAnnotations]
	if len(c.Namespaces) == 0 && !c.Annotations {
		return nil, configErr(`it gates no pod: list "namespaces", or declare the capability %q so that pods annotated %s=%s are`,
			capabilityAnnotations, AnnotationEgress, annotationGate)
	}
	if v, ok := raw.RuntimeConfig[capabilityAnnotations]; ok {
		if err := json.Unmarshal(v, &c.RuntimeAnnotations); err != nil {
			return nil, configErr("runtimeConfig %q: %v", capabilityAnnotations, err)
		}
		c.runtimeHasAnnotations = true
	}
	return c, nil
}

// parsePort reads "443/tcp".
func parsePort(s string) (Port, error) {
	num, proto, ok := strings.Cut(s, "/")
	if !ok {
		return Port{}, errors.New(`want PORT/PROTO, e.g. "443/tcp"`)
	}
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return Port{}, fmt.Errorf("port %q is not a number from 1 to 65535", num)
	}
	switch proto {
	case "tcp":
		return Port{TCP, uint16(n)}, nil
	case "udp":
		return Port{UDP, uint16(n)}, nil
	}
	return Port{}, fmt.Errorf("protocol %q: want tcp or udp", proto)
}

// validNamespace is Kubernetes' DNS label rule for namespace names.
func validNamespace(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// Pod is what the runtime says about the pod in CNI_ARGS.
type Pod struct {
	Namespace string
	Name      string
}

// ParseArgs reads the Kubernetes pod's identity from CNI_ARGS
// ("K8S_POD_NAMESPACE=agents;K8S_POD_NAME=x;IgnoreUnknown=1").
func ParseArgs(args string) (Pod, error) {
	var p Pod
	if args == "" {
		return p, nil
	}
	for _, kv := range strings.Split(args, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return p, fmt.Errorf("CNI_ARGS: %q is not KEY=VALUE", kv)
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			p.Namespace = v
		case "K8S_POD_NAME":
			p.Name = v
		}
	}
	return p, nil
}

// Decision says whether a pod is gated and why, for the log and errors.
type Decision struct {
	Gated  bool
	Reason string
}

// Decide says whether the pod is gated. It fails rather than guess: a
// namespace list without the pod's namespace in CNI_ARGS, an annotation
// capability the runtime did not honour, or an annotation value it does
// not know.
func (c *Config) Decide(pod Pod) (Decision, error) {
	if len(c.Namespaces) > 0 && pod.Namespace == "" {
		return Decision{}, errors.New("moat-cni: the runtime passed no K8S_POD_NAMESPACE in CNI_ARGS, so it cannot tell whether the pod is gated; refusing its network")
	}
	if slices.Contains(c.Namespaces, pod.Namespace) {
		return Decision{true, fmt.Sprintf("namespace %q is gated", pod.Namespace)}, nil
	}
	if !c.Annotations {
		return Decision{false, fmt.Sprintf("namespace %q is not gated", pod.Namespace)}, nil
	}
	if !c.runtimeHasAnnotations {
		// The kubelet always gives a pod some annotations, so a runtime
		// that honours the capability always sends the key: its absence
		// means pods annotated to be gated would start open.
		return Decision{}, fmt.Errorf("moat-cni: the capability %q is declared but the runtime passed no pod annotations; use containerd's CRI, or list the pod's namespace in \"namespaces\"", capabilityAnnotations)
	}
	v, ok := c.RuntimeAnnotations[AnnotationEgress]
	switch {
	case !ok:
		return Decision{false, fmt.Sprintf("namespace %q is not gated and the pod has no %s annotation", pod.Namespace, AnnotationEgress)}, nil
	case v == annotationGate:
		return Decision{true, fmt.Sprintf("annotation %s=%s", AnnotationEgress, v)}, nil
	}
	return Decision{}, fmt.Errorf("moat-cni: annotation %s=%q: the only value is %q; refusing the pod's network rather than start it open", AnnotationEgress, v, annotationGate)
}
