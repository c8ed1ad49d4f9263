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

// workloadListener gives ReverseAddr to the loopback device of pid's
// network namespace (the workload's: moat-docker enters it from the
// host; the workload never holds NET_ADMIN) and returns a function
// that listens there. The address is added at each start: a restarted
// workload has a new namespace.
func workloadListener(pid int) (func(addr string) (net.Listener, error), error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return nil, fmt.Errorf("opening the workload's network namespace: %w", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("finding the workload's loopback device: %w", err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: dockerrt.ReverseAddr.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: unix.RT_SCOPE_HOST}
	if err := h.AddrAdd(lo, a); err != nil && !errors.Is(err, unix.EEXIST) {
		ns.Close()
		return nil, fmt.Errorf("adding %s to the workload's loopback device: %w", dockerrt.ReverseAddr, err)
	}
	return func(addr string) (net.Listener, error) { return listenInNS(ns, addr) }, nil
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
