package gatecni

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/nftables/expr"
)

// packet is what the netdev hooks see of a frame.
type packet struct {
	ether []byte // skb->protocol
	nh    []byte // from the network header on
	l4    byte   // 0: no transport header (not IP, or a later fragment)
	th    []byte
}

// eval runs a chain's rules on p as the kernel does for the expressions
// the fence uses, and says whether p is accepted (the policy drops).
func eval(t *testing.T, rules []Rule, p packet) bool {
	t.Helper()
	for _, r := range rules {
		var reg []byte
	exprs:
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Meta:
				switch e.Key {
				case expr.MetaKeyPROTOCOL:
					reg = p.ether
				case expr.MetaKeyL4PROTO:
					if p.l4 == 0 {
						break exprs
					}
					reg = []byte{p.l4}
				default:
					t.Fatalf("rule %q: meta key %d not modelled", r.Text, e.Key)
				}
			case *expr.Payload:
				var hdr []byte
				switch e.Base {
				case expr.PayloadBaseNetworkHeader:
					hdr = p.nh
				case expr.PayloadBaseTransportHeader:
					if p.l4 == 0 {
						break exprs
					}
					hdr = p.th
				default:
					t.Fatalf("rule %q: payload base %d not modelled", r.Text, e.Base)
				}
				if int(e.Offset+e.Len) > len(hdr) {
					break exprs
				}
				reg = hdr[e.Offset : e.Offset+e.Len]
			case *expr.Cmp:
				if e.Op != expr.CmpOpEq {
					t.Fatalf("rule %q: cmp op %d not modelled", r.Text, e.Op)
				}
				if !bytes.Equal(reg, e.Data) {
					break exprs
				}
			case *expr.Counter:
			case *expr.Verdict:
				switch e.Kind {
				case expr.VerdictAccept:
					return true
				case expr.VerdictDrop:
					return false
				}
				t.Fatalf("rule %q: verdict %d not modelled", r.Text, e.Kind)
			default:
				t.Fatalf("rule %q: expression %T not modelled", r.Text, e)
			}
		}
	}
	return false
}

func ipv4(src, dst string, proto byte, sport, dport uint16) packet {
	nh := make([]byte, 20)
	nh[0], nh[9] = 0x45, proto
	copy(nh[12:], netip.MustParseAddr(src).AsSlice())
	copy(nh[16:], netip.MustParseAddr(dst).AsSlice())
	th := binary.BigEndian.AppendUint16(nil, sport)
	th = binary.BigEndian.AppendUint16(th, dport)
	return packet{ether: etherIPv4, nh: nh, l4: proto, th: append(th, make([]byte, 16)...)}
}

func arp(sender, target string) packet {
	nh := append([]byte{}, arpIPv4Ethernet...)
	nh = append(nh, 0, 1)               // request
	nh = append(nh, make([]byte, 6)...) // sender MAC
	nh = append(nh, netip.MustParseAddr(sender).AsSlice()...)
	nh = append(nh, make([]byte, 6)...)
	nh = append(nh, netip.MustParseAddr(target).AsSlice()...)
	return packet{ether: etherARP, nh: nh}
}

