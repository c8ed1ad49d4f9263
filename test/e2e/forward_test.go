package e2e

// Port forwards both ways through the real CLI, daemon, netstack and
// guest: a server in the guest reached from the host through `moat forward add` without a
// restart, closed by `remove`, listening on 127.0.0.1 only; a server on the host's 127.0.0.1
// reached from the guest only on the listed reverse port, any other gateway port refused and
// audited. Everything talks to loopback or to the sandbox's own netstack.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const (
	fwdGuestPort   = 8123 // python3 -m http.server in the guest
	fwdGatewayPort = 5544 // the reverse forward's port at the gateway
)

func TestForward(t *testing.T) {
	name := "fwd-e2e"
	dir := project(t, name)
	os.Chmod(dir, 0o777)
	marker := "moat-forward-" + randHex(t, 8)
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte(marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgPort := freePort(t)
	toml := fmt.Sprintf("[network]\nuse = [\"none\"]\n\n[forwards]\nports = [\"%d:%d\"]\n", cfgPort, fwdGuestPort)
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	mustMoat(t, dir, "up")
	stateDir := filepath.Join(moatHome, "state", "sandboxes", name)

	hostPort := freePort(t)
	startGuestServer(t, dir)

	t.Run("config_forward_starts_with_the_sandbox", func(t *testing.T) {
		if got := httpGet(t, cfgPort); got != marker {
			t.Fatalf("through the configuration's forward got %q, want %q", got, marker)
		}
	})

	t.Run("add_reaches_the_guest_live", func(t *testing.T) {
		if _, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(hostPort), time.Second); err == nil {
			t.Fatalf("host port %d answers before the forward exists", hostPort)
		}
		r := moat(t, dir, nil, "forward", "add", name, fmt.Sprintf("%d:%d", hostPort, fwdGuestPort))
		if r.code != 0 || !strings.Contains(r.stderr, fmt.Sprintf("127.0.0.1:%d → guest port %d", hostPort, fwdGuestPort)) {
			t.Fatalf("forward add: exit %d, stderr %q", r.code, r.stderr)
		}
		if got := httpGet(t, hostPort); got != marker {
			t.Fatalf("through the forward got %q, want %q", got, marker)
		}
		if got := listenAddrs(t, hostPort); strings.Join(got, " ") != "127.0.0.1" {
			t.Fatalf("host port %d is listened on at %v, want 127.0.0.1 only", hostPort, got)
		}
	})

	t.Run("list", func(t *testing.T) {
		out := mustMoat(t, dir, "forward", "list", name)
		for _, want := range []string{
			fmt.Sprintf("host 127.0.0.1:%d", cfgPort), fmt.Sprintf("host 127.0.0.1:%d", hostPort),
			fmt.Sprintf("guest port %d", fwdGuestPort), "config", "runtime", "listening",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("forward list lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("port_in_use_is_a_clear_error", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		busy := ln.Addr().(*net.TCPAddr).Port
		r := moat(t, dir, nil, "forward", "add", name, fmt.Sprintf("%d:80", busy))
		if r.code == 0 || !strings.Contains(r.stderr, fmt.Sprintf("host port %d is already in use", busy)) || !strings.Contains(r.stderr, "moat forward add") {
			t.Fatalf("forward add on a busy port: exit %d, stderr %q; want an error naming the port and what to do", r.code, r.stderr)
		}
		if out := mustMoat(t, dir, "forward", "list", name); strings.Contains(out, strconv.Itoa(busy)) {
			t.Errorf("the failed forward was kept:\n%s", out)
		}
	})

	// The host's servers: one the reverse forward names, one it does not.
	served := hostServer(t, "moat-reverse-ok")
	other := hostServer(t, "must-not-be-reached")
	t.Run("reverse_reaches_only_the_listed_port", func(t *testing.T) {
		mustMoat(t, dir, "forward", "add", "--reverse", name, fmt.Sprintf("%d:%d", served.port, fwdGatewayPort))
		mark := len(readAudit(t, stateDir))
		got := guestConnect(t, dir, fwdGatewayPort, other.port, served.port)
		want := []string{
			fmt.Sprintf("%d OK moat-reverse-ok", fwdGatewayPort),
			fmt.Sprintf("%d refused", other.port),
			fmt.Sprintf("%d refused", served.port), // the host side's number is not a gateway port
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("from the guest got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if n := other.accepts.Load(); n != 0 {
			t.Fatalf("the unlisted host port accepted %d connections", n)
		}
		for _, port := range []int{other.port, served.port} {
			dst := fmt.Sprintf("%s:%d", gatewayIP, port)
			recs := waitAudit(t, stateDir, mark, func(r auditRec) bool { return r.Dst == dst && r.Verdict == "deny" })
			if len(recs) != 1 || recs[0].Proto != "tcp" || !strings.Contains(recs[0].Reason, fmt.Sprintf("gateway port %d", port)) {
				t.Errorf("audit of the refused %s: %v; want one tcp deny naming the gateway port", dst, recs)
			}
		}
		allowed := waitAudit(t, stateDir, mark, func(r auditRec) bool {
			return r.Dst == fmt.Sprintf("%s:%d", gatewayIP, fwdGatewayPort) && r.Verdict == "allow"
		})
		if len(allowed) != 1 || allowed[0].Upstream != fmt.Sprintf("127.0.0.1:%d", served.port) {
			t.Errorf("audit of the reverse forward's connection: %v; want one allow to 127.0.0.1:%d", allowed, served.port)
		}
	})

	t.Run("runtime_forwards_survive_down_up", func(t *testing.T) {
		mustMoat(t, dir, "down")
		if _, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(hostPort), time.Second); err == nil {
			t.Fatal("the forward still listens after down")
		}
		if out := mustMoat(t, dir, "forward", "list", name); !strings.Contains(out, "stopped") || !strings.Contains(out, strconv.Itoa(hostPort)) {
			t.Errorf("forward list of a stopped sandbox:\n%s", out)
		}
		mustMoat(t, dir, "up")
		startGuestServer(t, dir)
		if got := httpGet(t, hostPort); got != marker {
			t.Fatalf("after down/up, through the runtime forward got %q, want %q", got, marker)
		}
		if got := guestConnect(t, dir, fwdGatewayPort); len(got) != 1 || got[0] != fmt.Sprintf("%d OK moat-reverse-ok", fwdGatewayPort) {
			t.Fatalf("after down/up, the reverse forward: %q", got)
		}
	})

	t.Run("remove_closes_live", func(t *testing.T) {
		// A connection open through the forward is cut by the remove too.
		open, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(hostPort), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer open.Close()
		mustMoat(t, dir, "forward", "remove", name, strconv.Itoa(hostPort))
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(hostPort), 2*time.Second); err == nil {
			c.Close()
			t.Fatal("host port still accepts after remove")
		}
		open.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(open); err != nil {
			t.Errorf("the open connection was not closed by the remove: %v", err)
		}
		mustMoat(t, dir, "forward", "remove", "--reverse", name, strconv.Itoa(fwdGatewayPort))
		if got := guestConnect(t, dir, fwdGatewayPort); len(got) != 1 || got[0] != fmt.Sprintf("%d refused", fwdGatewayPort) {
			t.Fatalf("after remove --reverse, from the guest: %q", got)
		}
		r := moat(t, dir, nil, "forward", "remove", name, strconv.Itoa(cfgPort))
		if r.code == 0 || !strings.Contains(r.stderr, "moat.toml") {
			t.Errorf("removing the configuration's forward: exit %d, stderr %q; want a refusal saying where to change it", r.code, r.stderr)
		}
	})

	t.Run("bad_specs", func(t *testing.T) {
		for _, spec := range []string{"0", "70000", "1000-2000", "*", "127.0.0.1:80"} {
			if r := moat(t, dir, nil, "forward", "add", "--reverse", name, spec); r.code != 2 {
				t.Errorf("forward add --reverse %s: exit %d, stderr %q; want a usage error", spec, r.code, r.stderr)
			}
		}
	})
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

// startGuestServer starts python3's HTTP server on fwdGuestPort in the guest, serving the
// workspace, detached from the session, and waits until it accepts.
func startGuestServer(t *testing.T, dir string) {
	t.Helper()
	script := fmt.Sprintf(`setsid -f python3 -m http.server %d --bind 0.0.0.0 --directory %s >/dev/null 2>&1
for i in $(seq 1 100); do
  python3 -c 'import socket; socket.create_connection(("127.0.0.1", %d), 1)' 2>/dev/null && { echo up; exit 0; }
  sleep 0.1
done
echo down`, fwdGuestPort, dir, fwdGuestPort)
	if out := strings.TrimSpace(mustMoat(t, dir, "run", "--", "sh", "-c", script)); out != "up" {
		t.Fatalf("the guest's server did not come up: %q", out)
	}
}

// httpGet fetches hello.txt through a host port, with bounded time.
func httpGet(t *testing.T, port int) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/hello.txt", port))
	if err != nil {
		t.Fatalf("GET through host port %d: %v", port, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return strings.TrimSpace(string(b))
}

// listenAddrs are the local addresses of the listening TCP sockets on port, from the
// kernel's tables (hex, IPv4 in network order as a little-endian word).
func listenAddrs(t *testing.T, port int) []string {
	t.Helper()
	var out []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 4 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			h, p, ok := strings.Cut(fs[1], ":")
			if pn, err := strconv.ParseUint(p, 16, 16); !ok || err != nil || int(pn) != port {
				continue
			}
			if len(h) == 8 {
				v, _ := strconv.ParseUint(h, 16, 32)
				out = append(out, net.IPv4(byte(v), byte(v>>8), byte(v>>16), byte(v>>24)).String())
			} else {
				out = append(out, "ipv6:"+h)
			}
		}
	}
	return out
}

type hostSrv struct {
	port    int
	accepts atomic.Int64
}

// hostServer listens on the host's 127.0.0.1 and answers each connection with a line.
func hostServer(t *testing.T, line string) *hostSrv {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
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

// guestConnect connects from the guest to the gateway's ports, one line each: "PORT OK
// LINE" or "PORT refused" (or the error's name).
func guestConnect(t *testing.T, dir string, ports ...int) []string {
	t.Helper()
	var ps []string
	for _, p := range ports {
		ps = append(ps, strconv.Itoa(p))
	}
	py := `import socket, sys
for p in sys.argv[1:]:
    try:
        s = socket.create_connection(("` + gatewayIP + `", int(p)), 3)
        s.settimeout(3)
        print(p, "OK", s.makefile().readline().strip())
    except ConnectionRefusedError:
        print(p, "refused")
    except Exception as e:
        print(p, type(e).__name__)
`
	start := time.Now()
	out := mustMoat(t, dir, append([]string{"run", "--", "python3", "-c", py}, ps...)...)
	if el := time.Since(start); el > 30*time.Second {
		t.Errorf("connecting from the guest took %v", el)
	}
	return strings.Split(strings.TrimSpace(out), "\n")
}

func readAudit(t *testing.T, stateDir string) []auditRec {
	t.Helper()
	return readAuditDir(t, stateDir)
}

// waitAudit returns the records after mark that ok selects, once there are some (a record
// is written when its connection ends, a little after the guest saw it) and a moment more,
// so that a duplicate would show.
func waitAudit(t *testing.T, stateDir string, mark int, ok func(auditRec) bool) []auditRec {
	t.Helper()
	collect := func() []auditRec {
		var got []auditRec
		recs := readAudit(t, stateDir)
		for _, r := range recs[min(mark, len(recs)):] {
			if ok(r) {
				got = append(got, r)
			}
		}
		return got
	}
	for deadline := time.Now().Add(auditWait); time.Now().Before(deadline) && len(collect()) == 0; {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	return collect()
}
