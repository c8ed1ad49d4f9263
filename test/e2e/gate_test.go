package e2e

// End-to-end tests of the egress gate (DESIGN §4, ATTACKS.md "Going around the gate", "Name
// versus destination", "DNS", "Internal targets"), through the built moat binary exactly as a
// user types it, against a real guest and the real gate. The upstream world is test/inet: a
// network namespace holding the servers below, and the DNS server the gate is pointed at with
// MOAT_UPSTREAM_DNS. Nothing here talks to anything but loopback and that namespace.
//
// Most attacks run as subtests of TestGate against one sandbox (a start costs about a second,
// and the tier must stay fast). Every subtest is checked for leaks when it ends: no server an
// attacker controls (or an internal target) may have seen a connection, a byte or a datagram,
// and the upstream DNS server may have been asked only A questions for names the policy
// allows. "Denied" is then shown per attempt: the guest fails promptly and the audit log has
// the denial.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"moat.dev/moat/test/inet"
)

// The test internet's hosts. 198.51.100.0/24 is routed into the inet namespace; the private,
// CGNAT and link-local ones get /32 routes there from inet.AddHost, so a leak would reach a
// real server that counts it.
const (
	upstreamDNS  = "198.51.100.53:53"
	allowedIP    = "198.51.100.10" // allowed.test and its spellings
	liveIP       = "198.51.100.11" // live.test: allowed and removed at run time
	httpsOnlyIP  = "198.51.100.20" // httpsonly.test, allowed on :443 only
	portIP       = "198.51.100.30" // port.test, allowed on :2222 only
	rebindIP     = "198.51.100.40" // rebind.test before it rebinds to lanIP
	dohIP        = "198.51.100.50" // doh.test: a DNS-over-HTTPS server that answers evilIP
	evilIP       = "198.51.100.66" // the attacker: evil.test and everything below it
	lanIP        = "10.1.2.3"      // lan.test, and rebind.test after rebinding
	lan2IP       = "192.168.77.7"
	openedIP     = "172.31.250.5" // opened by an explicit address rule: the positive control
	closedIP     = "172.31.250.6" // its neighbour, which no rule opens
	cgnatIP      = "100.64.1.1"
	metadataIP   = "169.254.169.254"
	ecsIP        = "169.254.170.2"
	alibabaIP    = "100.100.100.200"
	gatewayIP    = "10.88.0.1"
	guestIP      = "10.88.0.2"
	sshBanner    = "SSH-2.0-moat-e2e-allowed\r\n"
	portBanner   = "SSH-2.0-moat-e2e-port\r\n"
	rebindBanner = "SSH-2.0-moat-e2e-rebind\r\n"
	liveBanner   = "SSH-2.0-moat-e2e-live\r\n"
	evilBanner   = "SSH-2.0-moat-e2e-EVIL\r\n"
)

// gateToml is the main sandbox's policy: no built-in list, only these rules, in the project
// layer. Names that resolve to internal addresses are allowed on purpose: a name rule must
// never open an internal address.
const gateToml = `[network]
use = ["none"]
allow = [
  "allowed.test",
  "*.wild.test",
  "port.test:2222",
  "httpsonly.test:443",
  "xn--bcher-kva.test",
  "rebind.test",
  "doh.test",
  "meta.test",
  "metadata.google.internal",
  "lan.test",
  "cgnat.test",
  "loop.test",
  "hostself.test",
  "hostlan.test",
  "gw.test",
  "172.31.250.5",
]
block = ["blocked.wild.test"]
`

// allowedQueries are the only names the upstream DNS server may ever be asked about (type A
// only): the exact allow rules, and names below *.wild.test other than the blocked one.
var allowedQueries = []string{
	"allowed.test", "port.test", "httpsonly.test", "xn--bcher-kva.test", "rebind.test", "doh.test",
	"meta.test", "metadata.google.internal", "lan.test", "cgnat.test", "loop.test", "hostself.test",
	"hostlan.test", "gw.test",
}

// Bounds. A denial is prompt when the guest sees it well before any client timeout would fire.
const (
	promptly      = 2 * time.Second // a refused connection or an answered denial, in the guest
	auditWait     = 3 * time.Second // an audit line is written when the flow ends
	dropTimeout   = "1500ms"        // how long the probe waits on traffic the gate drops silently
	probeDefault  = "4s"
	curlMaxTimeS  = "8"
	guestRunBound = 20 * time.Second // one `moat run` of a batch of attempts
)

// gateEnv is one sandbox behind the gate, the test internet around it, and the servers that
// must never hear from it.
type gateEnv struct {
	net   *inet.Net
	name  string
	dir   string // workspace, same path in host and guest
	state string // $MOAT_HOME/state/sandboxes/<name>
	env   []string
	probe string // the probe, inside the workspace
	ca    string // the test CA's PEM, inside the workspace

	hostIP string        // the host's own LAN address
	host   *hostListener // listens on every host address; must never be reached

	srv     map[string]*inet.Server // by role, see startServers
	watched []string                // roles whose servers must never be contacted

	// liveWindow is the part of the DNS query log during which live.test had a runtime allow
	// rule (live_rules): the only time it may be asked upstream.
	liveWindow [2]int
}

