package policy

import "net/netip"

// special lists the address ranges the gate refuses to dial unless an
// address rule deliberately opens them (see OpensSpecial). A guest that
// could reach them would reach the host's own services, the local
// network, or a cloud metadata endpoint (169.254.169.254, 169.254.170.2,
// fd00:ec2::254, 100.100.100.200) through a name that merely resolves
// there: name rules never open these ranges.
//
// Order matters where ranges nest: the exact IPv6 unspecified and
// loopback addresses come before the IPv4-compatible ::/96 that holds
// them, broadcast before the reserved 240/4 that holds it.
//
// Not here, on purpose: the documentation ranges 192.0.2.0/24,
// 198.51.100.0/24, 203.0.113.0/24 and the benchmarking range
// 198.18.0.0/15. The gate's synthetic DNS pool lives in 198.18/15 and
// tests use the documentation ranges as stand-ins for the internet.
var special = []struct {
	pfx   netip.Prefix
	class AddrClass
}{
	{netip.MustParsePrefix("0.0.0.0/8"), ClassUnspecified},
	{netip.MustParsePrefix("127.0.0.0/8"), ClassLoopback},
	{netip.MustParsePrefix("10.0.0.0/8"), ClassPrivate},
	{netip.MustParsePrefix("172.16.0.0/12"), ClassPrivate},
	{netip.MustParsePrefix("192.168.0.0/16"), ClassPrivate},
	{netip.MustParsePrefix("100.64.0.0/10"), ClassCGNAT},
	{netip.MustParsePrefix("169.254.0.0/16"), ClassLinkLocal},
	{netip.MustParsePrefix("224.0.0.0/4"), ClassMulticast},
	{netip.MustParsePrefix("255.255.255.255/32"), ClassBroadcast},
	{netip.MustParsePrefix("240.0.0.0/4"), ClassReserved},

	{netip.MustParsePrefix("::/128"), ClassUnspecified},
	{netip.MustParsePrefix("::1/128"), ClassLoopback},
	// IPv6 forms that carry an IPv4 address: a filter that looks only
	// at IPv4 would let ::ffff:127.0.0.1 or 64:ff9b::a9fe:a9fe through.
	{netip.MustParsePrefix("::ffff:0:0/96"), ClassIPv4Mapped},
	{netip.MustParsePrefix("::/96"), ClassIPv4Compatible},
	{netip.MustParsePrefix("64:ff9b::/96"), ClassNAT64},
	{netip.MustParsePrefix("64:ff9b:1::/48"), ClassNAT64},
	{netip.MustParsePrefix("2002::/16"), Class6to4},
	{netip.MustParsePrefix("2001::/32"), ClassTeredo},
	{netip.MustParsePrefix("fc00::/7"), ClassPrivate},
	{netip.MustParsePrefix("fec0::/10"), ClassPrivate}, // site-local: deprecated, still routed by some stacks
	{netip.MustParsePrefix("fe80::/10"), ClassLinkLocal},
	{netip.MustParsePrefix("ff00::/8"), ClassMulticast},
}

// AddrClass names a range of addresses the gate refuses to dial (see
// Special). The words are the detail of the audit's "refused address
// class" reasons: frozen.
type AddrClass string

// Address classes.
const (
	ClassHost           AddrClass = "host" // the host's own addresses
	ClassLoopback       AddrClass = "loopback"
	ClassUnspecified    AddrClass = "unspecified"
	ClassPrivate        AddrClass = "private"
	ClassCGNAT          AddrClass = "cgnat"
	ClassLinkLocal      AddrClass = "link-local" // cloud metadata endpoints among them
	ClassMulticast      AddrClass = "multicast"
	ClassBroadcast      AddrClass = "broadcast"
	ClassReserved       AddrClass = "reserved"
	ClassIPv4Mapped     AddrClass = "ipv4-mapped"
	ClassIPv4Compatible AddrClass = "ipv4-compatible"
	ClassNAT64          AddrClass = "nat64"
	Class6to4           AddrClass = "6to4"
	ClassTeredo         AddrClass = "teredo"
	// ClassInvalid: not an address at all; Special fails closed on it.
	ClassInvalid AddrClass = "invalid"
)

// Special reports whether ip is in a range the gate refuses to dial
// unless an address rule opens it, and names the range's class for the
// audit record: "host" (one of hostAddrs, checked first), "loopback",
// "unspecified", "private", "cgnat", "link-local", "multicast",
// "broadcast", "reserved", "ipv4-mapped", "ipv4-compatible", "nat64",
// "6to4", "teredo". A zone is ignored. An invalid address is special
// (class "invalid"): the check fails closed.
func Special(ip netip.Addr, hostAddrs []netip.Addr) (class AddrClass, special bool) {
	if !ip.IsValid() {
		return ClassInvalid, true
	}
	ip = ip.WithZone("")
	for _, h := range hostAddrs {
		h = h.WithZone("")
		// The host's address in either spelling: the IPv4-mapped form
		// of a host address is the host too.
		if h == ip || h.Unmap() == ip.Unmap() {
			return ClassHost, true
		}
	}
	if _, class, ok := specialRange(ip); ok {
		return class, true
	}
	return "", false
}

func specialRange(ip netip.Addr) (netip.Prefix, AddrClass, bool) {
	for _, s := range special {
		if s.pfx.Contains(ip) {
			return s.pfx, s.class, true
		}
	}
	return netip.Prefix{}, "", false
}

// classRange is the range an opening rule must fit inside: the class's
// range that holds ip, or ip alone for the host's own addresses.
func classRange(ip netip.Addr, class AddrClass) (netip.Prefix, bool) {
	if class == ClassHost {
		return netip.PrefixFrom(ip, ip.BitLen()), true
	}
	for _, s := range special {
		if s.class == class && s.pfx.Contains(ip) {
			return s.pfx, true
		}
	}
	return netip.Prefix{}, false
}

// OpensSpecial reports whether an address rule deliberately opens ip, a
// special address of class (as Special returned it), on port (0: any
// port). The decision is the usual one (highest layer, most specific,
// block wins a tie) over the address rules that match ip, except that
// an allow rule counts only if its prefix lies inside the class's range:
// "10.20.0.0/16" opens 10.20.1.2 and "10.0.0.0/8" does too, but
// "0.0.0.0/0", "::/0" or "8.0.0.0/5" never open loopback or private
// addresses. A rule that broad was written to mean "the internet", and
// reading it as "and also my host and my LAN" would turn a convenience
// into a hole. Such broad allows are treated as having no opinion here,
// so a narrower allow in a lower layer still opens the range; block
// rules always count, however broad. The host's own addresses open only
// to a rule naming exactly that address.
//
// The bool is true only for an allow; the Decision says which rule
// decided (or none).
func (p *Policy) OpensSpecial(ip netip.Addr, port uint16, class AddrClass) (Decision, bool) {
	if p == nil || !ip.IsValid() {
		return Decision{}, false
	}
	ip = ip.WithZone("")
	rng, ok := classRange(ip, class)
	if !ok {
		// The class does not fit the address: the caller mixed up its
		// arguments. Fail closed.
		return Decision{}, false
	}
	deliberate := func(r *Rule) bool {
		return r.Action != Allow || r.Prefix.Bits() >= rng.Bits() && rng.Contains(r.Prefix.Addr())
	}
	var buf [16]int32
	d := p.decide(p.addrRules(ip, buf[:0]), port, deliberate)
	return d, d.Verdict == Allow
}
