//go:build amd64 || arm64

package lockdown_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"moat.dev/moat/internal/lockdown"
	"moat.dev/moat/internal/lockdown/escape"
	"moat.dev/moat/internal/netstack"
)

// helperEnv carries the helper's instructions (JSON helperSpec) to the
// re-executed test binary.
const helperEnv = "MOAT_LOCKDOWN_HELPER"

// throwawayBase is the start of a uid range no /etc/passwd or /etc/subuid
// here uses; the test adds its pid so parallel runs do not share a uid.
const throwawayBase = 1879048192

type helperSpec struct {
	Config     lockdown.Config
	Writable   string // a directory in Config.Binds, writable
	ReadOnly   string // a file in Config.Binds, read-only
	Targets    escape.Targets
	PreThreads int // threads locked before Apply
	// NoMountSetattr takes the path for kernels before 5.12.
	NoMountSetattr bool
	// LeakDir is a directory the child holds open across Apply.
	LeakDir string
	// Canary replaces the escape attempts with one harmless refused
	// call, getpgid, so the kernel log shows refusals are logged.
	Canary bool
}

type helperReport struct {
	ApplyErr    string
	Root        []string // names in / after Apply
	WriteErr    string   // work in the writable bind
	ReadOnlyErr string   // writing the read-only file (want an error)
	ReadBack    string   // the read-only file's content
	TLSErr      string
	UDPErr      string
	NetstackErr string
	Escapes     []struct{ Name, Err string }
	Echo        string // address of the echo server
}

// TestHelperProcess is the jailed child, not a test.
func TestHelperProcess(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		t.Skip("the child of TestJail; runs only when re-executed by it")
	}
	var spec helperSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "helper spec:", err)
		os.Exit(2)
	}
	os.Exit(runHelper(spec))
}

func runHelper(spec helperSpec) int {
	out := json.NewEncoder(os.Stdout)
	var rep helperReport
	// Threads that exist before Apply must be jailed too.
	park := make(chan struct{})
	var locked sync.WaitGroup
	pin := func(n int) {
		for range n {
			locked.Add(1)
			go func() { runtime.LockOSThread(); locked.Done(); <-park }()
		}
		locked.Wait()
	}
	pin(spec.PreThreads)
	// The TAP stand-in, made before Apply as the parent will hand the
	// real TAP fd over: socketpair is refused after.
	tap, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		rep.ApplyErr = "socketpair: " + err.Error()
		out.Encode(rep)
		return 1
	}
	if spec.LeakDir != "" {
		d, err := os.Open(spec.LeakDir)
		if err != nil {
			rep.ApplyErr = "opening the leak: " + err.Error()
			out.Encode(rep)
			return 1
		}
		defer d.Close()
	}
	lockdown.SetNoMountSetattr(spec.NoMountSetattr)
	if err := lockdown.Apply(spec.Config); err != nil {
		rep.ApplyErr = err.Error()
		out.Encode(rep)
		return 1
	}
	// And so must threads made after: these pin new OS threads.
	pin(4)
	if ents, err := os.ReadDir("/"); err == nil {
		for _, e := range ents {
			rep.Root = append(rep.Root, e.Name())
		}
	}
	rep.WriteErr = errString(useWritable(spec.Writable))
	rep.ReadOnlyErr = errString(os.WriteFile(spec.ReadOnly, []byte("changed"), 0o644))
	if b, err := os.ReadFile(spec.ReadOnly); err == nil {
		rep.ReadBack = string(b)
	}
	rep.TLSErr = errString(tlsRoundTrip())
	rep.UDPErr = errString(udpRoundTrip())
	rep.NetstackErr = errString(netstackRoundTrip(tap))
	if spec.Canary {
		unix.Syscall(unix.SYS_GETPGID, 0, 0, 0)
	} else {
		for _, r := range escape.Attempts(spec.Targets) {
			rep.Escapes = append(rep.Escapes, struct{ Name, Err string }{r.Name, errString(r.Err)})
		}
	}
	runtime.GC() // the collector's madvise and friends, under the filter
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		rep.Echo = "listen: " + err.Error()
		out.Encode(rep)
		return 1
	}
	rep.Echo = ln.Addr().String()
	out.Encode(rep)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	// Serve until the parent closes stdin, or give up after a while so a
	// lost parent does not leave the child behind.
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
	}
	return 0
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// useWritable does what a gate does with its state directory.
func useWritable(dir string) error {
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(sub, "a.tmp"))
	if err != nil {
		return err
	}
	if _, err := f.WriteString("audit line\n"); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(sub, "a.tmp"), filepath.Join(sub, "a")); err != nil {
		return err
	}
	if ents, err := os.ReadDir(sub); err != nil || len(ents) != 1 {
		return fmt.Errorf("reading back %s: %d entries, %v", sub, len(ents), err)
	}
	return os.RemoveAll(sub)
}