// hostListener is a TCP listener in the host namespace on all addresses; every connection it
// accepts is a connection the gate should have refused.
type hostListener struct {
	port    int
	accepts atomic.Int64
}

func listenHost(t *testing.T, network, addr string) (*hostListener, net.Listener) {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("listening on the host (%s %s): %v", network, addr, err)
	}
	h := &hostListener{}
	if ta, ok := l.Addr().(*net.TCPAddr); ok {
		h.port = ta.Port
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.accepts.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return h, l
}

// newGateEnv starts the test internet's servers, then a sandbox named name whose workspace
// holds toml as moat.toml, the probe and the test CA.
func newGateEnv(t *testing.T, n *inet.Net, name, toml string) *gateEnv {
	t.Helper()
	g := &gateEnv{
		net:   n,
		name:  name,
		dir:   project(t, name),
		state: filepath.Join(moatHome, "state", "sandboxes", name),
		env:   []string{"MOAT_UPSTREAM_DNS=" + upstreamDNS},
		srv:   map[string]*inet.Server{},
	}
	g.probe = installProbe(t, g.dir)
	g.ca = filepath.Join(g.dir, "ca.pem")
	if err := os.WriteFile(g.ca, n.CA().PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	g.hostIP = hostLANAddr(t)
	g.host, _ = listenHost(t, "tcp4", "0.0.0.0:0")
	return g
}

// up starts the sandbox with the gate's upstream resolver pointed at the test DNS server.
func (g *gateEnv) up(t *testing.T) {
	t.Helper()
	start := time.Now()
	if r := moat(t, g.dir, g.env, "up"); r.code != 0 {
		t.Fatalf("moat up %s: exit %d\nstdout: %s\nstderr: %s\n%s", g.name, r.code, r.stdout, r.stderr, g.daemonLog())
	}
	t.Logf("sandbox %s up in %v", g.name, time.Since(start).Round(time.Millisecond))
}

func (g *gateEnv) daemonLog() string {
	b, _ := os.ReadFile(filepath.Join(g.state, "daemon.log"))
	return "daemon.log:\n" + gateTail(string(b), 30)
}

// hostLANAddr is the host's own address on its default-route interface: the gate runs in the
// host's namespace, so this is the "host's own LAN address" of ATTACKS 19.
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

// serve adds a server under role; watch marks it as one that must never be contacted.
func (g *gateEnv) serve(role string, s *inet.Server, watch bool) {
	g.srv[role] = s
	if watch {
		g.watched = append(g.watched, role)
	}
}

// startServers builds the test internet's contents: the allowed upstreams, the attacker, the
// internal targets, and the zone that names them.
func (g *gateEnv) startServers(t *testing.T) {
	t.Helper()
	n := g.net
	ca := []string{"allowed.test", "*.wild.test", "xn--bcher-kva.test", "live.test"}
	// Allowed upstreams: the tests read which of them answered from the body, which names the
	// server and the Host it was sent.
	g.serve("allowed:80", n.HTTP(t, allowedIP, 80, nil), false)
	g.serve("allowed:443", n.HTTPS(t, allowedIP, 443, ca, nil), false)
	g.serve("allowed:2222", n.TCP(t, allowedIP, 2222, sshBanner), false)
	g.serve("live:80", n.HTTP(t, liveIP, 80, nil), false)
	g.serve("live:2222", n.TCP(t, liveIP, 2222, liveBanner), false)
	g.serve("httpsonly:443", n.HTTPS(t, httpsOnlyIP, 443, []string{"httpsonly.test"}, nil), false)
	g.serve("port:2222", n.TCP(t, portIP, 2222, portBanner), false)
	g.serve("rebind:80", n.HTTP(t, rebindIP, 80, nil), false)
	g.serve("rebind:2222", n.TCP(t, rebindIP, 2222, rebindBanner), false)
	g.serve("doh:443", n.HTTPS(t, dohIP, 443, []string{"doh.test"}, dohHandler(evilIP)), false)
	g.serve("opened:80", n.HTTP(t, openedIP, 80, nil), false)

	// UDP of an allowed host: UDP is not forwarded at all, so these must hear nothing.
	g.serve("allowed:udp9999", n.UDP(t, allowedIP, 9999), true)
	g.serve("allowed:quic443", n.UDP(t, allowedIP, 443), true)
	// Ports and schemes of allowed names that their rules do not cover.
	g.serve("port:2223", n.TCP(t, portIP, 2223, portBanner), true)
	g.serve("port:80", n.HTTP(t, portIP, 80, nil), true)
	g.serve("httpsonly:80", n.HTTP(t, httpsOnlyIP, 80, nil), true)

	// The attacker. Its HTTPS certificate also covers allowed.test, so an allowed SNI that the
	// gate wrongly dialed here would complete its handshake: only the attacker's counters
	// tell.
	g.serve("evil:80", n.HTTP(t, evilIP, 80, nil), true)
	g.serve("evil:443", n.HTTPS(t, evilIP, 443, []string{"evil.test", "*.evil.test", "allowed.test"}, nil), true)
	g.serve("evil:2222", n.TCP(t, evilIP, 2222, evilBanner), true)
	g.serve("evil:8080", n.TCP(t, evilIP, 8080, evilBanner), true)
	g.serve("evil:853", n.TCP(t, evilIP, 853, ""), true)
	g.serve("evil:dns53", n.UDP(t, evilIP, 53), true)
	g.serve("evil:tcp53", n.TCP(t, evilIP, 53, ""), true)
	g.serve("evil:quic443", n.UDP(t, evilIP, 443), true)
	g.serve("evil:udp9999", n.UDP(t, evilIP, 9999), true)
	g.serve("evil:udp2222", n.UDP(t, evilIP, 2222), true)

	// Internal targets: each a real server, so a leak is counted, not just a timeout.
	for _, ip := range []string{lanIP, lan2IP, closedIP, cgnatIP, metadataIP, ecsIP, alibabaIP} {
		g.serve(ip+":80", n.HTTP(t, ip, 80, nil), true)
	}
	g.serve(lanIP+":2222", n.TCP(t, lanIP, 2222, evilBanner), true)

	z := func(name string, ips ...string) { n.SetA(name, ips...) }
	z("allowed.test", allowedIP)
	n.SetAAAA("allowed.test", "2001:db8::10")
	n.SetTXT("allowed.test", "v=would-carry-tunnelled-data")
	z("live.test", liveIP)
	z("a.wild.test", allowedIP)
	z("a.b.c.wild.test", allowedIP)
	z("xn--bcher-kva.test", allowedIP)
	z("httpsonly.test", httpsOnlyIP)
	z("port.test", portIP)
	z("rebind.test", rebindIP)
	z("doh.test", dohIP)
	z("meta.test", metadataIP)
	z("metadata.google.internal", metadataIP)
	z("lan.test", lanIP)
	z("cgnat.test", cgnatIP)
	z("loop.test", "127.0.0.1")
	z("hostself.test", inet.HostAddr.String())
	z("hostlan.test", g.hostIP)
	z("gw.test", gatewayIP)
	// Names the policy denies point at the attacker: if the gate ever resolved and dialed one
	// of them, the attacker would count it.
	for _, name := range []string{"evil.test", "x.evil.test", "wild.test", "blocked.wild.test", "xwild.test", "allowed.test.evil.test", homoglyph} {
		z(name, evilIP)
	}
	n.SetAAAA("evil.test", "2001:db8::66")
	n.SetTXT("evil.test", "attacker-controlled")
}

// homoglyph is allowed.test with a Cyrillic "а" (U+0430) for the first letter, in punycode.
const homoglyph = "xn--llowed-2ve.test"

// dohHandler answers DNS-over-HTTPS (RFC 8484, GET and POST) with answer for every A
// question: a resolver the guest may use only because the host it runs on is allowed.
func dohHandler(answer string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q []byte
		if r.Method == http.MethodPost {
			q, _ = io.ReadAll(io.LimitReader(r.Body, 65535))
		} else {
			q, _ = base64.RawURLEncoding.DecodeString(r.URL.Query().Get("dns"))
		}
		m := new(dns.Msg)
		if err := m.Unpack(q); err != nil {
			http.Error(w, "bad DNS message", http.StatusBadRequest)
			return
		}
		resp := new(dns.Msg)
		resp.SetReply(m)
		if len(m.Question) == 1 && m.Question[0].Qtype == dns.TypeA {
			resp.Answer = append(resp.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A:   net.ParseIP(answer),
			})
		}
		b, _ := resp.Pack()
		w.Header().Set("Content-Type", "application/dns-message")
		w.Write(b)
	})
}

