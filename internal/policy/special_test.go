package policy

import (
	"net/netip"
	"testing"
)

func TestSpecial(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("10.1.2.3")}
	tests := []struct {
		ip    string
		class AddrClass // "" = not special
	}{
		{"127.0.0.1", "loopback"},
		{"127.255.255.254", "loopback"},
		{"::1", "loopback"},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "unspecified"},
		{"::", "unspecified"},
		{"10.0.0.1", "private"},
		{"10.255.255.255", "private"},
		{"172.16.0.1", "private"},
		{"172.31.255.255", "private"},
		{"172.32.0.1", ""},
		{"172.15.255.255", ""},
		{"192.168.1.1", "private"},
		{"fc00::1", "private"},
		{"fd00:ec2::254", "private"}, // AWS IMDS over IPv6
		{"fdff:ffff::1", "private"},
		{"fec0::1", "private"},
		{"100.64.0.1", "cgnat"},
		{"100.100.100.200", "cgnat"}, // Alibaba Cloud metadata
		{"100.127.255.255", "cgnat"},
		{"100.128.0.1", ""},
		{"169.254.169.254", "link-local"}, // cloud metadata
		{"169.254.170.2", "link-local"},   // ECS task metadata
		{"fe80::1", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"febf::1", "link-local"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"ff02::1", "multicast"},
		{"255.255.255.255", "broadcast"},
		{"240.0.0.1", "reserved"},
		{"255.255.255.254", "reserved"},
		{"::ffff:127.0.0.1", "ipv4-mapped"},
		{"::ffff:8.8.8.8", "ipv4-mapped"},
		{"::127.0.0.1", "ipv4-compatible"},
		{"::8.8.8.8", "ipv4-compatible"},
		{"64:ff9b::a9fe:a9fe", "nat64"},
		{"64:ff9b:1::1", "nat64"},
		{"2002:7f00:1::", "6to4"},
		{"2001::1", "teredo"},
		{"2001:0:ffff::1", "teredo"},
		{"192.0.2.10", "host"},
		{"::ffff:192.0.2.10", "host"},
		{"2001:db8::10", "host"},
		{"10.1.2.3", "host"}, // host before private: the host opens only by name
		// Not special: the documentation and benchmarking ranges (tests
		// and the synthetic DNS pool depend on that), and the internet.
		{"192.0.2.1", ""},
		{"198.51.100.1", ""},
		{"203.0.113.1", ""},
		{"198.18.0.1", ""},
		{"198.19.255.255", ""},
		{"8.8.8.8", ""},
		{"1.1.1.1", ""},
		{"2001:db8::1", ""},
		{"2001:1::1", ""}, // outside Teredo's /32
		{"2606:4700::1111", ""},
		{"223.255.255.255", ""},
	}
	for _, tt := range tests {
		class, sp := Special(netip.MustParseAddr(tt.ip), host)
		if class != tt.class || sp != (tt.class != "") {
			t.Errorf("Special(%s) = %q, %v; want %q", tt.ip, class, sp, tt.class)
		}
	}
	if class, sp := Special(netip.Addr{}, nil); !sp || class != "invalid" {
		t.Errorf("Special(invalid) = %q, %v; want it special", class, sp)
	}
	if class, sp := Special(netip.MustParseAddr("192.0.2.10"), nil); sp {
		t.Errorf("Special without host addresses = %q", class)
	}
}