// tlsRoundTrip makes a key, a certificate and a TLS 1.3 connection to
// itself over loopback: the crypto and socket paths the gate takes.
func tlsRoundTrip() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"jail.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{RootCAs: pool, ServerName: "jail.test"}}
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		return fmt.Errorf("echo over TLS: %q, %v", b, err)
	}
	return nil
}

// udpRoundTrip sends a datagram to itself over loopback, as the gate's DNS
// forwarding does upstream.
func udpRoundTrip() error {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer pc.Close()
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("q")); err != nil {
		return err
	}
	pc.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 8)
	n, _, err := pc.ReadFrom(b)
	if err != nil || string(b[:n]) != "q" {
		return fmt.Errorf("datagram: %q, %v", b[:n], err)
	}
	return nil
}

// netstackRoundTrip runs the gate's netstack on one end of tap and a
// guest's gVisor stack (fdbased, as runsc's) on the other, and moves 1 MiB
// each way over a connection the gateway opens to the guest: the TAP
// reader, writev, the stacks' timers and goroutines, all under the filter.
func netstackRoundTrip(tap [2]int) error {
	gw, err := netstack.New(netstack.Options{TAPFD: tap[0], Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer gw.Close()
	ep, err := fdbased.New(&fdbased.Options{
		FDs: []int{tap[1]}, MTU: netstack.MTU, EthernetHeader: true, Address: tcpip.LinkAddress("\x02\x00\x00\x00\x00\x02"),
		RXChecksumOffload: true, TXChecksumOffload: true,
	})
	if err != nil {
		return err
	}
	guest := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol},
	})
	defer func() { guest.Close(); guest.Wait() }()
	if e := guest.CreateNIC(1, ep); e != nil {
		return fmt.Errorf("guest NIC: %v", e)
	}
	if e := guest.AddProtocolAddress(1, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(netstack.Guest.As4()), PrefixLen: netstack.PrefixLen},
	}, stack.AddressProperties{}); e != nil {
		return fmt.Errorf("guest address: %v", e)
	}
	sub, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{}), tcpip.MaskFromBytes(make([]byte, 4)))
	guest.SetRouteTable([]tcpip.Route{{Destination: sub, Gateway: tcpip.AddrFrom4(netstack.Gateway.As4()), NIC: 1}})
	guest.AddStaticNeighbor(1, ipv4.ProtocolNumber, tcpip.AddrFrom4(netstack.Gateway.As4()), netstack.GatewayMAC)
	ln, err := gonet.ListenTCP(guest, tcpip.FullAddress{NIC: 1, Port: 22}, ipv4.ProtocolNumber)
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := gw.DialGuest(ctx, 22)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	data := make([]byte, 1<<20)
	rand.Read(data)
	go func() {
		c.Write(data)
		c.(*gonet.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("echoed %d bytes, want the %d sent", len(got), len(data))
	}
	return nil
}

