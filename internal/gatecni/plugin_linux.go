package gatecni

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table (family netdev) the fence lives in, in
// the pod's network namespace. Frozen: CHECK and DEL of pods set up by an
// older plugin look for it.
const TableName = "moat_gate"

// Chain names in TableName.
const (
	chainEgress  = "egress"
	chainIngress = "ingress"
)

// Funcs are the plugin's CNI verbs, for skel.PluginMainFuncs. Log gets
// one line per decision (the runtime keeps a plugin's stderr in its log).
func Funcs(log io.Writer) skel.CNIFuncs {
	return skel.CNIFuncs{
		Add:    func(a *skel.CmdArgs) error { return add(a, log) },
		Del:    del,
		Check:  check,
		GC:     func(*skel.CmdArgs) error { return nil }, // nothing outlives a pod's namespace
		Status: func(*skel.CmdArgs) error { return nil },
	}
}

// Versions are the CNI spec versions the plugin speaks.
var Versions = version.PluginSupports("0.4.0", "1.0.0", "1.1.0")

// add gates the pod if it must be, and passes the previous result on.
func add(a *skel.CmdArgs, log io.Writer) error {
	conf, err := ParseConfig(a.StdinData)
	if err != nil {
		return err
	}
	prev, err := prevResult(conf)
	if err != nil {
		return err
	}
	pod, err := ParseArgs(a.Args)
	if err != nil {
		return err
	}
	d, err := conf.Decide(pod)
	if err != nil {
		return err
	}
	if !d.Gated {
		fmt.Fprintf(log, "moat-cni: pod %s/%s (container %s) not gated: %s\n", pod.Namespace, pod.Name, a.ContainerID, d.Reason)
		return types.PrintResult(prev, conf.CNIVersion)
	}
	f, err := fenceFor(conf, prev, a.IfName, a.Netns)
	if err != nil {
		return fmt.Errorf("moat-cni: gating pod %s/%s (%s): %w", pod.Namespace, pod.Name, d.Reason, err)
	}
	if err := Install(a.Netns, f); err != nil {
		return fmt.Errorf("moat-cni: gating pod %s/%s (%s), refusing its network: %w", pod.Namespace, pod.Name, d.Reason, err)
	}
	fmt.Fprintf(log, "moat-cni: pod %s/%s (container %s) gated (%s): %s on %s may reach only %v on %v\n",
		pod.Namespace, pod.Name, a.ContainerID, d.Reason, f.Pod, f.Device, f.Gates, f.Ports)
	return types.PrintResult(prev, conf.CNIVersion)
}

// check confirms that a gated pod's fence is in place.
func check(a *skel.CmdArgs) error {
	conf, err := ParseConfig(a.StdinData)
	if err != nil {
		return err
	}
	prev, err := prevResult(conf)
	if err != nil {
		return err
	}
	pod, err := ParseArgs(a.Args)
	if err != nil {
		return err
	}
	d, err := conf.Decide(pod)
	if err != nil || !d.Gated {
		return err
	}
	f, err := fenceFor(conf, prev, a.IfName, a.Netns)
	if err != nil {
		return err
	}
	return Verify(a.Netns, f)
}

// del removes the fence if the namespace is still there. Nothing else
// is kept, so DEL is the same whatever ADD did, or whether it ran.
func del(a *skel.CmdArgs) error {
	if a.Netns == "" {
		return nil
	}
	err := Remove(a.Netns)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func prevResult(conf *Config) (*current.Result, error) {
	if len(conf.PrevResult) == 0 {
		return nil, errors.New("moat-cni: no prevResult: it must follow the plugin that gives the pod its address (e.g. bridge) in a conflist")
	}
	r, err := version.NewResult(conf.CNIVersion, conf.PrevResult)
	if err != nil {
		return nil, fmt.Errorf("moat-cni: reading prevResult: %w", err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, fmt.Errorf("moat-cni: converting prevResult: %w", err)
	}
	return res, nil
}

// fenceFor finds the pod's IPv4 address on its interface in prev.
func fenceFor(conf *Config, prev *current.Result, ifName, netns string) (Fence, error) {
	f := Fence{Device: ifName, Gates: conf.Gates, Ports: conf.Ports}
	idx := -1
	for i, iface := range prev.Interfaces {
		if iface.Name == ifName && iface.Sandbox != "" {
			idx = i
		}
	}
	for _, ip := range prev.IPs {
		if ip.Interface != nil && *ip.Interface != idx {
			continue
		}
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			continue
		}
		a = a.Unmap()
		if !a.Is4() {
			continue // IPv6 is dropped whole
		}
		if f.Pod.IsValid() {
			return Fence{}, fmt.Errorf("interface %s has two IPv4 addresses in prevResult (%s, %s); moat-cni fences one", ifName, f.Pod, a)
		}
		f.Pod = a
	}
	if !f.Pod.IsValid() {
		return Fence{}, fmt.Errorf("no IPv4 address for interface %s in prevResult (%s)", ifName, netns)
	}
	return f, nil
}

// Install puts f's chains in the network namespace at nsPath, replacing
// any fence already there, in one transaction: either the whole fence is
// in place afterwards or the call fails.
func Install(nsPath string, f Fence) error {
	return withConn(nsPath, func(c *nftables.Conn, ns *os.File) error {
		// Since Linux 6.16 the kernel takes a netdev chain for a device
		// name that is not there and binds it to nothing, which would leave
		// the pod open: the device must be there first.
		if err := hasLink(ns, f.Device); err != nil {
			return err
		}
		t := &nftables.Table{Family: nftables.TableFamilyNetdev, Name: TableName}
		// add-delete-add in one batch: a fence left by an earlier ADD of the
		// same namespace goes, and an absent one is no error.
		c.AddTable(t)
		c.DelTable(t)
		c.AddTable(t)
		drop := nftables.ChainPolicyDrop
		for _, ch := range []struct {
			name  string
			hook  *nftables.ChainHook
			rules []Rule
		}{{chainEgress, nftables.ChainHookEgress, f.Egress()}, {chainIngress, nftables.ChainHookIngress, f.Ingress()}} {
			chain := c.AddChain(&nftables.Chain{
				Name: ch.name, Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: ch.hook, Priority: nftables.ChainPriorityFilter,
				Device: f.Device, Policy: &drop,
			})
			for _, r := range ch.rules {
				c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: r.Exprs})
			}
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("installing nftables table %s on %s: %w", TableName, f.Device, err)
		}
		return verify(c, f)
	})
}

