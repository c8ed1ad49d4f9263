package e2e

// Internal targets (threat model 18-22): subtests of TestGate (gate_test.go has the sandbox, the
// servers and the leak check every subtest runs under). Every internal address here has a
// real server in the test internet, so a leak would be counted, not just time out.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// 18. Cloud metadata, by address and by names that resolve to it (allowed on purpose: a name
// rule never opens an internal address).
func (g *gateEnv) attack18(t *testing.T) {
	m := g.mark(t)
	s := g.script()
	cs := []int{
		s.curlBg("http://169.254.169.254/latest/meta-data/"),
		s.curlBg("http://169.254.170.2/v2/credentials"),
		s.curlBg("http://100.100.100.200/latest/meta-data/"),
		s.curlBg("http://meta.test/latest/meta-data/"),
		s.curlBg("-H", "Metadata-Flavor: Google", "http://metadata.google.internal/computeMetadata/v1/"),
		s.curlBg("--resolve", "metadata.google.internal:80:"+allowedIP, "http://metadata.google.internal/computeMetadata/v1/"),
	}
	pi := s.probes(
		pr("tcp", tcpTo, "-send", `GET / HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n`, allowedIP+":80"),
		pr("tcp", tcpTo, metadataIP+":2222"),
		pr("tcp", "-6", tcpTo, "[fd00:ec2::254]:80"),
		pr("tls", tcpTo, "-sni", "meta.test", allowedIP+":443"),
	)
	o := s.run(t)
	for _, ci := range cs {
		curlDenied(t, o.curl(t, ci))
	}
	p := o.probes(t, pi)
	if !strings.HasPrefix(p[0].Data, "HTTP/1.1 403") {
		t.Errorf("Host 169.254.169.254 sent to an allowed address: want the gate's 403, got %v", p[0])
	}
	refusedPromptly(t, metadataIP+":2222", p[1])
	refusedPromptly(t, "[fd00:ec2::254]:80", p[2])
	refusedPromptly(t, "SNI meta.test (allowed name, metadata address)", p[3])
	for _, ip := range []string{metadataIP, ecsIP, alibabaIP} {
		g.denied(t, m, match{Proto: "tcp", Dst: ip + ":80"})
	}
	// The guest's own lookup of meta.test gets the metadata address (the name is allowed);
	// its connection is then refused by address. Through the gate's own resolution (Host
	// and SNI sent to an allowed address), the record names the name.
	g.denied(t, m, match{Proto: "tcp", Name: "metadata.google.internal", Dst: allowedIP + ":80"})
	g.denied(t, m, match{Proto: "tcp", Name: "meta.test", Dst: allowedIP + ":443"})
}