func TestJail(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to build the jail (mount namespace, pivot_root, setuid); run as root, as CI does")
	}
	bin := helperBinary(t)
	// First: the kernel rate-limits the records it reads, and the escape
	// attempts below make many.
	t.Run("refuses nothing the work needs", func(t *testing.T) {
		uid := throwawayBase + os.Getpid()%65536
		writable := t.TempDir()
		if err := os.Chown(writable, uid, uid); err != nil {
			t.Fatal(err)
		}
		cmd, rep := startHelper(t, bin, helperSpec{
			Config:   lockdown.Config{UID: uid, GID: uid, NoFile: 256, Binds: []lockdown.Bind{{Path: writable, Writable: true}}},
			Writable: writable,
			Canary:   true,
		})
		if rep.ApplyErr != "" || rep.WriteErr != "" || rep.TLSErr != "" || rep.UDPErr != "" || rep.NetstackErr != "" {
			t.Fatalf("helper: %+v", rep)
		}
		got := refusalsLogged(t, cmd.Process.Pid)
		if len(got) == 0 {
			t.Skip("the kernel log shows no seccomp record for the canary (an audit daemon takes them, or the log is unreadable); nothing to check here")
		}
		// Besides the canary, Go's one MPTCP probe (socket) at the first
		// Listen, refused as a kernel without MPTCP would.
		var others []int
		canaries, probes := 0, 0
		for _, nr := range got {
			switch nr {
			case unix.SYS_GETPGID:
				canaries++
			case unix.SYS_SOCKET:
				probes++
			default:
				others = append(others, nr)
			}
		}
		if canaries != 1 || probes > 1 || len(others) > 0 {
			t.Fatalf("kernel logged refused system calls %v, want the canary %d once and at most one socket: the work needed a call the table lacks", got, unix.SYS_GETPGID)
		}
	})
	t.Run("mount_setattr", func(t *testing.T) { testJail(t, bin, false) })
	t.Run("remount for kernels before 5.12", func(t *testing.T) { testJail(t, bin, true) })
	t.Run("refuses an open directory", func(t *testing.T) {
		uid := throwawayBase + os.Getpid()%65536
		_, rep := startHelper(t, bin, helperSpec{
			Config:  lockdown.Config{UID: uid, GID: uid, NoFile: 64},
			LeakDir: t.TempDir(),
		})
		if !strings.Contains(rep.ApplyErr, "open directory") {
			t.Fatalf("Apply with a directory fd open: got %q, want a refusal naming it", rep.ApplyErr)
		}
	})
	t.Run("keeps the parent-death signal", func(t *testing.T) {
		uid := throwawayBase + os.Getpid()%65536
		spec := helperSpec{Config: lockdown.Config{UID: uid, GID: uid, NoFile: 64, ParentDeathSignal: syscall.SIGKILL}}
		// Pdeathsig watches the thread that started the child: start
		// keeps its thread locked and ends it on release by returning
		// locked. Go never ends the main thread, so a start that lands
		// there holds it and hands over to another.
		release := make(chan struct{})
		launched := make(chan *helper, 1)
		var start func()
		start = func() {
			runtime.LockOSThread()
			if syscall.Gettid() == os.Getpid() {
				go start()
				<-release
				runtime.UnlockOSThread()
				return
			}
			h, err := launch(bin, spec, syscall.SIGKILL)
			if err != nil {
				t.Error(err)
			}
			launched <- h
			<-release
		}
		go start()
		h := <-launched
		if h == nil {
			close(release)
			return
		}
		defer h.cancel()
		defer h.stdin.Close()
		if err := h.readReport(); err != nil || h.rep.ApplyErr != "" {
			close(release)
			t.Fatalf("report %v, Apply %q", err, h.rep.ApplyErr)
		}
		close(release)
		exited := make(chan error, 1)
		go func() { exited <- h.cmd.Wait() }()
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("jailed child ended with %v, want killed by its parent-death signal", err)
			}
		case <-time.After(10 * time.Second):
			h.stdin.Close()
			<-exited
			t.Fatal("jailed child outlived the thread that started it: its parent-death signal was lost")
		}
	})
	t.Run("refuses its parent's mount namespace", func(t *testing.T) {
		// The helper's parent is a shell in a namespace unshare(1) made:
		// were the refusal broken, only that namespace would be pivoted,
		// not the host's.
		unshare, err := exec.LookPath("unshare")
		if err != nil {
			t.Skip("needs unshare(1) from util-linux to give the helper a parent in its namespace")
		}
		uid := throwawayBase + os.Getpid()%65536
		_, rep := startHelper(t, bin, helperSpec{Config: lockdown.Config{UID: uid, GID: uid, NoFile: 64}},
			unshare, "--mount", "--propagation", "private", "--fork", "sh", "-c", `"$@"; exit $?`, "sh")
		if !strings.Contains(rep.ApplyErr, "mount namespace") {
			t.Fatalf("Apply in its parent's mount namespace: got %q, want a refusal", rep.ApplyErr)
		}
	})
}

