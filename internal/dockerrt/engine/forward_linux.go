package engine

import (
	"errors"
	"fmt"
	"net"
	"runtime"

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

// workloadListener gives ReverseAddr to the forwarder's side of the
// reverse link in pid's network namespace (the workload's: moat-docker
// enters it from the host; the workload never holds NET_ADMIN), routes
// ReverseLocal back over it when gVisor holds that address (runsc), and
// returns a function that listens there. A namespace without the link (a
// sandbox made before it) gets ReverseAddr on its loopback device, which
// serves a workload on runc only; ok is false where that cannot serve.
// Done at each start: a restarted holder has a new namespace.
func workloadListener(pid int, runsc bool) (listen func(addr string) (net.Listener, error), ok bool, err error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return nil, false, fmt.Errorf("opening the workload's network namespace: %w", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, false, err
	}
	defer h.Close()
	if err := serveReverseLink(h); err != nil {
		if !errors.Is(err, errNoReverseLink) || runsc {
			ns.Close()
			return nil, false, err
		}
		lo, err := h.LinkByName("lo")
		if err != nil {
			ns.Close()
			return nil, false, fmt.Errorf("finding the workload's loopback device: %w", err)
		}
		a := &netlink.Addr{IPNet: hostNet(dockerrt.ReverseAddr), Scope: unix.RT_SCOPE_HOST}
		if err := h.AddrAdd(lo, a); err != nil && !errors.Is(err, unix.EEXIST) {
			ns.Close()
			return nil, false, fmt.Errorf("adding %s to the workload's loopback device: %w", dockerrt.ReverseAddr, err)
		}
	}
	return func(addr string) (net.Listener, error) { return listenInNS(ns, addr) }, true, nil
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
