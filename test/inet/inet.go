// Package inet is a small private internet for the gate's integration and end-to-end tests.
//
// No test may reach the public internet, yet the gate has to be shown dialing real upstreams
// from the host network namespace, and attacker servers have to be shown receiving nothing.
// Start builds a network namespace joined to the host by a veth pair; the host routes
// 198.51.100.0/24 (TEST-NET-2) into it. Servers added to the Net listen inside that namespace,
// an authoritative DNS server at 198.51.100.53:53 answers for test names (the .test TLD,
// never real domains), and every server records what it received so a test can assert that
// an attacker got nothing.
//
// Servers are goroutines of the test process: their sockets are created on an OS thread that
// briefly enters the namespace, and a socket stays in the namespace it was created in, so the
// servers are served from any goroutine while the test itself (and the daemon it starts) stays
// in the host namespace, where the gate dials from.
//
// One Net per host at a time. Every Net puts 198.51.100.1/24 on its host-side veth, so two live
// Nets would fight over the same route. Start therefore takes a host-wide flock on
// /run/moat-inet.lock and holds it until the Net's cleanup: a Net in another test binary
// (go test ./... runs packages in parallel) or another parallel test of the same binary waits
// its turn, up to the test's deadline. Do not call Start while the same test, or a parent
// test, still holds a Net: that wait can only end at the deadline. Share one Net instead.
//
// Cleanup: everything Start creates is removed by t.Cleanup (servers stopped, host veth and
// namespace deleted, lock released). A test binary that died before its cleanups ran leaves a
// namespace named moat-inet-* and a host link named minet*; since whoever holds the lock owns
// the only live Net, Start removes every such leftover once it has the lock.
//
// Why 198.51.100.0/24: on this machine 192.0.2.0/24 is the host's own network and the package
// registries are reached through 203.0.113.0/24, so routing either into a namespace cuts the
// machine off. Start never touches the host's default route or any interface but its own veth.
//
// Linux only; needs root (Start skips otherwise) and iproute2's ip.
package inet

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// The fixed addresses of every Net, also handed out as its fields. Tests and policies are
// written against them (allow 198.51.100.0/24, DNS at .53), so they do not move. Read only.
var (
	// Prefix is what the host routes into the namespace.
	Prefix = netip.MustParsePrefix("198.51.100.0/24")
	// HostAddr is the host end of the veth: the source address servers see for every
	// connection from the host (the test process, the daemon's gate).
	HostAddr = netip.MustParseAddr("198.51.100.1")
	// NSAddr is the namespace end's primary address.
	NSAddr = netip.MustParseAddr("198.51.100.254")
	// DNSAddr is where the authoritative DNS server listens, UDP and TCP.
	DNSAddr = netip.AddrPortFrom(netip.MustParseAddr("198.51.100.53"), 53)
)

const (
	nsPrefix   = "moat-inet-" // namespace names: moat-inet-<pid>-<n>
	linkPrefix = "minet"      // host veth names: minet<pid base 36>x<n base 36>, at most 15 bytes
	nsLink     = "inet0"      // the veth end inside the namespace
	lockPath   = "/run/moat-inet.lock"
)

// seq numbers the Nets of this process, so names stay unique across sequential and parallel
// tests of one binary; the pid keeps them unique across binaries.
var seq atomic.Int64

// Net is one private internet. The exported fields are read-only.
type Net struct {
	NS       string         // network namespace, for ip -n / ip netns exec
	HostIf   string         // host end of the veth pair
	HostAddr netip.Addr     // HostAddr, 198.51.100.1
	NSAddr   netip.Addr     // NSAddr, 198.51.100.254
	DNS      netip.AddrPort // DNSAddr, 198.51.100.53:53: the authoritative server for test names

	ca   *CA
	zone *zone

	mu      sync.Mutex // guards hosts, servers and dnsStop
	hosts   map[netip.Addr]bool
	servers []*Server
	dnsStop func() error
}