// testJail runs the helper binary jailed and checks it from outside.
func testJail(t *testing.T, bin string, noMountSetattr bool) {
	uid := throwawayBase + os.Getpid()%65536
	gid := uid

	writable := t.TempDir()
	if err := os.Chown(writable, uid, gid); err != nil {
		t.Fatal(err)
	}
	roDir := t.TempDir()
	readOnly := filepath.Join(roDir, "config")
	if err := os.WriteFile(readOnly, []byte("original"), 0o666); err != nil {
		t.Fatal(err)
	}
	// World-writable, past the umask: only the read-only mount stops the
	// jailed uid.
	if err := os.Chmod(readOnly, 0o666); err != nil {
		t.Fatal(err)
	}
	// A file and a socket outside the binds that the uid could reach
	// without the jail (world-readable, world-connectable in a
	// world-searchable directory): only the jail can refuse them.
	outside, err := os.MkdirTemp("", "lockdown-outside-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outside) })
	os.Chmod(outside, 0o777)
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(outside, "control.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	os.Chmod(sock, 0o777)
	connected := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case connected <- struct{}{}:
			default:
			}
		}
	}()

	spec := helperSpec{
		Config: lockdown.Config{
			UID: uid, GID: gid, NoFile: 256,
			Binds: []lockdown.Bind{{Path: writable, Writable: true}, {Path: readOnly}},
		},
		Writable: writable,
		ReadOnly: readOnly,
		Targets: escape.Targets{
			ReadFiles:   []string{"/etc/shadow", "/etc/passwd", secret},
			WriteDirs:   []string{"/", "/usr", "/tmp", outside},
			UnixSockets: []string{sock},
			PIDs:        []int{os.Getpid()},
			Execs:       []string{"/bin/true", os.Args[0]},
		},
		PreThreads:     4,
		NoMountSetattr: noMountSetattr,
	}
	cmd, rep := startHelper(t, bin, spec)
	if rep.ApplyErr != "" {
		t.Fatalf("Apply: %s", rep.ApplyErr)
	}

	// From outside, as the daemon will: every thread jailed.
	if err := lockdown.Verify(cmd.Process.Pid, spec.Config); err != nil {
		t.Error(err)
	}
	if n := threads(t, cmd.Process.Pid); n < 1+spec.PreThreads+4 {
		t.Errorf("child has %d threads, want at least %d: the thread checks prove less than they should", n, 1+spec.PreThreads+4)
	}

	checkBindFlags(t, cmd.Process.Pid, spec.Config.Binds)

	// The root holds only the binds' top directory.
	wantRoot := topDirs(writable, readOnly)
	if !slices.Equal(rep.Root, wantRoot) {
		t.Errorf("jail root holds %v, want %v", rep.Root, wantRoot)
	}
	if rep.WriteErr != "" {
		t.Errorf("working in the writable bind: %s", rep.WriteErr)
	}
	if rep.ReadOnlyErr == "" {
		t.Error("writing the read-only bind succeeded")
	}
	if rep.ReadBack != "original" {
		t.Errorf("read-only bind reads %q, want %q", rep.ReadBack, "original")
	}
	if b, _ := os.ReadFile(readOnly); string(b) != "original" {
		t.Errorf("read-only file on the host is now %q", b)
	}
	if rep.TLSErr != "" {
		t.Errorf("TLS in the jail: %s", rep.TLSErr)
	}
	if rep.UDPErr != "" {
		t.Errorf("UDP in the jail: %s", rep.UDPErr)
	}
	if rep.NetstackErr != "" {
		t.Errorf("the gate's netstack in the jail: %s", rep.NetstackErr)
	}
	if len(rep.Escapes) < 20 {
		t.Errorf("only %d escape attempts reported", len(rep.Escapes))
	}
	for _, e := range rep.Escapes {
		if e.Err == "" {
			t.Errorf("escape attempt %q succeeded", e.Name)
		} else {
			t.Logf("%-40s refused: %s", e.Name, e.Err)
		}
	}
	select {
	case <-connected:
		t.Error("the control socket outside the jail accepted a connection from it")
	default:
	}

	// Still serving after all those refusals.
	c, err := net.DialTimeout("tcp", rep.Echo, 5*time.Second)
	if err != nil {
		t.Fatalf("dialing the jailed echo server at %q: %v", rep.Echo, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, len("still here"))
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "still here" {
		t.Errorf("echo from the jail: %q, %v", b, err)
	}
}

