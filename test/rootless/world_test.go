package rootless

// What TestRootlessMoat needs around the sandbox: the test internet the
// gate dials into (test/inet: a network namespace with its own DNS server
// that logs every question), servers on the host's loopback and LAN
// address that the guest must never reach, a terminal, and the scans that
// prove destroy left no mount, namespace or process behind.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"moat.dev/moat/internal/termtest"
	"moat.dev/moat/test/inet"
)

// The test internet's hosts and the sandbox's policy (moat.toml). A name
// rule never opens an internal address, so lan.test is allowed on purpose;
// denied.test has an answer and a server, so a leak would be seen.
const (
	allowedIP = "198.51.100.10" // allowed.test: the positive control
	upIP      = "198.51.100.20" // up.test: HTTPS, the bound secret's host
	deniedIP  = "198.51.100.66" // denied.test: no rule names it
	lanIP     = "10.1.2.3"      // lan.test: allowed by name, internal by address
	gatewayIP = "10.88.0.1"     // the guest's gateway: the host's side of tap0
	secretEnv = "ROOTLESS_TOKEN"
)

const worldToml = `[network]
use = ["none"]
allow = ["allowed.test", "up.test", "lan.test"]
trust = [%q]

[secrets.MOAT_TOKEN]
from = "env:` + secretEnv + `"
hosts = ["up.test"]
`

// world is the test internet and the host's servers around the sandbox.
type world struct {
	net              *inet.Net
	allowed, up, lan *inet.Server
	denied           *inet.Server
	loopback, lanIf  *hostSrv // on the host's 127.0.0.1 and its LAN address: never reached
	hostIP           string
	token            string // the secret's real value: only the host may hold it
}

// startWorld builds the test internet and writes the project's moat.toml
// and the test CA (which [network] trust names) into ws, as the user's.
func startWorld(t *testing.T, ws string, u *testUser) *world {
	t.Helper()
	n := inet.Start(t)
	w := &world{net: n, token: "rt" + randHex(t, 20)}
	w.allowed = n.HTTP(t, allowedIP, 80, nil)
	w.up = n.HTTPS(t, upIP, 443, []string{"up.test"}, inet.Echo())
	w.denied = n.HTTP(t, deniedIP, 80, nil)
	w.lan = n.HTTP(t, lanIP, 80, nil)
	for name, ip := range map[string]string{"allowed.test": allowedIP, "up.test": upIP, "denied.test": deniedIP, "lan.test": lanIP} {
		n.SetA(name, ip)
	}
	w.loopback = hostServer(t, "127.0.0.1", "host-loopback-must-not-be-reached")
	w.hostIP = hostLANAddr(t)
	w.lanIf = hostServer(t, w.hostIP, "host-lan-must-not-be-reached")
	ca := filepath.Join(ws, "ca.pem")
	toml := filepath.Join(ws, "moat.toml")
	writeOwned(t, ca, n.CA().PEM, u)
	writeOwned(t, toml, []byte(fmt.Sprintf(worldToml, ca)), u)
	return w
}

// env is what each moat command gets besides PATH and HOME: the gate's
// resolver is the test DNS server, and the secret's value is in the
// environment the env: source reads.
func (w *world) env() []string {
	return []string{"MOAT_UPSTREAM_DNS=" + inet.DNSAddr.String(), secretEnv + "=" + w.token}
}

func writeOwned(t *testing.T, path string, data []byte, u *testUser) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, int(u.uid), int(u.gid)); err != nil {
		t.Fatal(err)
	}
}

func randHex(t *testing.T, k int) string {
	t.Helper()
	b := make([]byte, k)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// hostLANAddr is the host's own IPv4 address on a real interface: the
// gate, in the host's network namespace, could reach it.
func hostLANAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() || inet.Prefix.Contains(p.Addr()) {
			continue
		}
		return p.Addr().String()
	}
	t.Fatal("the host has no IPv4 address besides loopback and the test internet's")
	return ""
}

type hostSrv struct {
	port    int
	accepts atomic.Int64
}

// hostServer listens on ip in the host's namespace and answers each
// connection with line.
func hostServer(t *testing.T, ip, line string) *hostSrv {
	t.Helper()
	ln, err := net.Listen("tcp4", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &hostSrv{port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepts.Add(1)
			c.Write([]byte(line + "\n"))
			c.Close()
		}
	}()
	return s
}

