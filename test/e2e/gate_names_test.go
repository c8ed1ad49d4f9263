package e2e

// Name versus destination (threat model 9-13, without TLS termination): subtests of TestGate
// (gate_test.go has the sandbox, the servers and the leak check every subtest runs under).

import (
	"strings"
	"testing"
)

// 9. An allowed SNI sent to the attacker's address: the gate dials what it resolves for the
// SNI, never the address the guest chose. The attacker's certificate covers allowed.test too,
// so only its counters (zero) and the body (naming the allowed server) tell where it went.
func (g *gateEnv) attack09(t *testing.T) {
	m := g.mark(t)
	snis := len(g.srv["allowed:443"].SNIs())
	s := g.script()
	ci := s.curl("--resolve", "allowed.test:443:"+evilIP, "--cacert", g.ca, "https://allowed.test/")
	oi := s.shell(`printf 'GET /s_client HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n' | timeout 8 openssl s_client -quiet -connect ` + evilIP + `:443 -servername allowed.test -CAfile ` + shQuote(g.ca) + ` -verify_return_error; echo " exit=$?"`)
	o := s.run(t)
	curlReached(t, o.curl(t, ci), "inet https "+allowedIP+":443 allowed.test/")
	if out := o.text(oi); !strings.Contains(out, "inet https "+allowedIP+":443 allowed.test/s_client") {
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
	s := g.script()
	// One sudo for all the edits: the guest's root is the attacker here.
	s.shell(`sudo -n sh -c 'cp /etc/hosts /tmp/moat-hosts.orig; cp /etc/resolv.conf /tmp/moat-resolv.orig; echo "` + evilIP + ` allowed.test port.test" >>/etc/hosts'`)
	hosts := []int{
		s.curl("http://allowed.test/hosts"),
		s.curl("--cacert", g.ca, "https://allowed.test/hosts"),
		s.probes(pr("tcp", "-read", "-timeout", "2s", "port.test:2222")),
	}
	s.shell(`sudo -n sh -c 'cp /tmp/moat-hosts.orig /etc/hosts; echo "nameserver 127.0.0.1" >/etc/resolv.conf; (` + shQuote(g.probe, "servedns", "-timeout", "8s", "127.0.0.1:53", evilIP) + ` >/tmp/moat-servedns.json 2>&1 &)'
for i in 1 2 3 4 5 6 7 8 9 10; do ` + shQuote(g.probe, "dns", "-timeout", "300ms", "127.0.0.1:53", "x.test", "A") + ` | grep -q '"ok":true' && break; sleep 0.1; done`)
	resolver := []int{
		s.curl("http://allowed.test/resolver"),
		s.curl("--cacert", g.ca, "https://allowed.test/resolver"),
		s.probes(pr("tcp", "-read", "-timeout", "2s", "port.test:2222")),
	}
	restored := s.shell(`sudo -n sh -c 'cp /tmp/moat-hosts.orig /etc/hosts; cp /tmp/moat-resolv.orig /etc/resolv.conf'; cat /etc/resolv.conf; grep -c allowed.test /etc/hosts`)
	o := s.run(t)
	for name, steps := range map[string][]int{"hosts": hosts, "resolver": resolver} {
		curlReached(t, o.curl(t, steps[0]), "inet http "+allowedIP+":80 allowed.test/"+name)
		curlReached(t, o.curl(t, steps[1]), "inet https "+allowedIP+":443 allowed.test/"+name)
		refusedPromptly(t, name+": port.test (rule port.test:2222) pointed at the attacker", o.probes(t, steps[2])[0])
	}
	if out := o.text(restored); !strings.Contains(out, "nameserver "+gatewayIP) || !strings.HasSuffix(strings.TrimSpace(out), "0") {
		t.Fatalf("the guest's resolv.conf or hosts were not restored; later subtests would be wrong:\n%s", out)
	}
	if a, ok := g.expect(t, m, match{Proto: "tcp", Dst: evilIP + ":80", Name: "allowed.test", Verdict: "allow"}); ok && a.Upstream != allowedIP+":80" {
		t.Errorf("allowed.test pointed at the attacker: the gate dialed %q, want %s:80", a.Upstream, allowedIP)
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
		pr("tls", tcpTo, "-sni", "allowed.test", "-host", "evil.test", "-ca", g.ca, allowedIP+":443"),
		pr("tcp", tcpTo, "-send", `GET /fronted HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n`, allowedIP+":80"),
		pr("tcp", tcpTo, "-send", `GET /one HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n`, allowedIP+":80"),
		pr("tcp", tcpTo, "-send", `GET /front HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n`, evilIP+":80"),
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
	whats := []string{"", "split ClientHello, denied SNI", "ECH to the allowed host's address", "ECH to the attacker",
		"no SNI to the attacker", "no SNI to an allowed host's address", "IP address as server name"}
	p := g.probes(t,
		pr("tls", "-timeout", "20s", "-split", "-sni", "allowed.test", "-ca", g.ca, allowedIP+":443"),
		pr("tls", tcpTo, "-split", "-sni", "evil.test", "-ca", g.ca, evilIP+":443"),
		pr("tls", tcpTo, "-ech", "-sni", "allowed.test", "-inner", "evil.test", allowedIP+":443"),
		pr("tls", tcpTo, "-ech", "-sni", "allowed.test", "-inner", "evil.test", evilIP+":443"),
		pr("tls", tcpTo, "-nosni", evilIP+":443"),
		pr("tls", tcpTo, "-nosni", allowedIP+":443"),
		pr("tls", tcpTo, "-sni", allowedIP, "-ca", g.ca, allowedIP+":443"), // an IP as server name: Go sends no SNI
	)
	if !p[0].OK || !strings.Contains(p[0].Data, "inet https "+allowedIP+":443 allowed.test/") {
		t.Errorf("ClientHello split into 1-byte segments, allowed SNI: want the page, got %v", p[0])
	}
	for i := 1; i < len(p); i++ {
		refusedPromptly(t, whats[i], p[i])
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
	const allow, deny = true, false
	cases := []struct {
		args  []string
		allow bool
		body  string // for allow: the server and Host it must reach (case-insensitive)
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
	evilHosts := []string{
		"allowed.test@evil.test", "evil.test", "EVIL.TEST", "evil.test.", "evil.test:80",
		"allowed.test.evil.test", "allowed%2etest", "evil%2etest", "allowed.test evil.test",
		`allowed.test\tevil.test`, ".evil.test", "evil.test..",
	}
	s := g.script()
	var cs []int
	for _, c := range cases {
		cs = append(cs, s.curlBg(c.args...))
	}
	var calls []call
	for _, h := range evilHosts {
		calls = append(calls, pr("tcp", tcpTo, "-send", `GET / HTTP/1.1\r\nHost: `+h+`\r\nConnection: close\r\n\r\n`, evilIP+":80"))
	}
	hostsStep := s.parallel(calls...)
	other := s.parallel(
		pr("tcp", tcpTo, "-send", `GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\nConnection: close\r\n\r\n`, evilIP+":80"),
		pr("tcp", tcpTo, "-send", `GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n`, evilIP+":80"),
		pr("tls", tcpTo, "-sni", "ALLOWED.TEST", "-ca", g.ca, evilIP+":443"),
		pr("tls", tcpTo, "-sni", "EVIL.TEST", "-ca", g.ca, evilIP+":443"),
		pr("tls", tcpTo, "-sni", "allowed.test.evil.test", "-ca", g.ca, evilIP+":443"),
		pr("tcp", "-read", "-timeout", "1s", "port.test:2222"),
		pr("tcp", "-read", "-timeout", "1s", "PORT.TEST.:2222"),
		pr("tcp", tcpTo, "port.test:2223"),
	)
	o := s.run(t)
	for i, c := range cases {
		r := o.curl(t, cs[i])
		if c.allow {
			r.body = strings.ToLower(r.body)
			curlReached(t, r, strings.ToLower(c.body))
		} else {
			curlDenied(t, r)
		}
	}
	for i, r := range o.probes(t, hostsStep) {
		if strings.Contains(r.Data, " 200 ") || r.took() > promptly || (r.Data != "" && !strings.Contains(r.Data, "X-Moat-Denied")) {
			t.Errorf("Host %q to the attacker's address: want a prompt refusal by the gate, got %v", evilHosts[i], r)
		}
	}
	p := o.probes(t, other)
	if strings.Contains(p[0].Data, " 200 ") && strings.Contains(p[0].Data, "evil.test") {
		t.Errorf("two Host headers: the evil one was served: %v", p[0])
	}
	if strings.Contains(p[1].Data, "EVIL") {
		t.Errorf("absolute-form request for evil.test with Host allowed.test reached the attacker: %v", p[1])
	}
	if !p[2].OK || !strings.Contains(p[2].Data, "inet https "+allowedIP) {
		t.Errorf("SNI ALLOWED.TEST to the attacker's address: want the allowed server, got %v", p[2])
	}
	refusedPromptly(t, "SNI EVIL.TEST", p[3])
	refusedPromptly(t, "SNI allowed.test.evil.test", p[4])
	for i, what := range []string{"port.test:2222", "PORT.TEST.:2222"} {
		if r := p[5+i]; !r.OK || !strings.HasPrefix(r.Data, portBanner) {
			t.Errorf("%s (rule port.test:2222): want its banner, got %v", what, r)
		}
	}
	refusedPromptly(t, "port.test:2223 (rule port.test:2222)", p[7])
	g.denied(t, m, match{Proto: "tcp", Name: "wild.test"})
	g.denied(t, m, match{Proto: "tcp", Name: "blocked.wild.test"})
	g.denied(t, m, match{Proto: "tcp", Name: "port.test", Dst: "*:2223"})
	g.denied(t, m, match{Proto: "tcp", Name: homoglyph})
	g.noAllow(t, m, match{Name: "evil.test"})
	g.noAllow(t, m, match{Name: "wild.test"})
	g.noAllow(t, m, match{Name: "blocked.wild.test"})
}
