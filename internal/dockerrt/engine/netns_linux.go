package engine

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/dockerrt"
)

// hostRoutes are the IPv4 destinations of the host's routes, which a new
// internal subnet must not shadow.
func hostRoutes() ([]netip.Prefix, error) {
	rs, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing the host's routes: %w", err)
	}
	var out []netip.Prefix
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		if p, err := netip.ParsePrefix(r.Dst.String()); err == nil && p.Bits() > 0 {
			out = append(out, p)
		}
	}
	return out, nil
}

// The reverse link: a veth pair in the workload's network namespace,
// made before the workload starts, by which it reaches ReverseAddr. Under
// runsc the workload's network is gVisor's, copied from the namespace's
// interfaces and routes when it starts: an address moat adds to the
// namespace later is not the workload's to reach. gVisor copies revLink
// (up, with ReverseLocal and a route to ReverseAddr) and skips revPeer
// (down, no address); the forwarder then gives revPeer ReverseAddr and
// listens there, in the namespace's kernel, so gVisor's packets to
// ReverseAddr cross the pair to it. Under runc ReverseAddr on revPeer is
// simply a local address. No packet of either crosses the bridge.
const (
	revLink = "moatrev0" // the workload's side
	revPeer = "moatrev1" // the forwarder's side
)

// allowedRoutes are the only destinations the workload's namespace may
// have a route to: its subnet and the reverse link's two addresses.
func allowedRoutes(subnet netip.Prefix) []netip.Prefix {
	return []netip.Prefix{subnet, netip.PrefixFrom(dockerrt.ReverseAddr, 32), netip.PrefixFrom(dockerrt.ReverseLocal, 32)}
}

// isolate makes pid's network namespace (the network holder's, which
// the workload joins) what a workload may start in: routes to its subnet
// and the reverse link only, the workload's address on eth0 and
// ReverseLocal on revLink (under runsc, a workload that stopped took
// them with it, and gVisor copies only an interface that has one), the
// forwarder's side of the reverse link down and bare (or gVisor would
// copy ReverseAddr as its own), and no nat rules: Docker's default route
// to the bridge and its DNAT of 127.0.0.11 to the embedded resolver go.
// moat does this from the host; neither the holder nor the workload
// holds NET_ADMIN.
func isolate(pid int, r *dockerrt.Record) error {
	h, err := nsHandle(pid)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := pruneRoutes(h, r.Subnet); err != nil {
		return err
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("finding the workload's eth0: %w", err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: r.WorkloadIP.AsSlice(), Mask: net.CIDRMask(r.Subnet.Bits(), 32)}}
	if err := h.AddrAdd(eth, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("giving eth0 the workload's address back: %w", err)
	}
	if err := addReverseLink(h); err != nil {
		return err
	}
	if err := checkRoutes(pid, r.Subnet); err != nil {
		return err
	}
	// The nat table of the workload's namespace is Docker's alone: its
	// rules for the embedded resolver at 127.0.0.11.
	out, err := exec.Command("nsenter", "--net=/proc/"+strconv.Itoa(pid)+"/ns/net", "iptables", "-w", "-t", "nat", "-F").CombinedOutput()
	if err != nil {
		return fmt.Errorf("flushing the workload's nat rules (Docker's resolver at 127.0.0.11): %v: %s", err, out)
	}
	return nil
}

// nsHandle is a netlink handle in pid's network namespace.
func nsHandle(pid int) (*netlink.Handle, error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return nil, fmt.Errorf("opening the workload's network namespace: %w", err)
	}
	defer ns.Close() // the handle keeps its own
	return netlink.NewHandleAt(ns)
}

// pruneRoutes deletes every route of h's namespace but allowedRoutes.
func pruneRoutes(h *netlink.Handle, subnet netip.Prefix) error {
	keep := allowedRoutes(subnet)
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("listing the workload's routes: %w", err)
		}
		for _, r := range rs {
			if keepRoute(r, keep) {
				continue
			}
			if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("deleting the workload's route %s: %w", r, err)
			}
		}
	}
	return nil
}

// checkRoutes fails unless every route of pid's namespace is one
// allowedRoutes names: no default route, nothing else. Under runsc, once
// the workload runs, gVisor has taken the addresses and their routes
// went with them; what is left must still be a subset.
func checkRoutes(pid int, subnet netip.Prefix) error {
	got, err := Routes(pid)
	if err != nil {
		return err
	}
	keep := allowedRoutes(subnet)
	for _, p := range got {
		if !slices.Contains(keep, p) {
			// Fail closed: a workload with another way out is not started.
			return fmt.Errorf("the workload's network namespace has routes %v; want only %v", got, keep)
		}
	}
	return nil
}