func TestFenceRules(t *testing.T) {
	f := Fence{
		Device: "eth0",
		Pod:    netip.MustParseAddr("10.244.0.7"),
		Gates:  []netip.Addr{netip.MustParseAddr("10.96.0.53")},
		Ports:  []Port{{UDP, 53}, {TCP, 53}, {TCP, 443}},
	}
	const pod, gate = "10.244.0.7", "10.96.0.53"
	fragment := ipv4(pod, gate, 6, 40000, 443)
	fragment.l4 = 0
	ipv6 := packet{ether: []byte{0x86, 0xdd}, nh: make([]byte, 40), l4: 6, th: make([]byte, 20)}
	arpIPv6 := arp(pod, "10.244.0.1")
	arpIPv6.nh[2], arpIPv6.nh[3] = 0x86, 0xdd
	for _, tc := range []struct {
		name    string
		egress  bool // else ingress
		p       packet
		allowed bool
	}{
		{"to the gate 443/tcp", true, ipv4(pod, gate, 6, 40000, 443), true},
		{"to the gate 53/udp", true, ipv4(pod, gate, 17, 40000, 53), true},
		{"to the gate 53/tcp", true, ipv4(pod, gate, 6, 40000, 53), true},
		{"to the gate 443/udp", true, ipv4(pod, gate, 17, 40000, 443), false},
		{"to the gate 80/tcp, not a gate port here", true, ipv4(pod, gate, 6, 40000, 80), false},
		{"to the gate from a spoofed source", true, ipv4("10.244.0.8", gate, 6, 40000, 443), false},
		{"to the gate as a later fragment", true, fragment, false},
		{"to the gate over ICMP", true, ipv4(pod, gate, 1, 0, 0), false},
		{"to another pod", true, ipv4(pod, "10.244.0.8", 6, 40000, 443), false},
		{"to the node", true, ipv4(pod, "10.243.0.1", 6, 40000, 10250), false},
		{"to the API server's Service", true, ipv4(pod, "10.96.0.1", 6, 40000, 443), false},
		{"to kube-dns", true, ipv4(pod, "10.96.0.10", 17, 40000, 53), false},
		{"to the metadata address", true, ipv4(pod, "169.254.169.254", 6, 40000, 80), false},
		{"IPv6", true, ipv6, false},
		{"an unknown ethertype", true, packet{ether: []byte{0x88, 0xb5}, nh: make([]byte, 40)}, false},
		{"ARP for the gateway", true, arp(pod, "10.244.0.1"), true},
		{"ARP claiming another address", true, arp("10.244.0.8", "10.244.0.1"), false},
		{"ARP of another form", true, arpIPv6, false},
		{"a short ARP", true, packet{ether: etherARP, nh: arpIPv4Ethernet}, false},

		{"the gate's reply from 443/tcp", false, ipv4(gate, pod, 6, 443, 40000), true},
		{"the gate's reply from 53/udp", false, ipv4(gate, pod, 17, 53, 40000), true},
		{"from the gate's other port", false, ipv4(gate, pod, 6, 8080, 40000), false},
		{"from another pod", false, ipv4("10.244.0.8", pod, 6, 443, 40000), false},
		{"from the gate to another address", false, ipv4(gate, "10.244.0.8", 6, 443, 40000), false},
		{"ARP for the pod", false, arp("10.244.0.1", pod), true},
		{"ARP for someone else", false, arp("10.244.0.1", "10.244.0.8"), false},
		{"IPv6 in", false, ipv6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules := f.Ingress()
			if tc.egress {
				rules = f.Egress()
			}
			if got := eval(t, rules, tc.p); got != tc.allowed {
				t.Errorf("allowed = %v, want %v; rules:\n%s", got, tc.allowed, texts(rules))
			}
		})
	}
}

// TestFenceRuleCount: one rule per gate address and port in each
// direction, ARP's, and the counted drop.
func TestFenceRuleCount(t *testing.T) {
	f := Fence{
		Pod:   netip.MustParseAddr("10.244.0.7"),
		Gates: []netip.Addr{netip.MustParseAddr("10.96.0.53"), netip.MustParseAddr("10.96.0.54")},
		Ports: []Port{{UDP, 53}, {TCP, 443}, {TCP, 80}},
	}
	for name, rules := range map[string][]Rule{"egress": f.Egress(), "ingress": f.Ingress()} {
		if got, want := len(rules), 2*3+2; got != want {
			t.Errorf("%s has %d rules, want %d:\n%s", name, got, want, texts(rules))
		}
		if last := rules[len(rules)-1].Text; last != "counter drop" {
			t.Errorf("%s ends with %q, want the counted drop", name, last)
		}
	}
}

func texts(rules []Rule) string {
	var b bytes.Buffer
	for _, r := range rules {
		fmt.Fprintln(&b, " ", r.Text)
	}
	return b.String()
}