// Start builds a Net for t and arranges for t.Cleanup to remove it. It skips t when not root
// and fails it when the network cannot be built.
func Start(t testing.TB) *Net {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("inet: needs root to create network namespaces and veth pairs; run the tests as root (./scripts/test.sh, as CI does)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("inet: iproute2's ip is not on PATH: %v", err)
	}
	k := seq.Add(1)
	pid := os.Getpid()
	n := &Net{
		NS:       fmt.Sprintf("%s%d-%d", nsPrefix, pid, k),
		HostIf:   linkPrefix + strconv.FormatInt(int64(pid), 36) + "x" + strconv.FormatInt(k, 36),
		HostAddr: HostAddr,
		NSAddr:   NSAddr,
		DNS:      DNSAddr,
		zone:     newZone(),
		hosts:    map[netip.Addr]bool{},
	}
	unlock := lockHost(t, n.NS)
	// Registered before anything is built so a failure half-way is still undone.
	t.Cleanup(func() {
		n.teardown(t)
		unlock()
	})
	if err := removeStale(); err != nil {
		t.Fatalf("inet: removing leftovers of an earlier run: %v", err)
	}
	if err := checkPrefixFree(); err != nil {
		t.Fatalf("inet: %v", err)
	}
	if err := n.build(); err != nil {
		t.Fatalf("inet: building namespace %s: %v", n.NS, err)
	}
	ca, err := newCA()
	if err != nil {
		t.Fatalf("inet: %v", err)
	}
	n.ca = ca
	if err := n.startDNS(); err != nil {
		t.Fatalf("inet: starting DNS server at %s: %v", n.DNS, err)
	}
	return n
}

// CA is the test certificate authority that signs every HTTPS server's certificate.
func (n *Net) CA() *CA { return n.ca }

// AddHost puts ip on the namespace's veth end so servers can listen on it. Servers call it
// themselves; calling it twice is harmless. Addresses in 198.51.100.0/24 are routed by the
// host already. A private, CGNAT or link-local address (10/8, 172.16/12, 192.168/16,
// 100.64/10, 169.254/16) also gets a /32 route via the veth, so internal-target tests have a
// real server that would notice a leak; it is refused if the host already routes it anywhere
// but its default route.
func (n *Net) AddHost(t testing.TB, ip string) {
	t.Helper()
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		t.Fatalf("inet: adding host %q: %v", ip, err)
	}
	if err := n.addHost(addr); err != nil {
		t.Fatalf("inet: adding host %s: %v", addr, err)
	}
}

func (n *Net) addHost(addr netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hosts[addr] {
		return nil
	}
	if err := checkHostAddr(addr); err != nil {
		return err
	}
	if err := n.addAddr(addr); err != nil {
		return err
	}
	n.hosts[addr] = true
	return nil
}

// checkHostAddr refuses addresses whose route into the namespace would take something away
// from the host.
func checkHostAddr(addr netip.Addr) error {
	if !addr.Is4() {
		return fmt.Errorf("only IPv4 addresses: the gate has no IPv6 upstream")
	}
	if Prefix.Contains(addr) {
		if addr == HostAddr {
			return fmt.Errorf("%s is the host end of the veth", addr)
		}
		return nil
	}
	for _, p := range forbidden {
		if p.Contains(addr) {
			return fmt.Errorf("%s is in %s, which this machine needs (its own network or the registries' route, or loopback/multicast)", addr, p)
		}
	}
	for _, p := range routable {
		if p.Contains(addr) {
			return nil
		}
	}
	return fmt.Errorf("%s is neither in %s nor in a private, CGNAT or link-local range; a public address would be taken away from the host", addr, Prefix)
}

var (
	forbidden = prefixes("192.0.2.0/24", "203.0.113.0/24", "127.0.0.0/8", "0.0.0.0/8", "224.0.0.0/3")
	routable  = prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16")
)

func prefixes(ss ...string) []netip.Prefix {
	ps := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		ps[i] = netip.MustParsePrefix(s)
	}
	return ps
}

// track registers s so teardown stops it even if the test never closes it.
func (n *Net) track(s *Server) {
	n.mu.Lock()
	n.servers = append(n.servers, s)
	n.mu.Unlock()
}

// teardown stops every server and deletes the veth and namespace. It tolerates a Net that was
// only half built.
func (n *Net) teardown(t testing.TB) {
	t.Helper()
	n.mu.Lock()
	servers, dnsStop := n.servers, n.dnsStop
	n.servers, n.dnsStop = nil, nil
	n.mu.Unlock()
	for _, s := range servers {
		s.Close()
	}
	if dnsStop != nil {
		if err := dnsStop(); err != nil {
			t.Errorf("inet: stopping DNS server: %v", err)
		}
	}
	if err := n.destroy(); err != nil {
		t.Errorf("inet: removing namespace %s: %v", n.NS, err)
	}
}