// ---- the probe ---------------------------------------------------------------------------

// probeBin is the probe, built once per test binary and kept in memory, so no build output
// outlives the test binary.
var probeBin struct {
	sync.Once
	b   []byte
	err error
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "/usr/local/go/bin/go"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// installProbe writes the probe into dir (the workspace, mounted at the same path in the
// guest) and returns its path.
func installProbe(t *testing.T, dir string) string {
	t.Helper()
	probeBin.Do(func() {
		tmp, err := os.MkdirTemp("", "moat-e2e-probe-")
		if err != nil {
			probeBin.err = err
			return
		}
		defer os.RemoveAll(tmp)
		out := filepath.Join(tmp, "probe")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-o", out, "./probe")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			probeBin.err = fmt.Errorf("building the probe: %v\n%s", err, b)
			return
		}
		probeBin.b, probeBin.err = os.ReadFile(out)
	})
	if probeBin.err != nil {
		t.Fatal(probeBin.err)
	}
	p := filepath.Join(dir, "probe")
	if err := os.WriteFile(p, probeBin.b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// ---- running things in the guest -----------------------------------------------------------

// sh runs script in the sandbox with sh -c and returns its stdout; the script must exit 0
// (attempts that fail are reported in its output, not by its exit code).
func (g *gateEnv) sh(t *testing.T, script string) string {
	t.Helper()
	start := time.Now()
	r := moat(t, g.dir, g.env, "run", "--", "sh", "-c", script)
	if took := time.Since(start); took > guestRunBound {
		t.Errorf("one guest run took %v (bound %v): something waited on a timeout instead of being refused", took.Round(time.Millisecond), guestRunBound)
	}
	if r.code != 0 {
		t.Fatalf("guest script failed: exit %d\nscript: %s\nstdout: %s\nstderr: %s", r.code, script, r.stdout, r.stderr)
	}
	return r.stdout
}

// probeResult is one line of the probe's output.
type probeResult struct {
	Op   string  `json:"op"`
	Tag  string  `json:"tag"`
	OK   bool    `json:"ok"`
	Err  string  `json:"err"`
	MS   float64 `json:"ms"`
	Data string  `json:"data"`
}

func (p probeResult) String() string {
	s := fmt.Sprintf("%s ok=%v %.0fms", p.Op, p.OK, p.MS)
	if p.Err != "" {
		s += " err=" + p.Err
	}
	if p.Data != "" {
		s += fmt.Sprintf(" data=%q", gateClip(p.Data, 200))
	}
	return s
}

func (p probeResult) took() time.Duration { return time.Duration(p.MS * float64(time.Millisecond)) }

// call is one probe invocation: op, then flags, then arguments. sudo runs it as root in the
// guest.
type call struct {
	sudo bool
	args []string
}

func pr(args ...string) call     { return call{args: args} }
func prRoot(args ...string) call { return call{sudo: true, args: args} }

// probes runs the calls one after another in one guest session and returns their results in
// order.
func (g *gateEnv) probes(t *testing.T, calls ...call) []probeResult {
	t.Helper()
	return g.runProbes(t, false, calls)
}

// probesParallel runs the calls at the same time: for attempts that each wait out a drop.
func (g *gateEnv) probesParallel(t *testing.T, calls ...call) []probeResult {
	t.Helper()
	return g.runProbes(t, true, calls)
}

func (g *gateEnv) runProbes(t *testing.T, parallel bool, calls []call) []probeResult {
	t.Helper()
	var sb strings.Builder
	for i, c := range calls {
		line := ""
		if c.sudo {
			line = "sudo -n "
		}
		args := append([]string{g.probe, c.args[0], "-tag", strconv.Itoa(i)}, c.args[1:]...)
		line += shQuote(args...)
		if parallel {
			line += " &"
		}
		sb.WriteString(line + "\n")
	}
	sb.WriteString("wait; true\n")
	out := g.sh(t, sb.String())
	res := make([]probeResult, len(calls))
	seen := make([]bool, len(calls))
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var r probeResult
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("probe printed %q: %v", l, err)
		}
		i, err := strconv.Atoi(r.Tag)
		if err != nil || i < 0 || i >= len(calls) {
			t.Fatalf("probe line with unknown tag: %q", l)
		}
		res[i], seen[i] = r, true
	}
	for i, ok := range seen {
		if !ok {
			t.Fatalf("probe %v printed nothing; guest output:\n%s", calls[i].args, out)
		}
	}
	return res
}