// 19. The host's loopback and its own addresses, through the gateway or by name: the gate
// runs in the host's namespace, so a dial there would reach the host's own services (here:
// a listener on every host address, which must accept nothing).
func (g *gateEnv) attack19(t *testing.T) {
	m := g.mark(t)
	port := fmt.Sprint(g.host.port)
	whats := []string{"the gateway", "the host's veth address", "the host's LAN address", "hostself.test (→ the host)",
		"hostlan.test (→ the host's LAN address)", "SNI loop.test (→ 127.0.0.1)", "SNI hostself.test", "SNI localhost"}
	hostSpellings := []string{"localhost", "127.0.0.1", "0.0.0.0", "127.1", "2130706433", "0x7f000001", "[::ffff:127.0.0.1]",
		"[::1]", "localhost.", g.hostIP, inetHostAddr}
	var hcalls []call
	for _, h := range hostSpellings {
		hcalls = append(hcalls, pr("tcp", tcpTo, "-send", `GET / HTTP/1.1\r\nHost: `+h+`:`+port+`\r\nConnection: close\r\n\r\n`, allowedIP+":80"))
	}
	s := g.script()
	pi := s.parallel(
		pr("tcp", tcpTo, gatewayIP+":"+port),
		pr("tcp", tcpTo, inetHostAddr+":"+port),
		pr("tcp", tcpTo, g.hostIP+":"+port),
		pr("tcp", tcpTo, "hostself.test:"+port),
		pr("tcp", tcpTo, "hostlan.test:"+port),
		pr("tls", tcpTo, "-sni", "loop.test", allowedIP+":443"),
		pr("tls", tcpTo, "-sni", "hostself.test", allowedIP+":443"),
		pr("tls", tcpTo, "-sni", "localhost", allowedIP+":443"),
	)
	cs := []int{
		s.curlBg("--resolve", "loop.test:80:"+allowedIP, "http://loop.test/"),
		s.curlBg("--resolve", "hostself.test:80:"+allowedIP, "http://hostself.test/"),
		s.curlBg("--resolve", "hostlan.test:80:"+allowedIP, "http://hostlan.test/"),
	}
	hi := s.parallel(hcalls...)
	o := s.run(t)
	for i, r := range o.probes(t, pi) {
		refusedPromptly(t, whats[i], r)
	}
	for _, ci := range cs {
		curlDenied(t, o.curl(t, ci))
	}
	for i, r := range o.probes(t, hi) {
		if r.took() > promptly || (r.Data != "" && !strings.Contains(r.Data, "X-Moat-Denied")) {
			t.Errorf("Host %s:%s sent through the gate: want a prompt refusal by the gate, got %v", hostSpellings[i], port, r)
		}
	}
	for _, dst := range []string{gatewayIP + ":" + port, inetHostAddr + ":" + port, g.hostIP + ":" + port} {
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
	s := g.script()
	var denied []int
	for _, u := range []string{"http://" + lanIP + "/", "http://" + lan2IP + "/", "http://" + closedIP + "/", "http://" + cgnatIP + "/", "http://lan.test/", "http://cgnat.test/"} {
		denied = append(denied, s.curlBg(u))
	}
	byName := []int{
		s.curlBg("--resolve", "lan.test:80:"+allowedIP, "http://lan.test/"),
		s.curlBg("--resolve", "cgnat.test:80:"+allowedIP, "http://cgnat.test/"),
	}
	opened := s.curlBg("http://" + openedIP + "/")
	pi := s.parallel(
		pr("tcp", tcpTo, "lan.test:2222"),
		pr("tcp", "-6", tcpTo, "[64:ff9b::a01:203]:80"),
		pr("tcp", "-6", tcpTo, "[2002:a01:203::1]:80"),
		pr("tcp", "-6", tcpTo, "[2001:0:a01:203::1]:80"),
		pr("tcp", "-6", tcpTo, "[fd12:3456::1]:80"),
	)
	o := s.run(t)
	for _, ci := range append(denied, byName...) {
		curlDenied(t, o.curl(t, ci))
	}
	curlReached(t, o.curl(t, opened), "inet http "+openedIP+":80")
	for i, r := range o.probes(t, pi) {
		refusedPromptly(t, []string{"lan.test:2222", "NAT64 of " + lanIP, "6to4 of " + lanIP, "Teredo", "IPv6 ULA"}[i], r)
	}
	for _, ip := range []string{lanIP, lan2IP, closedIP, cgnatIP} {
		g.denied(t, m, match{Proto: "tcp", Dst: ip + ":80"})
	}
	g.denied(t, m, match{Proto: "tcp", Name: "lan.test", Dst: allowedIP + ":80"})
	g.denied(t, m, match{Proto: "tcp", Name: "cgnat.test", Dst: allowedIP + ":80"})
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
	// No policy of its own: the default one would pre-resolve its names at the test DNS server.
	if err := os.WriteFile(filepath.Join(peer.dir, "moat.toml"), []byte("[network]\nuse = [\"none\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
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
		pr("tcp", tcpTo, guestIP+":7777"),
		pr("tcp", tcpTo, "10.88.0.3:7777"),
		pr("tcp", tcpTo, "10.88.1.2:7777"),
		pr("tcp", tcpTo, gatewayIP+":7777"),
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
	whats := []string{"gateway :80", "gateway :443 with an allowed SNI", "gateway :22", "gateway :853", "SNI gw.test (→ the gateway)", "gw.test:8080"}
	p := g.probes(t,
		pr("tcp", tcpTo, "-send", `GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n`, gatewayIP+":80"),
		pr("tls", tcpTo, "-sni", "allowed.test", "-ca", g.ca, gatewayIP+":443"),
		pr("tcp", tcpTo, gatewayIP+":22"),
		pr("tcp", tcpTo, gatewayIP+":853"),
		pr("tls", tcpTo, "-sni", "gw.test", allowedIP+":443"),
		pr("tcp", tcpTo, "gw.test:8080"),
		pr("tcp", tcpTo, "-send", `GET / HTTP/1.1\r\nHost: `+gatewayIP+`\r\n\r\n`, allowedIP+":80"),
		pr("dns", "-tcp", gatewayIP+":53", "allowed.test", "A"), // the one service the gateway offers
	)
	for i, what := range whats {
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