// freePort is a loopback port nothing listens on just now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// fields parses the "KEY=value" lines a guest script printed.
func fields(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && k != "" && !strings.ContainsAny(k, " \t") {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// ---- a terminal -------------------------------------------------------------------------

// terminal is a pty whose slave belongs to the user, as login makes it.
type terminal struct {
	f *os.File
	*termtest.Screen
}

// startTerminal starts cmd (already set up with the user's credentials)
// as the session leader of a new terminal of its own.
func startTerminal(t *testing.T, cmd *exec.Cmd, u *testUser) *terminal {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	if err := os.Chown(tty.Name(), int(u.uid), int(u.gid)); err != nil {
		t.Fatal(err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 24, Cols: 80}); err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
	if err := cmd.Start(); err != nil {
		ptmx.Close()
		t.Fatal(err)
	}
	term := &terminal{f: ptmx, Screen: termtest.Read(ptmx)}
	return term
}

// ---- what destroy must leave: nothing -----------------------------------------------------

var nsKinds = []string{"cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts"}

// sandboxNamespaces are the namespaces the processes of the test user and
// its subordinate ids are in, but for the host's own (the daemon lives in
// the host's): "net:[4026532301]".
func (h *host) sandboxNamespaces() map[string]bool {
	ids := map[string]bool{}
	for _, p := range h.procs("") {
		for _, k := range nsKinds {
			id, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", p.pid, k))
			if self, _ := os.Readlink("/proc/self/ns/" + k); err == nil && id != self {
				ids[id] = true
			}
		}
	}
	return ids
}

// nsHolders are the places that still hold one of ids: a thread in it, an
// open file descriptor of it, or an nsfs bind mount of it.
func nsHolders(ids map[string]bool) []string {
	var out []string
	for _, pid := range pids() {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, task := range tasks {
			for _, k := range nsKinds {
				if id, _ := os.Readlink(fmt.Sprintf("/proc/%d/task/%s/ns/%s", pid, task.Name(), k)); ids[id] {
					out = append(out, fmt.Sprintf("pid %d task %s is in %s", pid, task.Name(), id))
				}
			}
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			if id, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); ids[id] {
				out = append(out, fmt.Sprintf("pid %d holds fd %s of %s", pid, fd.Name(), id))
			}
		}
	}
	for _, m := range mountLines(func(f []string) bool {
		// mountinfo: ID PARENT MAJ:MIN ROOT POINT ...; an nsfs mount's ROOT is the namespace.
		return len(f) > 4 && ids[f[3]]
	}) {
		out = append(out, "an nsfs mount: "+m)
	}
	return out
}

// mountsUnder are the mounts, in every mount namespace on the host, whose
// mount point is at or below dir.
func mountsUnder(dir string) []string {
	return mountLines(func(f []string) bool {
		return len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/"))
	})
}

// mountLines are the mountinfo lines of every mount namespace that ok
// selects, each prefixed with a pid in that namespace.
func mountLines(ok func(fields []string) bool) []string {
	var out []string
	seen := map[string]bool{}
	for _, pid := range pids() {
		// One reading per mount namespace and root: mountinfo shows the
		// mounts a process can see from its own root.
		mnt, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		root, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", pid))
		if err != nil || seen[mnt+root] {
			continue
		}
		seen[mnt+root] = true
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		for _, l := range strings.Split(string(b), "\n") {
			if ok(strings.Fields(l)) {
				out = append(out, fmt.Sprintf("pid %d (%s): %s", pid, mnt, l))
			}
		}
	}
	return out
}

func pids() []int {
	dirs, _ := os.ReadDir("/proc")
	var out []int
	for _, d := range dirs {
		if pid, err := strconv.Atoi(d.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// ---- running moat as the user ---------------------------------------------------------------

// moatUser runs the moat binary as the test user, exactly as that user
// would type it, with no sudo.
type moatUser struct {
	h    *host
	bin  string
	home string
	env  []string
}

func (m *moatUser) command(ctx context.Context, dir string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, m.bin, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + m.home, "MOAT_HOME=" + m.home, "MOAT_RUNSC=" + m.h.runsc}, m.env...)
	u := m.h.user
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: []uint32{}}}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}