func shQuote(args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// curlResult is what one curl in the guest got.
type curlResult struct {
	args    []string
	exit    int
	status  string // HTTP status code, "000" when there was no response
	secs    float64
	headers string
	body    string
	stderr  string
}

func (c curlResult) String() string {
	return fmt.Sprintf("curl %s: exit %d, status %s, %.3fs, body %q, stderr %q", strings.Join(c.args, " "), c.exit, c.status, c.secs, gateClip(c.body, 200), strings.TrimSpace(c.stderr))
}

func (c curlResult) took() time.Duration { return time.Duration(c.secs * float64(time.Second)) }

const curlSep = "=moat-e2e-sep="

// curls runs one curl per argument list, in order, in one guest session.
func (g *gateEnv) curls(t *testing.T, argss ...[]string) []curlResult {
	t.Helper()
	var sb strings.Builder
	for i, args := range argss {
		f := fmt.Sprintf("/tmp/moat-curl-%d", i)
		full := append([]string{"curl", "-sS", "--max-time", curlMaxTimeS, "-D", f + ".h", "-o", f + ".b", "-w", "%{http_code} %{time_total}"}, args...)
		fmt.Fprintf(&sb, "rm -f %[1]s.h %[1]s.b; %[2]s 2>%[1]s.e; echo \" $?\"; for x in h b e; do echo %[3]s; cat %[1]s.$x 2>/dev/null; done; echo %[3]s\n", f, shQuote(full...), curlSep)
	}
	out := g.sh(t, sb.String()+"true\n")
	parts := strings.Split(out, curlSep+"\n")
	if len(parts) != 4*len(argss)+1 {
		t.Fatalf("curl output not understood:\n%s", out)
	}
	res := make([]curlResult, len(argss))
	for i := range argss {
		p := parts[4*i : 4*i+4]
		f := strings.Fields(p[0])
		if len(f) != 3 {
			t.Fatalf("curl status line %q not understood", p[0])
		}
		res[i].args = argss[i]
		res[i].status = f[0]
		res[i].secs, _ = strconv.ParseFloat(f[1], 64)
		res[i].exit, _ = strconv.Atoi(f[2])
		res[i].headers, res[i].body, res[i].stderr = p[1], p[2], p[3]
	}
	return res
}

// ---- the audit log -------------------------------------------------------------------------

// auditRec is one line of audit.jsonl (schema 1).
type auditRec struct {
	Schema     int       `json:"schema"`
	Time       time.Time `json:"time"`
	Sandbox    string    `json:"sandbox"`
	Proto      string    `json:"proto"`
	Dst        string    `json:"dst"`
	Name       string    `json:"name"`
	NameFrom   string    `json:"name_from"`
	Verdict    string    `json:"verdict"`
	Rule       string    `json:"rule"`
	Layer      string    `json:"layer"`
	Reason     string    `json:"reason"`
	Upstream   string    `json:"upstream"`
	BytesUp    int64     `json:"bytes_up"`
	BytesDown  int64     `json:"bytes_down"`
	DurationMS int64     `json:"duration_ms"`
}

func (r auditRec) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// audit reads the sandbox's audit log.
func (g *gateEnv) audit(t *testing.T) []auditRec {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.state, "audit.jsonl"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("reading the audit log: %v", err)
	}
	var out []auditRec
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		var r auditRec
		if err := json.Unmarshal(l, &r); err != nil {
			continue // a line being written
		}
		out = append(out, r)
	}
	return out
}