// addReverseLink puts the reverse link in h's namespace as a workload
// starts with it: revLink up with ReverseLocal and a route to
// ReverseAddr, revPeer down with no address until the forwarder serves.
func addReverseLink(h *netlink.Handle) error {
	if _, err := h.LinkByName(revLink); err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = revLink
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: revPeer}); err != nil {
			return fmt.Errorf("adding the reverse forwards' link to the workload's namespace: %w", err)
		}
	}
	peer, err := h.LinkByName(revPeer)
	if err != nil {
		return err
	}
	if err := h.LinkSetDown(peer); err != nil {
		return err
	}
	addrs, err := h.AddrList(peer, unix.AF_INET)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if err := h.AddrDel(peer, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("taking %s off %s: %w", a.IPNet, revPeer, err)
		}
	}
	l, err := h.LinkByName(revLink)
	if err != nil {
		return err
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: hostNet(dockerrt.ReverseLocal)}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding %s to %s: %w", dockerrt.ReverseLocal, revLink, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return err
	}
	err = h.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: hostNet(dockerrt.ReverseAddr), Scope: netlink.SCOPE_LINK,
		Src: dockerrt.ReverseLocal.AsSlice()})
	if err != nil {
		return fmt.Errorf("routing %s to %s: %w", dockerrt.ReverseAddr, revLink, err)
	}
	return nil
}

func hostNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}
}

// sameNetns says whether two processes share a network namespace: the
// workload must be in its holder's, which a holder restarted behind
// moat's back (docker restart) no longer is.
func sameNetns(a, b int) bool {
	var sa, sb unix.Stat_t
	if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", a), &sa) != nil || unix.Stat(fmt.Sprintf("/proc/%d/ns/net", b), &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// ensureIsolated checks a running workload's namespace (that of its
// holder, pid) and the host's guard, and puts back what is missing. Only
// routes are deleted: the running workload's addresses and reverse link
// are left as they are.
func ensureIsolated(r *dockerrt.Record, pid int) error {
	if checkRoutes(pid, r.Subnet) != nil {
		h, err := nsHandle(pid)
		if err != nil {
			return err
		}
		defer h.Close()
		if err := pruneRoutes(h, r.Subnet); err != nil {
			return err
		}
		if err := checkRoutes(pid, r.Subnet); err != nil {
			return err
		}
	}
	if exec.Command("iptables", append([]string{"-w", "-C"}, guardRules(r.Bridge, r.Name)[0]...)...).Run() != nil {
		return guardBridge(r.Bridge, r.Name)
	}
	return nil
}

// keepRoute: the local table's entries (the addresses themselves,
// loopback), which are not ways out, and routes to keep.
func keepRoute(r netlink.Route, keep []netip.Prefix) bool {
	if r.Table == unix.RT_TABLE_LOCAL {
		return true
	}
	if r.Dst == nil {
		return false
	}
	p, err := netip.ParsePrefix(r.Dst.String())
	return err == nil && slices.Contains(keep, p)
}

// Routes are the destinations of the main table of pid's network
// namespace, IPv4 and IPv6 ("0.0.0.0/0" for a default route).
func Routes(pid int) ([]netip.Prefix, error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return nil, fmt.Errorf("opening the network namespace of %d: %w", pid, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var out []netip.Prefix
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := h.RouteList(nil, fam)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			if r.Dst == nil {
				if fam == unix.AF_INET {
					out = append(out, netip.MustParsePrefix("0.0.0.0/0"))
				} else {
					out = append(out, netip.MustParsePrefix("::/0"))
				}
				continue
			}
			if p, err := netip.ParsePrefix(r.Dst.String()); err == nil {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// guardRules are the host's INPUT rules for an internal bridge: the
// host's address on it is on the workload's subnet, so without them the
// workload reaches every service the host listens with on all
// addresses. Replies to the host's own connections (the agent's) pass.
func guardRules(bridge, name string) [][]string {
	c := []string{"-m", "comment", "--comment", "moat-" + name}
	return [][]string{
		append([]string{"INPUT", "-i", bridge}, append(c, "-j", "DROP")...),
		append([]string{"INPUT", "-i", bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED"}, append(c, "-j", "ACCEPT")...),
	}
}

func guardBridge(bridge, name string) error {
	unguardBridge(bridge, name)
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, r := range guardRules(bridge, name) {
			// -I 1 each: the ACCEPT ends up first.
			args := append([]string{"-w", "-I", r[0], "1"}, r[1:]...)
			out, err := exec.Command(tool, args...).CombinedOutput()
			if err != nil {
				if tool == "ip6tables" && errors.Is(err, exec.ErrNotFound) {
					continue // no IPv6 firewall tool: the workload has IPv6 off
				}
				return fmt.Errorf("guarding the host from bridge %s: %s %s: %v: %s", bridge, tool, strings.Join(args, " "), err, out)
			}
		}
	}
	return nil
}

func unguardBridge(bridge, name string) error {
	var errs []error
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, r := range guardRules(bridge, name) {
			// Delete while present, bounded: a rule added twice by a
			// crashed start goes too.
			for range 8 {
				if exec.Command(tool, append([]string{"-w", "-C"}, r...)...).Run() != nil {
					break
				}
				if out, err := exec.Command(tool, append([]string{"-w", "-D"}, r...)...).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("%s -D %s: %v: %s", tool, strings.Join(r, " "), err, out))
					break
				}
			}
		}
	}
	return errors.Join(errs...)
}
