package gatecni

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables/expr"
)

// Fence is what one gated pod's interface may pass: its own IPv4 address
// to each gate address on each gate port, the replies, and ARP for its
// own address. Everything else, IPv6 and other ethertypes included, meets
// the chains' drop policy.
type Fence struct {
	// Device is the pod's interface in its network namespace (CNI_IFNAME).
	Device string
	// Pod is the pod's IPv4 address: the only source it may send from,
	// since the gate tells its tenants apart by source address.
	Pod   netip.Addr
	Gates []netip.Addr
	Ports []Port
}

// Rule is one rule of a chain: the nft expressions and the same in nft's
// syntax, for the log, errors and tests.
type Rule struct {
	Text  string
	Exprs []expr.Any
}

// Ethertypes, as skb->protocol holds them (big-endian).
var (
	etherIPv4 = []byte{0x08, 0x00}
	etherARP  = []byte{0x08, 0x06}
)

// arpIPv4Ethernet is the fixed start of an ARP packet for IPv4 over
// Ethernet (htype 1, ptype 0x0800, hlen 6, plen 4): the sender and target
// addresses below are at these offsets only in that form.
var arpIPv4Ethernet = []byte{0x00, 0x01, 0x08, 0x00, 0x06, 0x04}

// Offsets into the network header (RFC 791, RFC 826) and the transport
// header (TCP and UDP alike).
const (
	ipSrcOff   = 12
	ipDstOff   = 16
	arpSPAOff  = 14
	arpTPAOff  = 24
	thSportOff = 0
	thDportOff = 2
)

// Egress is the chain on the device's egress hook: what the pod sends.
func (f Fence) Egress() []Rule {
	rules := []Rule{{
		Text: fmt.Sprintf("meta protocol arp arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp saddr ip %s accept", f.Pod),
		Exprs: join(metaEq(expr.MetaKeyPROTOCOL, etherARP),
			payloadEq(expr.PayloadBaseNetworkHeader, 0, arpIPv4Ethernet),
			payloadEq(expr.PayloadBaseNetworkHeader, arpSPAOff, f.Pod.AsSlice()),
			accept()),
	}}
	for _, g := range f.Gates {
		for _, p := range f.Ports {
			rules = append(rules, Rule{
				Text: fmt.Sprintf("meta protocol ip ip saddr %s ip daddr %s meta l4proto %s th dport %d accept", f.Pod, g, p.Proto, p.Num),
				Exprs: join(metaEq(expr.MetaKeyPROTOCOL, etherIPv4),
					payloadEq(expr.PayloadBaseNetworkHeader, ipSrcOff, f.Pod.AsSlice()),
					payloadEq(expr.PayloadBaseNetworkHeader, ipDstOff, g.AsSlice()),
					metaEq(expr.MetaKeyL4PROTO, []byte{byte(p.Proto)}),
					payloadEq(expr.PayloadBaseTransportHeader, thDportOff, be16(p.Num)),
					accept()),
			})
		}
	}
	return append(rules, countedDrop())
}

// Ingress is the chain on the device's ingress hook: what reaches the
// pod. It binds a pod whose processes use the namespace's own stack
// (runc); a gVisor sandbox's AF_PACKET socket is a tap that sees a packet
// before this hook runs, and for it Egress is the fence: what arrives
// unasked cannot be answered.
func (f Fence) Ingress() []Rule {
	rules := []Rule{{
		Text: fmt.Sprintf("meta protocol arp arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp daddr ip %s accept", f.Pod),
		Exprs: join(metaEq(expr.MetaKeyPROTOCOL, etherARP),
			payloadEq(expr.PayloadBaseNetworkHeader, 0, arpIPv4Ethernet),
			payloadEq(expr.PayloadBaseNetworkHeader, arpTPAOff, f.Pod.AsSlice()),
			accept()),
	}}
	for _, g := range f.Gates {
		for _, p := range f.Ports {
			rules = append(rules, Rule{
				Text: fmt.Sprintf("meta protocol ip ip saddr %s ip daddr %s meta l4proto %s th sport %d accept", g, f.Pod, p.Proto, p.Num),
				Exprs: join(metaEq(expr.MetaKeyPROTOCOL, etherIPv4),
					payloadEq(expr.PayloadBaseNetworkHeader, ipSrcOff, g.AsSlice()),
					payloadEq(expr.PayloadBaseNetworkHeader, ipDstOff, f.Pod.AsSlice()),
					metaEq(expr.MetaKeyL4PROTO, []byte{byte(p.Proto)}),
					payloadEq(expr.PayloadBaseTransportHeader, thSportOff, be16(p.Num)),
					accept()),
			})
		}
	}
	return append(rules, countedDrop())
}

// countedDrop ends each chain: the policy drops too, but this counts what
// the fence refused, which `moat-cni` CHECK and the tests read.
func countedDrop() Rule {
	return Rule{Text: "counter drop", Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}}
}

func join(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func metaEq(key expr.MetaKey, want []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: want},
	}
}

func payloadEq(base expr.PayloadBase, off uint32, want []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: base, Offset: off, Len: uint32(len(want))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: want},
	}
}

func accept() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}} }

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