// mark is where the audit log ends now; expect looks only after it.
func (g *gateEnv) mark(t *testing.T) int { t.Helper(); return len(g.audit(t)) }

// match selects audit records: empty fields match anything; Dst may end in "*" for a prefix
// and start with "*" for a suffix (":8080" of a pool address).
type match struct {
	Proto, Dst, Name, NameFrom, Verdict string
	Reason                              string // substring
}

func (m match) String() string {
	b, _ := json.Marshal(m)
	return string(b)
}

func (m match) ok(r auditRec) bool {
	eq := func(want, got string) bool { return want == "" || strings.EqualFold(want, got) }
	dst := m.Dst == "" || r.Dst == m.Dst ||
		strings.HasSuffix(m.Dst, "*") && strings.HasPrefix(r.Dst, strings.TrimSuffix(m.Dst, "*")) ||
		strings.HasPrefix(m.Dst, "*") && strings.HasSuffix(r.Dst, strings.TrimPrefix(m.Dst, "*"))
	return eq(m.Proto, r.Proto) && dst && eq(m.Name, r.Name) && eq(m.NameFrom, r.NameFrom) &&
		eq(m.Verdict, r.Verdict) && (m.Reason == "" || strings.Contains(strings.ToLower(r.Reason), strings.ToLower(m.Reason)))
}