func TestOpensSpecial(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	p := compile(t,
		r{LayerUser, Allow, "0.0.0.0/0"},
		r{LayerUser, Allow, "::/0"},
		r{LayerUser, Allow, "8.0.0.0/6"}, // covers 10/8 and more: not deliberate
		r{LayerUser, Allow, "10.20.0.0/16"},
		r{LayerUser, Block, "10.20.9.0/24"},
		r{LayerUser, Allow, "172.16.0.0/12:5432"},
		r{LayerUser, Allow, "127.0.0.1:8080"},
		r{LayerUser, Allow, "169.254.169.254"},
		r{LayerBuiltin, Allow, "192.168.0.0/16"},
		r{LayerProject, Allow, "0.0.0.0/0"}, // higher, but too broad to count
		r{LayerProject, Block, "192.168.7.0/24"},
		r{LayerUser, Allow, "192.0.2.0/24"}, // contains the host, does not name it
		r{LayerUser, Allow, "fd00::/8"},
		r{LayerUser, Allow, "100.64.0.0/10"},
		r{LayerUser, Allow, "224.0.0.0/4"},     // multicast, whole class
		r{LayerUser, Allow, "240.0.0.0/4"},     // reserved, but not broadcast
		r{LayerRuntime, Block, "0.0.0.0/0:25"}, // a broad block always counts
		r{LayerUser, Allow, "fe80::/10"},
	)
	tests := []struct {
		ip    string
		port  uint16
		open  bool
		entry string
	}{
		{"10.20.1.2", 443, yes, "10.20.0.0/16"},
		{"10.20.9.9", 443, no, "10.20.9.0/24"},
		{"10.20.1.2", 25, no, "0.0.0.0/0:25"},
		{"10.30.0.1", 443, no, ""}, // only /0 and /6 cover it
		{"172.20.0.1", 5432, yes, "172.16.0.0/12:5432"},
		{"172.20.0.1", 443, no, ""},
		{"172.20.0.1", 0, yes, "172.16.0.0/12:5432"},
		{"127.0.0.1", 8080, yes, "127.0.0.1:8080"},
		{"127.0.0.1", 80, no, ""},
		{"127.0.0.2", 8080, no, ""},
		{"169.254.169.254", 80, yes, "169.254.169.254"},
		{"169.254.170.2", 80, no, ""},
		// The project's 0.0.0.0/0 has no opinion on private addresses,
		// so the builtin layer's /16 decides; the project's /24 block
		// does count.
		{"192.168.1.1", 443, yes, "192.168.0.0/16"},
		{"192.168.7.1", 443, no, "192.168.7.0/24"},
		{"fd00::1", 443, yes, "fd00::/8"},
		{"fc00::1", 443, no, ""},
		{"::1", 443, no, ""},
		{"::", 443, no, ""},
		{"100.100.100.200", 80, yes, "100.64.0.0/10"},
		{"239.1.1.1", 5353, yes, "224.0.0.0/4"},
		{"255.255.255.255", 67, no, ""},
		{"240.0.0.1", 80, yes, "240.0.0.0/4"},
		{"fe80::1%eth0", 22, yes, "fe80::/10"},
		// IPv4-embedded IPv6 forms open to no IPv4 rule and no /0.
		{"::ffff:10.20.1.2", 443, no, ""},
		{"64:ff9b::a14:102", 443, no, ""},
	}
	for _, tt := range tests {
		ip := netip.MustParseAddr(tt.ip)
		class, sp := Special(ip, host)
		if !sp {
			t.Fatalf("%s is not special", tt.ip)
		}
		d, ok := p.OpensSpecial(ip, tt.port, class)
		got := ""
		if d.Rule != nil {
			got = d.Rule.Entry
		}
		if ok != tt.open || got != tt.entry || ok != (d.Verdict == Allow) {
			t.Errorf("OpensSpecial(%s, %d, %s) = %v, %v by %q; want %v by %q", tt.ip, tt.port, class, d.Verdict, ok, got, tt.open, tt.entry)
		}
	}

	// The host's own address opens only to a rule naming it exactly.
	ip := netip.MustParseAddr("192.0.2.10")
	if d, ok := p.OpensSpecial(ip, 443, ClassHost); ok {
		t.Errorf("host address opened by %q", d.Rule.Entry)
	}
	hp := compile(t, r{LayerUser, Allow, "192.0.2.10:8080"}, r{LayerUser, Allow, "10.0.0.0/8"})
	if _, ok := hp.OpensSpecial(ip, 8080, ClassHost); !ok {
		t.Error("host address not opened by a rule naming it")
	}
	// A host address in a private range: the class is "host", and the
	// range rule does not open it.
	hip := netip.MustParseAddr("10.1.2.3")
	class, _ := Special(hip, []netip.Addr{hip})
	if _, ok := hp.OpensSpecial(hip, 443, class); ok {
		t.Errorf("host address %s (class %s) opened by 10.0.0.0/8", hip, class)
	}

	// A class that does not fit the address fails closed.
	if _, ok := p.OpensSpecial(netip.MustParseAddr("10.20.1.2"), 443, "loopback"); ok {
		t.Error("mismatched class opened")
	}
	if _, ok := p.OpensSpecial(netip.MustParseAddr("10.20.1.2"), 443, "nonsense"); ok {
		t.Error("unknown class opened")
	}
	if _, ok := p.OpensSpecial(netip.Addr{}, 443, "invalid"); ok {
		t.Error("invalid address opened")
	}
}
