package inet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// ipTimeout bounds one ip command: they take milliseconds; a hang means a wedged kernel
	// or lock, and the test should say so rather than sit until the package timeout.
	ipTimeout = 10 * time.Second
	// execTimeout bounds Exec, which runs arbitrary debugging tools.
	execTimeout = 60 * time.Second
	// lockPoll is how often a waiting Start retries the host lock.
	lockPoll = 100 * time.Millisecond
	// lockSpare is left between giving up on the lock and the test's deadline, so the failure
	// is reported by the test rather than by the package timeout's panic.
	lockSpare = 30 * time.Second
)

// lockHost takes the host-wide lock on lockPath and returns its release. flock belongs to the
// open file, so two Nets of one process exclude each other as two processes do, and the lock
// dies with the process, so a crashed run never blocks the next one. The file is opened
// close-on-exec: a daemon the test starts must not inherit the lock.
func lockHost(t testing.TB, ns string) (unlock func()) {
	t.Helper()
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatalf("inet: opening host lock: %v", err)
	}
	wait := 10 * time.Minute
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			wait = time.Until(dl) - lockSpare
		}
	}
	wait = max(wait, 10*time.Second)
	start := time.Now()
	deadline := start.Add(wait)
	logged := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			t.Fatalf("inet: locking %s: %v", lockPath, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			t.Fatalf("inet: gave up after %v waiting for %s, held by %s; only one Net may be live per host (a Net started while this test or its parent holds one waits forever: share it)",
				wait.Round(time.Second), lockPath, holder())
		}
		if !logged && time.Since(start) > time.Second { // by then the holder has written its name
			t.Logf("inet: waiting for %s, held by %s", lockPath, holder())
			logged = true
		}
		time.Sleep(lockPoll)
	}
	// Who holds it, for the message of whoever waits next.
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d, namespace %s, test %s\n", os.Getpid(), ns, t.Name())), 0)
	return func() { f.Close() } // closing the file drops the lock
}

func holder() string {
	b, err := os.ReadFile(lockPath)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return "an unknown process"
	}
	return string(bytes.TrimSpace(b))
}

// removeStale deletes namespaces and host links left by a Net whose process died before its
// cleanup ran. Only the lock holder calls it, and the lock holder owns the only live Net, so
// every name with our prefixes is a leftover.
func removeStale() error {
	var errs []error
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), nsPrefix) && exists("/run/netns/"+e.Name()) {
				errs = append(errs, ip("netns", "del", e.Name()))
			}
		}
	}
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, e := range ents {
			// Deleting one end of a veth pair deletes the other, which may be next in the list.
			if strings.HasPrefix(e.Name(), linkPrefix) && exists("/sys/class/net/"+e.Name()) {
				errs = append(errs, ip("link", "del", e.Name()))
			}
		}
	}
	return errors.Join(errs...)
}

// checkPrefixFree fails when something other than a Net already uses 198.51.100.0/24 on the
// host: adding our route would take it away from its owner.
func checkPrefixFree() error {
	p := Prefix.String()
	if out, err := ipOut("-4", "-o", "addr", "show", "to", p); err != nil {
		return err
	} else if len(out) > 0 {
		return fmt.Errorf("the host already has an address in %s; remove it or stop whatever owns it:\n%s", p, out)
	}
	if lines, err := routesCovering(p, ""); err != nil {
		return err
	} else if len(lines) > 0 {
		return fmt.Errorf("the host already routes %s:\n%s", p, strings.Join(lines, "\n"))
	}
	if out, err := ipOut("-4", "-o", "route", "show", "root", p); err != nil {
		return err
	} else if len(out) > 0 {
		return fmt.Errorf("the host already routes inside %s:\n%s", p, out)
	}
	return nil
}

// routesCovering lists the host's main-table routes that cover p, except default routes and
// routes through skipDev.
func routesCovering(p, skipDev string) ([]string, error) {
	out, err := ipOut("-4", "-o", "route", "show", "match", p)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l == "" || strings.HasPrefix(l, "default ") || (skipDev != "" && strings.Contains(l, " dev "+skipDev+" ")) {
			continue
		}
		lines = append(lines, l)
	}
	return lines, nil
}

