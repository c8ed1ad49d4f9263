package engine

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
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

// isolate leaves the workload (pid's network namespace) one route, to
// its subnet, and no nat rules: Docker's default route to the bridge and
// its DNAT of 127.0.0.11 to the embedded resolver go. moat does this from
// the host; the workload never holds NET_ADMIN.
func isolate(pid int, subnet netip.Prefix) error {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("opening the workload's network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("listing the workload's routes: %w", err)
		}
		for _, r := range rs {
			if keepRoute(r, subnet) {
				continue
			}
			if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("deleting the workload's route %s: %w", r, err)
			}
		}
	}
	got, err := Routes(pid)
	if err != nil {
		return err
	}
	if len(got) != 1 || got[0] != subnet {
		// Fail closed: a workload with another way out is not started.
		return fmt.Errorf("the workload still has routes %v; want only %s", got, subnet)
	}
	// The nat table of the workload's namespace is Docker's alone: its
	// rules for the embedded resolver at 127.0.0.11.
	out, err := exec.Command("nsenter", "--net=/proc/"+strconv.Itoa(pid)+"/ns/net", "iptables", "-w", "-t", "nat", "-F").CombinedOutput()
	if err != nil {
		return fmt.Errorf("flushing the workload's nat rules (Docker's resolver at 127.0.0.11): %v: %s", err, out)
	}
	return nil
}

// ensureIsolated checks a running workload's routes and the host's
// guard, and puts back what is missing.
func ensureIsolated(r *dockerrt.Record, pid int) error {
	if r.Runtime == "runsc" {
		return nil // gVisor's routes are its own (sandbox.go)
	}
	got, err := Routes(pid)
	if err != nil {
		return err
	}
	if len(got) != 1 || got[0] != r.Subnet {
		if err := isolate(pid, r.Subnet); err != nil {
			return err
		}
	}
	if exec.Command("iptables", append([]string{"-w", "-C"}, guardRules(r.Bridge, r.Name)[0]...)...).Run() != nil {
		return guardBridge(r.Bridge, r.Name)
	}
	return nil
}

// keepRoute: the subnet's own route and the local table's entries
// (the address itself, loopback), which are not ways out.
func keepRoute(r netlink.Route, subnet netip.Prefix) bool {
	if r.Table == unix.RT_TABLE_LOCAL {
		return true
	}
	if r.Dst == nil {
		return false
	}
	p, err := netip.ParsePrefix(r.Dst.String())
	return err == nil && p == subnet
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