// Verify checks that f's chains are in the namespace at nsPath.
func Verify(nsPath string, f Fence) error {
	return withConn(nsPath, func(c *nftables.Conn, ns *os.File) error {
		if err := hasLink(ns, f.Device); err != nil {
			return err
		}
		return verify(c, f)
	})
}

func verify(c *nftables.Conn, f Fence) error {
	t := &nftables.Table{Family: nftables.TableFamilyNetdev, Name: TableName}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return fmt.Errorf("listing nftables chains: %w", err)
	}
	want := map[string]int{chainEgress: len(f.Egress()), chainIngress: len(f.Ingress())}
	for _, ch := range chains {
		n, ok := want[ch.Name]
		if ch.Table.Name != TableName || !ok {
			continue
		}
		hook := map[string]*nftables.ChainHook{chainEgress: nftables.ChainHookEgress, chainIngress: nftables.ChainHookIngress}[ch.Name]
		if ch.Policy == nil || *ch.Policy != nftables.ChainPolicyDrop || ch.Hooknum == nil || *ch.Hooknum != *hook {
			return fmt.Errorf("chain %s of table %s: not a drop-policy chain on the %s hook", ch.Name, TableName, ch.Name)
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return fmt.Errorf("listing rules of chain %s: %w", ch.Name, err)
		}
		if len(rules) != n {
			return fmt.Errorf("chain %s of table %s has %d rules, want %d", ch.Name, TableName, len(rules), n)
		}
		delete(want, ch.Name)
	}
	if len(want) > 0 {
		return fmt.Errorf("table %s on %s lacks chains %v", TableName, f.Device, keys(want))
	}
	return nil
}

// Remove deletes the fence from the namespace at nsPath; an absent
// namespace is os.ErrNotExist, an absent table no error.
func Remove(nsPath string) error {
	return withConn(nsPath, func(c *nftables.Conn, _ *os.File) error {
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyNetdev)
		if err != nil {
			return fmt.Errorf("listing nftables tables: %w", err)
		}
		for _, t := range tables {
			if t.Name == TableName {
				c.DelTable(t)
				if err := c.Flush(); err != nil {
					return fmt.Errorf("deleting nftables table %s: %w", TableName, err)
				}
			}
		}
		return nil
	})
}

// Drops is what the fence's counted drop rules have refused in the
// namespace at nsPath, by chain: packets.
func Drops(nsPath string) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := withConn(nsPath, func(c *nftables.Conn, _ *os.File) error {
		t := &nftables.Table{Family: nftables.TableFamilyNetdev, Name: TableName}
		for _, name := range []string{chainEgress, chainIngress} {
			rules, err := c.GetRules(t, &nftables.Chain{Name: name, Table: t})
			if err != nil {
				return fmt.Errorf("listing rules of chain %s: %w", name, err)
			}
			for _, r := range rules {
				for _, e := range r.Exprs {
					if ctr, ok := e.(*expr.Counter); ok {
						out[name] += ctr.Packets
					}
				}
			}
		}
		return nil
	})
	return out, err
}

// withConn runs fn with an nftables connection whose netlink socket is
// opened in the namespace at nsPath (no thread switches namespace).
func withConn(nsPath string, fn func(*nftables.Conn, *os.File) error) error {
	ns, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("opening network namespace: %w", err)
	}
	defer ns.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(ns.Fd()), &st); err != nil {
		return fmt.Errorf("checking network namespace %s: %w", nsPath, err)
	}
	// A path that is not an nsfs file would make nftables act on the
	// caller's own namespace: the node's.
	if st.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("%s is not a network namespace (filesystem type %#x)", nsPath, st.Type)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return fmt.Errorf("opening nftables in %s: %w", nsPath, err)
	}
	return fn(c, ns)
}

// hasLink checks that the namespace ns has a device named name.
func hasLink(ns *os.File, name string) error {
	h, err := netlink.NewHandleAt(netns.NsHandle(ns.Fd()))
	if err != nil {
		return fmt.Errorf("opening netlink in the pod's namespace: %w", err)
	}
	defer h.Close()
	if _, err := h.LinkByName(name); err != nil {
		return fmt.Errorf("interface %s in the pod's namespace: %w", name, err)
	}
	return nil
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
