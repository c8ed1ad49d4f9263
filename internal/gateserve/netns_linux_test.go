package gateserve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// clientNS is a client's network namespace, joined to the test's (the
// service's) by a veth pair: 100.77.K.1 on the service's end, the client at
// 100.77.K.2 (and .3, an address no tenant has). Like a workload on a
// Docker --internal network, it has one route: to its own subnet.
type clientNS struct {
	name   string
	gw     netip.Addr // the service's end
	addr   netip.Addr // the tenant's address
	stray  netip.Addr // an address in the same subnet that is no tenant's
	hostIf string
}

func newClientNS(t *testing.T, k int) *clientNS {
	t.Helper()
	pid := os.Getpid()
	c := &clientNS{
		name:   fmt.Sprintf("moat-gs-%d-%d", pid, k),
		hostIf: fmt.Sprintf("mgs%sx%d", strconv.FormatInt(int64(pid), 36), k),
		gw:     netip.AddrFrom4([4]byte{100, 77, byte(k), 1}),
		addr:   netip.AddrFrom4([4]byte{100, 77, byte(k), 2}),
		stray:  netip.AddrFrom4([4]byte{100, 77, byte(k), 3}),
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %q: %v: %s", args, err, out)
		}
	}
	removeStaleNS(t)
	if out, _ := exec.Command("ip", "route", "show", c.gw.String()+"/24").Output(); len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("100.77.%d.0/24 is routed already (%s): another test's namespace? remove it with ip netns del", k, strings.TrimSpace(string(out)))
	}
	run("netns", "add", c.name)
	t.Cleanup(func() {
		// The host's end first: a process that made a mount namespace
		// of its own while this one's name was mounted (any sandbox's
		// shim or keeper on the machine) keeps the namespace, and with
		// it the pair and its route, after ip netns del; deleting
		// either end of a veth deletes both.
		exec.Command("ip", "link", "del", c.hostIf).Run()
		if out, err := exec.Command("ip", "netns", "del", c.name).CombinedOutput(); err != nil {
			t.Errorf("removing namespace %s: %v: %s", c.name, err, out)
		}
	})
	run("link", "add", c.hostIf, "type", "veth", "peer", "name", "eth0", "netns", c.name)
	run("addr", "add", c.gw.String()+"/24", "dev", c.hostIf)
	run("link", "set", c.hostIf, "up")
	run("-n", c.name, "addr", "add", c.addr.String()+"/24", "dev", "eth0")
	run("-n", c.name, "addr", "add", c.stray.String()+"/24", "dev", "eth0")
	run("-n", c.name, "link", "set", "eth0", "up")
	run("-n", c.name, "link", "set", "lo", "up")
	return c
}

// removeStaleNS removes the namespaces and host links of test processes
// that died before their cleanups ran (moat-gs-<pid>-<k>, mgs<pid in base
// 36>x<k>): their routes would take the next run's packets. A pid counts
// as alive only while it is still this package's test binary: pids are
// reused, and a namespace left by a process whose pid another has now
// would otherwise stay for ever. A link outlives its namespace's name
// while some process still has the namespace open; deleting the host end
// takes the pair and its route.
func removeStaleNS(t *testing.T) {
	self, _ := os.ReadFile("/proc/self/comm")
	alive := func(pid string) bool {
		comm, err := os.ReadFile("/proc/" + pid + "/comm")
		return err == nil && string(comm) == string(self)
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "moat-gs-")
		if !ok {
			continue
		}
		pid, _, _ := strings.Cut(rest, "-")
		if alive(pid) {
			continue
		}
		if out, err := exec.Command("ip", "netns", "del", e.Name()).CombinedOutput(); err != nil {
			t.Logf("removing the leftover namespace %s: %v: %s", e.Name(), err, out)
		}
	}
	links, _ := os.ReadDir("/sys/class/net")
	for _, l := range links {
		rest, ok := strings.CutPrefix(l.Name(), "mgs")
		if !ok {
			continue
		}
		i := strings.LastIndexByte(rest, 'x') // a base-36 pid may hold an x; k does not
		if i <= 0 {
			continue
		}
		pid, err := strconv.ParseInt(rest[:i], 36, 64)
		if _, kerr := strconv.Atoi(rest[i+1:]); err != nil || kerr != nil || alive(strconv.FormatInt(pid, 10)) {
			continue
		}
		if out, err := exec.Command("ip", "link", "del", l.Name()).CombinedOutput(); err != nil {
			t.Logf("removing the leftover link %s: %v: %s", l.Name(), err, out)
		}
	}
}

// in runs fn on a thread inside the namespace: sockets fn creates stay
// there.
func (c *clientNS) in(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(home)
		target, err := unix.Open("/run/netns/"+c.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
			// Stays locked: Go discards the thread with the goroutine.
			errc <- errors.Join(ferr, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// dial connects from src (the tenant's address when invalid) inside the
// namespace.
func (c *clientNS) dial(ctx context.Context, network, addr string, src netip.Addr) (net.Conn, error) {
	if !src.IsValid() {
		src = c.addr
	}
	var conn net.Conn
	err := c.in(func() (err error) {
		d := &net.Dialer{Timeout: 5 * time.Second}
		switch network {
		case "udp", "udp4":
			d.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
		default:
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// query asks the service's DNS for name from src over proto.
func (c *clientNS) query(t *testing.T, proto, name string, qtype uint16, src netip.Addr) (*dns.Msg, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := c.dial(ctx, proto, netip.AddrPortFrom(c.gw, 53).String(), src)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	co := &dns.Conn{Conn: conn}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	return co.ReadMsg()
}

// resolve is what a client whose resolv.conf names the service does.
func (c *clientNS) resolve(t *testing.T, name string) (netip.Addr, error) {
	r, err := c.query(t, "udp", name, dns.TypeA, netip.Addr{})
	if err != nil {
		return netip.Addr{}, err
	}
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A.To4())
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%s: no address (%s)", name, dns.RcodeToString[r.Rcode])
}

// client is an HTTP client in the namespace that resolves through the
// service and trusts roots only.
func (c *clientNS) client(t *testing.T, roots *x509.CertPool) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				host, port, err := net.SplitHostPort(addr)
				if err != nil {
					return nil, err
				}
				ip, err := netip.ParseAddr(host)
				if err != nil {
					ip, err = c.resolve(t, host)
				}
				if err != nil {
					return nil, err
				}
				return c.dial(ctx, "tcp4", net.JoinHostPort(ip.String(), port), netip.Addr{})
			},
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			DisableKeepAlives: true,
			ForceAttemptHTTP2: false,
		},
	}
}