// build creates the namespace and the veth pair and addresses both ends.
func (n *Net) build() error {
	steps := [][]string{
		{"netns", "add", n.NS},
		{"link", "add", n.HostIf, "type", "veth", "peer", "name", nsLink, "netns", n.NS},
		{"addr", "add", HostAddr.String() + "/24", "dev", n.HostIf},
		{"link", "set", n.HostIf, "up"},
		{"-n", n.NS, "link", "set", "lo", "up"},
		{"-n", n.NS, "addr", "add", NSAddr.String() + "/24", "dev", nsLink},
		{"-n", n.NS, "link", "set", nsLink, "up"},
	}
	for i, s := range steps {
		if i == 2 {
			// No IPv6 on the host end: nothing here uses it, and router solicitations and
			// link-local addresses would only be noise in captures. Missing when the host has
			// IPv6 off altogether, which is fine.
			_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+n.HostIf+"/disable_ipv6", []byte("1"), 0o644)
		}
		if err := ip(s...); err != nil {
			return err
		}
	}
	n.hosts[NSAddr] = true
	return nil
}

// addAddr puts addr on the namespace's veth end; outside the prefix it also routes addr/32 there.
func (n *Net) addAddr(addr netip.Addr) error {
	host := addr.String() + "/32"
	if !Prefix.Contains(addr) {
		lines, err := routesCovering(host, n.HostIf)
		if err != nil {
			return err
		}
		if len(lines) > 0 {
			return fmt.Errorf("the host already routes %s elsewhere; taking it would cut something off:\n%s", addr, strings.Join(lines, "\n"))
		}
	}
	if err := ip("-n", n.NS, "addr", "add", host, "dev", nsLink); err != nil {
		return err
	}
	if Prefix.Contains(addr) {
		return nil
	}
	return ip("route", "add", host, "dev", n.HostIf, "src", HostAddr.String())
}

// destroy deletes the host veth (which takes its peer and the /32 routes with it) and the
// namespace. Deleting the link first makes its removal synchronous: a namespace is destroyed
// by the kernel later, once nothing refers to it.
func (n *Net) destroy() error {
	var errs []error
	if exists("/sys/class/net/" + n.HostIf) {
		errs = append(errs, ip("link", "del", n.HostIf))
	}
	if exists("/run/netns/" + n.NS) {
		errs = append(errs, ip("netns", "del", n.NS))
	}
	if exists("/sys/class/net/" + n.HostIf) {
		errs = append(errs, fmt.Errorf("host link %s still present", n.HostIf))
	}
	if exists("/run/netns/" + n.NS) {
		errs = append(errs, fmt.Errorf("namespace %s still present", n.NS))
	}
	return errors.Join(errs...)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// inNS runs fn on an OS thread that is inside the namespace. Sockets fn creates belong to the
// namespace for good. The thread is handed back to the scheduler only after it is back in the
// host namespace; if that fails, its goroutine exits still locked and Go discards the thread.
func (n *Net) inNS(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening this thread's network namespace: %w", err)
			return
		}
		defer unix.Close(home)
		target, err := unix.Open("/run/netns/"+n.NS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening namespace %s: %w", n.NS, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread() // still at home
			errc <- fmt.Errorf("entering namespace %s: %w", n.NS, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
			// Stays locked: the goroutine ends and Go discards the thread with it.
			errc <- errors.Join(ferr, fmt.Errorf("returning to the host namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// listenTCP opens a TCP listener inside the namespace.
func (n *Net) listenTCP(ap netip.AddrPort) (net.Listener, error) {
	var l net.Listener
	err := n.inNS(func() (err error) {
		l, err = net.Listen("tcp4", ap.String())
		return err
	})
	return l, err
}

// listenUDP opens a UDP socket inside the namespace.
func (n *Net) listenUDP(ap netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := n.inNS(func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap))
		return err
	})
	return c, err
}

// Exec runs a command inside the namespace (ip netns exec) and returns its combined output.
// For debugging and for tools such as ss or tcpdump; it gives up after a minute.
func (n *Net) Exec(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), execTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NS}, args...)...).CombinedOutput()
	if ctx.Err() != nil {
		return out, fmt.Errorf("running %q in %s: gave up after %v", args, n.NS, execTimeout)
	}
	if err != nil {
		return out, fmt.Errorf("running %q in %s: %w", args, n.NS, err)
	}
	return out, nil
}

// ip runs one ip command.
func ip(args ...string) error {
	_, err := ipOut(args...)
	return err
}

func ipOut(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ipTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}
