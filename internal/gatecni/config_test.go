package gatecni

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

const goodConf = `{"cniVersion": "1.0.0", "name": "moat", "type": "moat-cni",
 "gate": {"addresses": ["10.96.0.53"], "ports": ["53/udp", "53/tcp", "80/tcp", "443/tcp"]},
 "namespaces": ["agents"]}`

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(goodConf))
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.96.0.53")}; !slices.Equal(c.Gates, want) {
		t.Errorf("Gates = %v, want %v", c.Gates, want)
	}
	if want := []Port{{UDP, 53}, {TCP, 53}, {TCP, 80}, {TCP, 443}}; !slices.Equal(c.Ports, want) {
		t.Errorf("Ports = %v, want %v", c.Ports, want)
	}
	if !slices.Equal(c.Namespaces, []string{"agents"}) || c.Annotations {
		t.Errorf("Namespaces = %v, Annotations = %v", c.Namespaces, c.Annotations)
	}
}

func TestParseConfigRefuses(t *testing.T) {
	for _, tc := range []struct{ name, conf, want string }{
		{"not JSON", `{"gate":`, "not JSON"},
		{"no gate", `{"namespaces": ["a"]}`, `no "gate"`},
		{"no addresses", `{"gate": {"ports": ["443/tcp"]}, "namespaces": ["a"]}`, "gate.addresses"},
		{"bad address", `{"gate": {"addresses": ["10.96.0"], "ports": ["443/tcp"]}, "namespaces": ["a"]}`, `gate address "10.96.0"`},
		{"IPv6 gate", `{"gate": {"addresses": ["fd00::53"], "ports": ["443/tcp"]}, "namespaces": ["a"]}`, "IPv4"},
		{"unspecified gate", `{"gate": {"addresses": ["0.0.0.0"], "ports": ["443/tcp"]}, "namespaces": ["a"]}`, "unicast"},
		{"duplicate address", `{"gate": {"addresses": ["10.96.0.53", "10.96.0.53"], "ports": ["443/tcp"]}, "namespaces": ["a"]}`, "twice"},
		{"no ports", `{"gate": {"addresses": ["10.96.0.53"]}, "namespaces": ["a"]}`, "gate.ports"},
		{"port without proto", `{"gate": {"addresses": ["10.96.0.53"], "ports": ["443"]}, "namespaces": ["a"]}`, "PORT/PROTO"},
		{"port zero", `{"gate": {"addresses": ["10.96.0.53"], "ports": ["0/tcp"]}, "namespaces": ["a"]}`, "1 to 65535"},
		{"port too big", `{"gate": {"addresses": ["10.96.0.53"], "ports": ["65536/tcp"]}, "namespaces": ["a"]}`, "1 to 65535"},
		{"sctp", `{"gate": {"addresses": ["10.96.0.53"], "ports": ["443/sctp"]}, "namespaces": ["a"]}`, "tcp or udp"},
		{"duplicate port", `{"gate": {"addresses": ["10.96.0.53"], "ports": ["443/tcp", "443/tcp"]}, "namespaces": ["a"]}`, "twice"},
		{"bad namespace", `{"gate": {"addresses": ["10.96.0.53"], "ports": ["443/tcp"]}, "namespaces": ["Agents"]}`, "namespace name"},
		{"gates nothing", `{"gate": {"addresses": ["10.96.0.53"], "ports": ["443/tcp"]}}`, "gates no pod"},
		{"bad annotations", `{"gate": {"addresses": ["10.96.0.53"], "ports": ["443/tcp"]}, "capabilities": {"io.kubernetes.cri.pod-annotations": true},
		  "runtimeConfig": {"io.kubernetes.cri.pod-annotations": ["x"]}}`, "runtimeConfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.conf))
			if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseConfig(%s) = %v, want an ErrConfig naming %q", tc.conf, err, tc.want)
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args string
		want Pod
		err  bool
	}{
		{"", Pod{}, false},
		{"IgnoreUnknown=1;K8S_POD_NAMESPACE=agents;K8S_POD_NAME=sb-1;K8S_POD_INFRA_CONTAINER_ID=abc", Pod{"agents", "sb-1"}, false},
		{"K8S_POD_NAMESPACE=agents;junk", Pod{}, true},
	} {
		got, err := ParseArgs(tc.args)
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("ParseArgs(%q) = %+v, %v; want %+v, error %v", tc.args, got, err, tc.want, tc.err)
		}
	}
}