// expect waits for an audit record after since that matches m, and returns it.
func (g *gateEnv) expect(t *testing.T, since int, m match) (auditRec, bool) {
	t.Helper()
	deadline := time.Now().Add(auditWait)
	for {
		all := g.audit(t)
		if since > len(all) {
			since = 0 // rotated
		}
		for _, r := range all[since:] {
			if m.ok(r) {
				return r, true
			}
		}
		if time.Now().After(deadline) {
			var recent []string
			for _, r := range all[since:] {
				recent = append(recent, r.String())
			}
			t.Errorf("no audit record %v; records since the attempt:\n%s", m, gateTail(strings.Join(recent, "\n"), 40))
			return auditRec{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// denied expects a deny record.
func (g *gateEnv) denied(t *testing.T, since int, m match) auditRec {
	t.Helper()
	m.Verdict = "deny"
	r, _ := g.expect(t, since, m)
	return r
}

// noAllow fails if any record after since allows something m matches (m.Verdict is set).
func (g *gateEnv) noAllow(t *testing.T, since int, m match) {
	t.Helper()
	m.Verdict = "allow"
	all := g.audit(t)
	if since > len(all) {
		since = 0
	}
	for _, r := range all[since:] {
		if m.ok(r) {
			t.Errorf("the gate allowed what it must deny: %v", r)
		}
	}
}

// ---- leaks ---------------------------------------------------------------------------------

type counts struct {
	conns, hits int
	bytes       int64
}

func countsOf(s *inet.Server) counts { return counts{s.Conns(), s.Hits(), s.BytesIn()} }

// noLeaks snapshots every watched server, the host listener and the DNS query log, and checks
// at the end of t that none of them heard anything from the guest.
func (g *gateEnv) noLeaks(t *testing.T) {
	t.Helper()
	before := map[string]counts{}
	for _, role := range g.watched {
		before[role] = countsOf(g.srv[role])
	}
	hostBefore := g.host.accepts.Load()
	qBefore := len(g.net.Queries())
	t.Cleanup(func() {
		for _, role := range g.watched {
			if now := countsOf(g.srv[role]); now != before[role] {
				s := g.srv[role]
				t.Errorf("LEAK: %s (%s) was contacted: connections %d→%d, requests/datagrams %d→%d, bytes %d→%d; payloads: %q",
					role, s.Addr, before[role].conns, now.conns, before[role].hits, now.hits, before[role].bytes, now.bytes, lastPayloads(s))
			}
		}
		if a := g.host.accepts.Load(); a != hostBefore {
			t.Errorf("LEAK: the host's own listener (port %d on every host address) accepted %d connections from the sandbox", g.host.port, a-hostBefore)
		}
		qs := g.net.Queries()
		if len(qs) >= qBefore {
			for i, q := range qs[qBefore:] {
				if i+qBefore >= g.liveWindow[0] && i+qBefore < g.liveWindow[1] && strings.EqualFold(q, "live.test A") {
					continue
				}
				if !queryAllowed(q) {
					t.Errorf("LEAK: the upstream DNS server was asked %q: only A questions for names the policy allows may leave the gate", q)
				}
			}
		}
	})
}

func lastPayloads(s *inet.Server) []string {
	var out []string
	for _, p := range s.Payloads() {
		out = append(out, gateClip(string(p), 80))
	}
	for _, r := range s.Requests() {
		out = append(out, r.Method+" "+r.Host+r.Path)
	}
	if len(out) > 5 {
		out = out[len(out)-5:]
	}
	return out
}

func queryAllowed(q string) bool {
	i := strings.LastIndexByte(q, ' ')
	if i < 0 {
		return false
	}
	name, typ := strings.ToLower(strings.TrimSuffix(q[:i], ".")), q[i+1:]
	if typ != "A" {
		return false
	}
	if slices.Contains(allowedQueries, name) {
		return true
	}
	return strings.HasSuffix(name, ".wild.test") && name != "blocked.wild.test"
}

// ---- small checks ---------------------------------------------------------------------------

// refusedPromptly checks a probe that must have failed, and quickly.
func refusedPromptly(t *testing.T, what string, r probeResult) {
	t.Helper()
	if r.OK {
		t.Errorf("%s: succeeded, want it refused: %v", what, r)
		return
	}
	if r.took() > promptly {
		t.Errorf("%s: refused only after %v (want < %v): %v", what, r.took().Round(time.Millisecond), promptly, r)
	}
}

// droppedWithin checks a probe whose traffic the gate drops silently: it must fail, and by
// the probe's own short deadline, not later.
func droppedWithin(t *testing.T, what string, r probeResult, bound time.Duration) {
	t.Helper()
	if r.OK {
		t.Errorf("%s: got an answer, want none: %v", what, r)
		return
	}
	if r.took() > bound {
		t.Errorf("%s: failed only after %v (bound %v): %v", what, r.took().Round(time.Millisecond), bound, r)
	}
}

// curlDenied checks a curl that must have been refused by the gate: a connection refused or
// closed, or the gate's 403, promptly.
func curlDenied(t *testing.T, c curlResult) {
	t.Helper()
	if c.exit == 0 && c.status != "403" {
		t.Errorf("not denied: %v", c)
		return
	}
	if c.took() > promptly {
		t.Errorf("denied only after %v (want < %v): %v", c.took().Round(time.Millisecond), promptly, c)
	}
	if c.status == "403" && !strings.Contains(strings.ToLower(c.headers), "x-moat-denied") {
		t.Errorf("a 403 without X-Moat-Denied is not the gate's: %v\nheaders: %s", c, c.headers)
	}
}

// curlReached checks a curl that must have got through to the server at want (the inet
// servers name themselves and the Host in their body).
func curlReached(t *testing.T, c curlResult, want string) {
	t.Helper()
	if c.exit != 0 || c.status != "200" || !strings.Contains(c.body, want) {
		t.Errorf("want a 200 from %q: %v", want, c)
	}
}

func gateClip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func gateTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// inPool reports whether s is an address from the gate's private pool.
func inPool(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && netip.MustParsePrefix("198.18.0.0/15").Contains(a)
}

// answerA returns the first A address in a dns probe's data ("NOERROR n=1 A 1.2.3.4").
func answerA(data string) string {
	f := strings.Fields(strings.ReplaceAll(data, ";", " "))
	for i, w := range f {
		if w == "A" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

// snmpCounter reads one counter of /proc/net/snmp inside the test internet's namespace
// ("Icmp", "InMsgs"): traffic that reached the namespace at all, whatever port or server.
func (g *gateEnv) snmpCounter(t *testing.T, group, field string) int64 {
	t.Helper()
	out, err := g.net.Exec(t, "cat", "/proc/net/snmp")
	if err != nil {
		t.Fatalf("reading the namespace's snmp counters: %v\n%s", err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	var names []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != group+":" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, n := range names {
			if n == field && i+1 < len(f) {
				v, _ := strconv.ParseInt(f[i+1], 10, 64)
				return v
			}
		}
	}
	t.Fatalf("no %s %s in the namespace's /proc/net/snmp", group, field)
	return 0
}

// ---- the tests -----------------------------------------------------------------------------

// TestGate runs the gate's behaviour and the ATTACKS.md lines 1-22 (without TLS termination)
// against one sandbox whose policy is gateToml.
func TestGate(t *testing.T) {
	n := inet.Start(t)
	// Answers live one second upstream (the gate clamps to its 5 s minimum), so the rebinding
	// test sees the new address without waiting out a long TTL.
	n.SetTTL(1)
	g := newGateEnv(t, n, "gate-e2e", gateToml)
	g.startServers(t)
	g.up(t)

	for _, st := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"allowed_name", g.testAllowedName},
		{"denied_name_never_leaves", g.testDeniedName},
		{"live_rules", g.testLiveRules},
		{"attack01_no_route_but_the_gate", g.attack01},
		{"attack02_hardcoded_ip_resolve_raw_packet", g.attack02},
		{"attack03_udp_quic_public_dns_dot", g.attack03},
		{"attack04_icmp", g.attack04},
		{"attack05_ipv6", g.attack05},
		{"attack06_http_vs_https", g.attack06},
		{"attack07_relay_in_sandbox", g.attack07},
		{"attack08_unix_sockets", g.attack08},
		{"attack09_allowed_sni_to_attacker_ip", g.attack09},
		{"attack10_hosts_file_and_guest_resolver", g.attack10},
		{"attack11_fronting_without_termination", g.attack11},
		{"attack12_ech_no_sni_split_hello", g.attack12},
		{"attack13_odd_spellings", g.attack13},
		{"attack14_dns_exfiltration", g.attack14},
		{"attack15_dns_tunnel_types_long_names_flood", g.attack15},
		{"attack16_rebinding", g.attack16},
		{"attack17_doh_to_allowed_host", g.attack17},
		{"attack18_metadata", g.attack18},
		{"attack19_host_loopback_and_lan", g.attack19},
		{"attack20_private_cgnat_nat64", g.attack20},
		{"attack21_other_sandboxes", g.attack21},
		{"attack22_gate_to_itself", g.attack22},
	} {
		t.Run(st.name, func(t *testing.T) {
			g.noLeaks(t)
			st.f(t)
		})
	}
	// Across the whole test: the attacker's name never reached the upstream resolver.
	if k := n.Asked("evil.test"); k != 0 {
		t.Errorf("LEAK: the upstream DNS server was asked %d questions under evil.test", k)
	}
}

// The "Allowed name": curl gets the page; the audit line says allow, with the rule
// and the layer.
func (g *gateEnv) testAllowedName(t *testing.T) {
	m := g.mark(t)
	r := g.curls(t, []string{"http://allowed.test/"}, []string{"--cacert", g.ca, "https://allowed.test/"})
	curlReached(t, r[0], "inet http 198.51.100.10:80 allowed.test/")
	curlReached(t, r[1], "inet https 198.51.100.10:443 allowed.test/")
	for _, c := range []struct{ port, from string }{{"80", "host"}, {"443", "sni"}} {
		a, ok := g.expect(t, m, match{Proto: "tcp", Dst: "*:" + c.port, Name: "allowed.test", Verdict: "allow"})
		if !ok {
			continue
		}
		if a.Schema != 1 || a.Sandbox != g.name || a.Rule != "allowed.test" || a.Layer != "project" || a.NameFrom != c.from ||
			a.Upstream != allowedIP+":"+c.port || a.BytesDown == 0 || a.BytesUp == 0 || a.Time.IsZero() {
			t.Errorf("allow record for :%s: want schema 1, sandbox %s, rule allowed.test, layer project, name_from %s, upstream %s:%s, bytes both ways; got %v",
				c.port, g.name, c.from, allowedIP, c.port, a)
		}
	}
	if a, ok := g.expect(t, m, match{Proto: "dns", Name: "allowed.test", Verdict: "allow"}); ok && (a.Rule != "allowed.test" || a.Layer != "project") {
		t.Errorf("DNS allow record without its rule and layer: %v", a)
	}
	// The same decision through the command a person types.
	out := mustMoatEnv(t, g.dir, g.env, "network", "audit", g.name, "--json")
	found := false
	for _, l := range strings.Split(out, "\n") {
		var a auditRec
		if json.Unmarshal([]byte(l), &a) == nil && a.Verdict == "allow" && a.Name == "allowed.test" && a.Rule == "allowed.test" && a.Layer == "project" {
			found = true
		}
	}
	if !found {
		t.Errorf("moat network audit %s --json has no allow line for allowed.test:\n%s", g.name, gateTail(out, 20))
	}
}

// The "Denied name": a pool address, never asked upstream (the DNS exfiltration
// test), refused at once, and in the ledger as name:port.
func (g *gateEnv) testDeniedName(t *testing.T) {
	m := g.mark(t)
	g.net.ResetQueries()
	r := g.probes(t,
		pr("dns", "-timeout", probeDefault, gatewayIP+":53", "x.evil.test", "A"),
		pr("dns", "-tcp", "-timeout", probeDefault, gatewayIP+":53", "x.evil.test", "A"),
		pr("tcp", "-timeout", probeDefault, "x.evil.test:8080"),
	)
	udpAddr, tcpAddr := answerA(r[0].Data), answerA(r[1].Data)
	if !r[0].OK || !inPool(udpAddr) {
		t.Errorf("lookup of a denied name over UDP: want an address in 198.18.0.0/15, got %v", r[0])
	}
	if !r[1].OK || tcpAddr != udpAddr {
		t.Errorf("lookup over TCP: want the same pool address %s, got %v", udpAddr, r[1])
	}
	refusedPromptly(t, "connecting to x.evil.test:8080", r[2])
	if !strings.Contains(r[2].Err, "refused") {
		t.Errorf("connecting to a denied name: want connection refused (a reset), got %v", r[2])
	}
	c := g.curls(t, []string{"http://x.evil.test:8080/"})[0]
	if c.exit != 7 {
		t.Errorf("curl to a denied name on a non-HTTP port: want exit 7 (could not connect), got %v", c)
	}
	curlDenied(t, c)
	if k := g.net.Asked("evil.test"); k != 0 {
		t.Errorf("LEAK: the upstream DNS server was asked %d questions under evil.test: %q", k, g.net.Queries())
	}
	g.denied(t, m, match{Proto: "dns", Name: "x.evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: udpAddr + ":8080", Name: "x.evil.test", NameFrom: "pool"})

	out := mustMoatEnv(t, g.dir, g.env, "network", "denials", g.name, "--json")
	if !strings.Contains(out, "x.evil.test:8080") || !strings.Contains(out, `"schema":1`) {
		t.Errorf("moat network denials %s --json does not show x.evil.test:8080 (schema 1):\n%s", g.name, out)
	}
	var st struct {
		Schema  int   `json:"schema"`
		Denials int64 `json:"denials"`
	}
	sj := mustMoatEnv(t, g.dir, g.env, "status", g.name, "--json")
	if err := json.Unmarshal([]byte(sj), &st); err != nil || st.Schema != 1 || st.Denials < 2 {
		t.Errorf("moat status %s --json: want schema 1 and denials >= 2, got %s (%v)", g.name, sj, err)
	}
}

// Live rule changes: allow makes the next connection succeed without restarting anything,
// remove makes the next one fail.
func (g *gateEnv) testLiveRules(t *testing.T) {
	pidBefore := g.daemonPID(t)
	m := g.mark(t)
	before := g.curls(t, []string{"http://live.test/"})[0]
	curlDenied(t, before)
	if before.status != "403" {
		t.Errorf("before the rule: want the gate's 403, got %v", before)
	}
	g.denied(t, m, match{Proto: "tcp", Name: "live.test"})

	g.liveWindow = [2]int{len(g.net.Queries()), 1 << 62}
	mustMoatEnv(t, g.dir, g.env, "network", "allow", g.name, "live.test")
	m = g.mark(t)
	r := g.curls(t, []string{"http://live.test/"})
	curlReached(t, r[0], "inet http 198.51.100.11:80 live.test/")
	p := g.probes(t, pr("tcp", "-read", "-timeout", "2s", "live.test:2222"))
	if !p[0].OK || !strings.HasPrefix(p[0].Data, liveBanner) {
		t.Errorf("after allow, live.test:2222 (no sniffing, server speaks first): want its banner, got %v", p[0])
	}
	if a, ok := g.expect(t, m, match{Proto: "tcp", Name: "live.test", Verdict: "allow"}); ok && (a.Layer != "runtime" || a.Rule != "live.test") {
		t.Errorf("allowed by the runtime rule: want layer runtime, rule live.test; got %v", a)
	}
	list := mustMoatEnv(t, g.dir, g.env, "network", "list", g.name, "--json")
	if !strings.Contains(list, `"live.test"`) || !strings.Contains(list, `"runtime"`) {
		t.Errorf("moat network list --json after allow does not show live.test in the runtime layer:\n%s", list)
	}

	mustMoatEnv(t, g.dir, g.env, "network", "remove", g.name, "live.test")
	g.liveWindow[1] = len(g.net.Queries())
	liveHTTP, liveSSH := countsOf(g.srv["live:80"]), countsOf(g.srv["live:2222"])
	m = g.mark(t)
	after := g.curls(t, []string{"http://live.test/"})[0]
	curlDenied(t, after)
	// The guest still knows live.test's real address from its last lookup: dialing it
	// directly must fail too, now that the name is no longer allowed.
	p = g.probes(t, pr("tcp", "-read", "-timeout", "2s", "live.test:2222"), pr("tcp", "-read", "-timeout", "2s", liveIP+":2222"))
	refusedPromptly(t, "live.test:2222 after remove", p[0])
	refusedPromptly(t, liveIP+":2222 (its address, remembered) after remove", p[1])
	if countsOf(g.srv["live:80"]) != liveHTTP || countsOf(g.srv["live:2222"]) != liveSSH {
		t.Errorf("after remove, live.test's servers were still contacted")
	}
	g.denied(t, m, match{Proto: "tcp", Name: "live.test"})
	g.noAllow(t, m, match{Name: "live.test", Proto: "tcp"})
	if pid := g.daemonPID(t); pid != pidBefore {
		t.Errorf("the daemon was restarted by a rule change (pid %d → %d)", pidBefore, pid)
	}
}

func (g *gateEnv) daemonPID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.state, "daemon.pid"))
	if err != nil {
		t.Fatalf("reading daemon.pid: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// mustMoatEnv is mustMoat with the sandbox's environment.
func mustMoatEnv(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	r := moat(t, dir, env, args...)
	if r.code != 0 {
		t.Fatalf("moat %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}
