// Command cniprobe is the image the cluster's moat-cni test runs
// (test/cluster/cni_test.go), a static binary imported into containerd:
//
//	cniprobe serve                 TCP "ok" on 8080, 8443 and 8053, UDP echo on 8053
//	cniprobe probe tcp:ADDR udp:ADDR tcp:ADDR@SRC ...
//
// probe tries each target at once, prints one JSON line per target
// ({"target", "ok", "err"}) and then "probe: done", and exits 0: the test
// reads the verdicts from the pod's log. A TCP target is reached when its
// handshake completes (the API server, speaking TLS, sends nothing
// first), a UDP one when the server's echo arrives. With @SRC the probe
// first adds SRC to eth0 (what root in the guest can do with NET_ADMIN)
// and sends from it.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
)

// probeTimeout bounds each target: long enough for a gVisor pod's first
// ARP and a Service's DNAT, short enough that a dropped SYN fails fast.
const probeTimeout = 4 * time.Second

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cniprobe serve | cniprobe probe tcp:ADDR|udp:ADDR ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve()
	case "probe":
		probe(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "cniprobe: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

func serve() {
	for _, p := range []string{":8080", ":8443", ":8053"} {
		l, err := net.Listen("tcp", p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cniprobe:", err)
			os.Exit(1)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Printf("serve: tcp %s from %s\n", p, c.RemoteAddr())
				c.Write([]byte("ok\n"))
				c.Close()
			}
		}()
	}
	pc, err := net.ListenPacket("udp", ":8053")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cniprobe:", err)
		os.Exit(1)
	}
	fmt.Println("serve: ready")
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			os.Exit(1)
		}
		fmt.Printf("serve: udp :8053 from %s\n", from)
		pc.WriteTo(buf[:n], from)
	}
}

type verdict struct {
	Target string `json:"target"`
	OK     bool   `json:"ok"`
	Err    string `json:"err,omitempty"`
}

func probe(targets []string) {
	out := make([]verdict, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = verdict{Target: t}
			if err := reach(t); err != nil {
				out[i].Err = err.Error()
			} else {
				out[i].OK = true
			}
		}()
	}
	wg.Wait()
	enc := json.NewEncoder(os.Stdout)
	for _, v := range out {
		enc.Encode(v)
	}
	fmt.Println("probe: done")
}

func reach(target string) error {
	network, rest, ok := strings.Cut(target, ":")
	if !ok || (network != "tcp" && network != "udp") {
		return fmt.Errorf("target %q: want tcp:ADDR or udp:ADDR", target)
	}
	addr, src, spoof := strings.Cut(rest, "@")
	d := net.Dialer{Timeout: probeTimeout}
	if spoof {
		ip := net.ParseIP(src)
		if ip == nil {
			return fmt.Errorf("target %q: %q is not an address", target, src)
		}
		if err := addAddr(ip); err != nil {
			return fmt.Errorf("setup: adding %s to eth0: %w", src, err)
		}
		if network == "tcp" {
			d.LocalAddr = &net.TCPAddr{IP: ip}
		} else {
			d.LocalAddr = &net.UDPAddr{IP: ip}
		}
	}
	deadline := time.Now().Add(probeTimeout)
	c, err := d.Dial(network, addr)
	// "No route to host" is gVisor's netstack giving up on the pod's
	// first ARP for its gateway (three tries), which a loaded node can
	// outlast; it is no verdict of the fence, which drops (a time-out).
	// Dialled again while the ARP settles, a fenced target still times
	// out and an open one answers.
	for settle := time.Now().Add(3 * probeTimeout); errors.Is(err, syscall.EHOSTUNREACH) && time.Now().Before(settle); {
		time.Sleep(250 * time.Millisecond)
		deadline = time.Now().Add(probeTimeout)
		c, err = d.Dial(network, addr)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	if network == "tcp" {
		return nil
	}
	// Sent again every half second, as a resolver retries: a datagram
	// may be lost while the pod's first ARP resolves.
	buf := make([]byte, 16)
	for {
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		next := time.Now().Add(500 * time.Millisecond)
		if next.After(deadline) {
			next = deadline
		}
		c.SetReadDeadline(next)
		_, err := c.Read(buf)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

var addrMu sync.Mutex

// addAddr puts ip on eth0 beside the pod's own address, once.
func addAddr(ip net.IP) error {
	addrMu.Lock()
	defer addrMu.Unlock()
	link, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	err = netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}})
	if errors.Is(err, syscall.EEXIST) {
		return nil
	}
	return err
}