// startHelper starts the helper in a mount namespace of its own and reads
// its report; the child serves until the test ends.
func startHelper(t *testing.T, bin string, spec helperSpec, wrap ...string) (*exec.Cmd, helperReport) {
	t.Helper()
	h, err := launch(bin, spec, 0, wrap...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.stdin.Close()
		if err := h.cmd.Wait(); err != nil && h.rep.ApplyErr == "" {
			t.Errorf("child: %v", err)
		}
		h.cancel()
	})
	if err := h.readReport(); err != nil {
		t.Fatal(err)
	}
	return h.cmd, h.rep
}

// helper is a started helper process.
type helper struct {
	cmd    *exec.Cmd
	stdin  io.Closer
	stdout *bufio.Reader
	cancel context.CancelFunc
	rep    helperReport
}

// launch starts the helper, under the wrap command if any, with a
// parent-death signal if pdeath is non-zero. It does not touch a
// testing.T, so a goroutine may call it.
func launch(bin string, spec helperSpec, pdeath syscall.Signal, wrap ...string) (*helper, error) {
	raw, _ := json.Marshal(spec)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	argv := append(wrap, bin, "-test.run=^TestHelperProcess$", "-test.v=false")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: pdeath}
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	return &helper{cmd: cmd, stdin: stdin, stdout: bufio.NewReader(stdout), cancel: cancel}, nil
}

// readReport reads the helper's one-line report.
func (h *helper) readReport() error {
	line, err := h.stdout.ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the child's report: %v (did an exec replace it?)", err)
	}
	if err := json.Unmarshal([]byte(line), &h.rep); err != nil {
		return fmt.Errorf("child report %q: %v", line, err)
	}
	return nil
}

// refusalsLogged reads the kernel log for the seccomp records (audit type
// 1326) of process pid and returns the system call numbers, in order.
func refusalsLogged(t *testing.T, pid int) []int {
	t.Helper()
	// Raw reads: os.File would park a non-blocking fd in the poller
	// instead of returning EAGAIN at the end of the log.
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	var nrs []int
	buf := make([]byte, 8192)
	tag := fmt.Sprintf(" pid=%d ", pid)
	for range 1 << 20 { // the log holds far fewer records
		n, err := unix.Read(fd, buf)
		if err == unix.EPIPE {
			continue // records overwritten while reading
		}
		if err != nil || n <= 0 {
			break // EAGAIN: the end
		}
		rec := string(buf[:n])
		if !strings.Contains(rec, "type=1326") || !strings.Contains(rec, tag) {
			continue
		}
		var nr int
		if i := strings.Index(rec, " syscall="); i >= 0 {
			fmt.Sscanf(rec[i:], " syscall=%d", &nr)
			nrs = append(nrs, nr)
		}
	}
	return nrs
}

// checkBindFlags reads the child's mounts: each bind nosuid, nodev,
// noexec, and read-only unless writable.
func checkBindFlags(t *testing.T, pid int, binds []lockdown.Bind) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 5 {
			opts[f[4]] = strings.Split(f[5], ",")
		}
	}
	for _, bd := range binds {
		got, ok := opts[bd.Path]
		if !ok {
			t.Errorf("bind %s is not a mount in the jail; mounts: %v", bd.Path, opts)
			continue
		}
		want := []string{"nosuid", "nodev", "noexec", "ro"}
		if bd.Writable {
			want[3] = "rw"
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("bind %s mounted %v, want %s", bd.Path, got, w)
			}
		}
	}
}

// helperBinary is this test binary, or when it was built with cgo (which
// Apply refuses: go test's default where a C compiler exists) the same
// tests built with CGO_ENABLED=0, as moat itself is.
func helperBinary(t *testing.T) string {
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_GETPID, 0, 0, 0); errno != syscall.ENOTSUP {
		return os.Args[0]
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "lockdown.test")
	build := exec.Command(goTool, "test", "-c", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the helper without cgo: %v\n%s", err, out)
	}
	return bin
}

func threads(t *testing.T, pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// topDirs are the names in / of a jail holding paths.
func topDirs(paths ...string) []string {
	seen := map[string]bool{}
	for _, p := range paths {
		seen[strings.SplitN(strings.TrimPrefix(p, "/"), "/", 2)[0]] = true
	}
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
