package engine

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/dockerrt"
)

// watchExit returns a channel closed when pid exits, through a pidfd:
// opened now, it names this process and no later one with its number.
func watchExit(pid int) (<-chan struct{}, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, err
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	return ch, nil
}

// reverseListener serves ReverseAddr in pid's network namespace (the
// workload's: moat-docker enters it from the host; the workload never
// holds NET_ADMIN): it gives the address to the forwarder's side of the
// reverse link (serveReverseLink), listens on one port of it, and has
// the namespace's nat table send TCP to every port of ReverseAddr there
// (reverseNAT), so that the forwarder decides each port as a gVisor
// sandbox's gateway does: carried when a reverse forward lists it,
// refused and audited when none does. A namespace without the reverse
// link (a sandbox made before it) gets the address on its loopback
// device, which serves a workload on runc only. Done at each start: a
// restarted holder has a new namespace.
func reverseListener(pid int, runsc bool) (net.Listener, error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return nil, fmt.Errorf("opening the workload's network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if err := serveReverseLink(h); err != nil {
		if !errors.Is(err, errNoReverseLink) || runsc {
			return nil, err
		}
		lo, err := h.LinkByName("lo")
		if err != nil {
			return nil, fmt.Errorf("finding the workload's loopback device: %w", err)
		}
		a := &netlink.Addr{IPNet: hostNet(dockerrt.ReverseAddr), Scope: unix.RT_SCOPE_HOST}
		if err := h.AddrAdd(lo, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("adding %s to the workload's loopback device: %w", dockerrt.ReverseAddr, err)
		}
	}
	ln, err := listenInNS(ns, netip.AddrPortFrom(dockerrt.ReverseAddr, 0).String())
	if err != nil {
		return nil, fmt.Errorf("listening on %s in the workload's namespace: %w", dockerrt.ReverseAddr, err)
	}
	if err := reverseNAT(pid, ln.Addr().(*net.TCPAddr).AddrPort()); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// reverseNAT replaces the nat rules of pid's namespace (moat's alone:
// isolate removed Docker's) with two that send TCP to any port of
// ReverseAddr to to: OUTPUT for a workload on runc, whose connections
// are this kernel's, PREROUTING for one on runsc, whose arrive over the
// reverse link. The original port stays readable (SO_ORIGINAL_DST).
func reverseNAT(pid int, to netip.AddrPort) error {
	nsenter := []string{"--net=/proc/" + strconv.Itoa(pid) + "/ns/net", "iptables", "-w", "-t", "nat"}
	dst := netip.PrefixFrom(dockerrt.ReverseAddr, 32).String()
	for _, rule := range [][]string{
		{"-F"},
		{"-A", "OUTPUT", "-d", dst, "-p", "tcp", "-j", "DNAT", "--to-destination", to.String()},
		{"-A", "PREROUTING", "-d", dst, "-p", "tcp", "-j", "DNAT", "--to-destination", to.String()},
	} {
		if out, err := exec.Command("nsenter", append(nsenter, rule...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("sending %s to the forwarder in the workload's namespace: iptables %s: %v: %s", dockerrt.ReverseAddr, strings.Join(rule, " "), err, out)
		}
	}
	return nil
}

// originalDst is where c was headed before reverseNAT sent it to the
// forwarder (SO_ORIGINAL_DST).
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		// A sockaddr_in in the first 16 bytes: the usual reading of
		// SO_ORIGINAL_DST through a struct of that size.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		port := uint16(m.Multiaddr[2])<<8 | uint16(m.Multiaddr[3])
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port)
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	return ap, serr
}

// errNoReverseLink: the namespace predates the reverse link.
var errNoReverseLink = errors.New("the workload's network has no reverse link; it was made by an older moat: moat destroy it, or use runc")

// serveReverseLink brings the forwarder's side of the reverse link up
// with ReverseAddr, and routes ReverseLocal over it unless that is a
// local address (runc: the workload's side is this kernel's).
func serveReverseLink(h *netlink.Handle) error {
	peer, err := h.LinkByName(revPeer)
	if err != nil {
		return errNoReverseLink
	}
	if err := h.AddrAdd(peer, &netlink.Addr{IPNet: hostNet(dockerrt.ReverseAddr)}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding %s to %s: %w", dockerrt.ReverseAddr, revPeer, err)
	}
	if err := h.LinkSetUp(peer); err != nil {
		return fmt.Errorf("bringing %s up: %w", revPeer, err)
	}
	link, err := h.LinkByName(revLink)
	if err != nil {
		return fmt.Errorf("finding %s: %w", revLink, err)
	}
	addrs, err := h.AddrList(link, unix.AF_INET)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if a.IP.Equal(dockerrt.ReverseLocal.AsSlice()) {
			return nil
		}
	}
	err = h.RouteReplace(&netlink.Route{LinkIndex: peer.Attrs().Index, Dst: hostNet(dockerrt.ReverseLocal), Scope: netlink.SCOPE_LINK,
		Src: dockerrt.ReverseAddr.AsSlice()})
	if err != nil {
		return fmt.Errorf("routing %s over %s: %w", dockerrt.ReverseLocal, revPeer, err)
	}
	return nil
}

// listenInNS makes a listening socket in ns. The socket keeps its
// namespace; only its creation needs the thread in it. The thread runs
// nothing else meanwhile, and one that cannot go back to the host's
// namespace is never unlocked, so Go retires it with its goroutine.
func listenInNS(ns netns.NsHandle, addr string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		host, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer host.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("entering the workload's network namespace: %w", err)}
			return
		}
		ln, lerr := net.Listen("tcp4", addr)
		if err := netns.Set(host); err != nil {
			if ln != nil {
				ln.Close()
			}
			ch <- result{nil, fmt.Errorf("returning to the host's network namespace: %w", err)}
			return // locked: the thread goes with the goroutine
		}
		runtime.UnlockOSThread()
		ch <- result{ln, lerr}
	}()
	r := <-ch
	return r.ln, r.err
}