func TestDecide(t *testing.T) {
	const gate = `"gate": {"addresses": ["10.96.0.53"], "ports": ["443/tcp"]}`
	const capab = `"capabilities": {"io.kubernetes.cri.pod-annotations": true}`
	for _, tc := range []struct {
		name, conf, ns string
		gated          bool
		err            string
	}{
		{"gated namespace", `{` + gate + `, "namespaces": ["agents"]}`, "agents", true, ""},
		{"other namespace", `{` + gate + `, "namespaces": ["agents"]}`, "default", false, ""},
		{"no namespace from the runtime", `{` + gate + `, "namespaces": ["agents"]}`, "", false, "K8S_POD_NAMESPACE"},
		{"annotated", `{` + gate + `, ` + capab + `, "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"moat.dev/egress": "gate"}}}`, "default", true, ""},
		{"not annotated", `{` + gate + `, ` + capab + `, "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"other": "x"}}}`, "default", false, ""},
		// An annotation cannot open a gated namespace's pod.
		{"gated namespace, annotation open", `{` + gate + `, ` + capab + `, "namespaces": ["agents"], "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"moat.dev/egress": "open"}}}`, "agents", true, ""},
		// A misspelt value fails rather than start the pod open.
		{"unknown value", `{` + gate + `, ` + capab + `, "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"moat.dev/egress": "gated"}}}`, "default", false, `the only value is "gate"`},
		{"capability not honoured", `{` + gate + `, ` + capab + `}`, "default", false, "passed no pod annotations"},
		// Annotations the runtime passes without the capability are not
		// the configuration's to read.
		{"annotations without the capability", `{` + gate + `, "namespaces": ["agents"], "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"moat.dev/egress": "gate"}}}`, "default", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.conf))
			if err != nil {
				t.Fatal(err)
			}
			d, err := c.Decide(Pod{Namespace: tc.ns, Name: "p"})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Decide = %+v, %v; want an error naming %q", d, err, tc.err)
				}
				return
			}
			if err != nil || d.Gated != tc.gated || d.Reason == "" {
				t.Errorf("Decide = %+v, %v; want gated %v with a reason", d, err, tc.gated)
			}
		})
	}
}

// FuzzParseConfig: the configuration and the annotations the runtime
// passes in it never panic the plugin, and whatever it accepts gates
// something through at least one gate address and port, all IPv4.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(goodConf), "agents")
	f.Add([]byte(`{"gate": {"addresses": ["10.96.0.53"], "ports": ["443/tcp"]}, "capabilities": {"io.kubernetes.cri.pod-annotations": true},
	  "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"moat.dev/egress": "gate"}}}`), "default")
	f.Add([]byte(`{"gate": {"addresses": ["10.96.0.53", "10.96.0.54"], "ports": ["53/udp", "65535/tcp"]}, "namespaces": ["a-b", "c"]}`), "")
	f.Fuzz(func(t *testing.T, conf []byte, ns string) {
		c, err := ParseConfig(conf)
		if err != nil {
			return
		}
		if len(c.Gates) == 0 || len(c.Ports) == 0 || len(c.Namespaces) == 0 && !c.Annotations {
			t.Fatalf("accepted a configuration that gates nothing: %s", conf)
		}
		for _, g := range c.Gates {
			if !g.Is4() {
				t.Fatalf("accepted a gate that is not IPv4: %v", g)
			}
		}
		d, err := c.Decide(Pod{Namespace: ns})
		if err == nil && slices.Contains(c.Namespaces, ns) && !d.Gated {
			t.Fatalf("a pod of gated namespace %q is not gated", ns)
		}
	})
}
