package inet

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// clientTimeout bounds every exchange of these tests; all of them stay on one host.
const clientTimeout = 5 * time.Second

// TestNet uses every server from the host namespace, as the gate would, then checks that
// cleanup left nothing behind.
func TestNet(t *testing.T) {
	var ns, hostIf string
	t.Run("serve", func(t *testing.T) {
		n := Start(t)
		ns, hostIf = n.NS, n.HostIf
		t.Run("dns", func(t *testing.T) { testDNS(t, n) })
		t.Run("http", func(t *testing.T) { testHTTP(t, n) })
		t.Run("https", func(t *testing.T) { testHTTPS(t, n) })
		t.Run("tcp", func(t *testing.T) { testTCP(t, n) })
		t.Run("udp", func(t *testing.T) { testUDP(t, n) })
		t.Run("download", func(t *testing.T) { testDownload(t, n) })
		t.Run("private", func(t *testing.T) { testPrivate(t, n) })
		t.Run("exec", func(t *testing.T) { testExec(t, n) })
	})
	if ns == "" {
		return // skipped: not root
	}
	assertGone(t, ns, hostIf)
}

func testDNS(t *testing.T, n *Net) {
	n.SetA("allowed.test", "198.51.100.10")
	n.SetCNAME("www.allowed.test", "allowed.test")
	long := strings.Repeat("x", 300)
	n.SetTXT("allowed.test", "v=test", long)

	r := exchange(t, n, "udp", "www.allowed.test.", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || !r.Authoritative {
		t.Fatalf("www.allowed.test A: rcode %s, aa %v; want NOERROR, authoritative", dns.RcodeToString[r.Rcode], r.Authoritative)
	}
	if got, want := answers(r), []string{"CNAME allowed.test.", "A 198.51.100.10"}; !slices.Equal(got, want) {
		t.Errorf("www.allowed.test A: got %q, want %q", got, want)
	}
	if r := exchange(t, n, "udp", "nope.test.", dns.TypeA); r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 {
		t.Errorf("nope.test A: rcode %s with %d authority records, want NXDOMAIN with an SOA", dns.RcodeToString[r.Rcode], len(r.Ns))
	}
	if r := exchange(t, n, "udp", "allowed.test.", dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("allowed.test AAAA: rcode %s, %d answers; want NOERROR and none", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	r = exchange(t, n, "tcp", "allowed.test.", dns.TypeTXT)
	if got, want := answers(r), []string{"TXT v=test", "TXT " + long[:255] + "|" + long[255:]}; !slices.Equal(got, want) {
		t.Errorf("allowed.test TXT over TCP: got %q, want %q", got, want)
	}

	// A dropped query goes unanswered but is logged; the retry is answered.
	n.DropFirst(1)
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	c := &dns.Client{Net: "udp", Timeout: 300 * time.Millisecond}
	if _, _, err := c.Exchange(m, n.DNS.String()); err == nil {
		t.Errorf("query after DropFirst(1) was answered")
	}
	if got := answers(exchange(t, n, "udp", "ALLOWED.test.", dns.TypeA)); !slices.Equal(got, []string{"A 198.51.100.10"}) {
		t.Errorf("ALLOWED.test A after the drop: got %q", got)
	}

	want := []string{"www.allowed.test A", "nope.test A", "allowed.test AAAA", "allowed.test TXT", "allowed.test A", "ALLOWED.test A"}
	if got := n.Queries(); !slices.Equal(got, want) {
		t.Errorf("Queries() = %q, want %q", got, want)
	}
	for name, want := range map[string]int{"allowed.test": 5, "www.allowed.test": 1, "nope.test.": 1, "evil.test": 0, "test": 6} {
		if got := n.Asked(name); got != want {
			t.Errorf("Asked(%q) = %d, want %d", name, got, want)
		}
	}
	n.ResetQueries()
	if got := n.Queries(); len(got) != 0 {
		t.Errorf("Queries() after ResetQueries = %q", got)
	}
}

func exchange(t *testing.T, n *Net, proto, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	c := &dns.Client{Net: proto, Timeout: clientTimeout}
	r, _, err := c.Exchange(m, n.DNS.String())
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], proto, err)
	}
	return r
}

func answers(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, "A "+rr.A.String())
		case *dns.CNAME:
			out = append(out, "CNAME "+rr.Target)
		case *dns.TXT:
			out = append(out, "TXT "+strings.Join(rr.Txt, "|"))
		default:
			out = append(out, rr.String())
		}
	}
	return out
}

func testHTTP(t *testing.T, n *Net) {
	web := n.HTTP(t, "198.51.100.10", 80, nil)
	idle := n.HTTP(t, "198.51.100.66", 80, nil)
	body := get(t, nil, "http://198.51.100.10/hello", "allowed.test", http.StatusOK)
	if want := "allowed.test/hello"; !strings.Contains(string(body), want) {
		t.Errorf("body %q does not name %s", body, want)
	}
	reqs := web.Requests()
	if len(reqs) != 1 {
		t.Fatalf("Requests() = %+v, want one", reqs)
	}
	if r := reqs[0]; r.Method != "GET" || r.Host != "allowed.test" || r.Path != "/hello" || r.Remote.Addr() != n.HostAddr {
		t.Errorf("request recorded as %+v; want GET allowed.test /hello from %s", r, n.HostAddr)
	}
	if web.Hits() != 1 || web.Conns() != 1 || web.BytesIn() == 0 || !web.Contacted() {
		t.Errorf("hits %d, conns %d, bytes in %d; want 1, 1, some", web.Hits(), web.Conns(), web.BytesIn())
	}
	if idle.Contacted() {
		t.Errorf("a server nobody called was contacted")
	}

	// A closed server refuses at once instead of hanging the test.
	idle.Close()
	if c, err := net.DialTimeout("tcp", idle.Addr.String(), clientTimeout); err == nil {
		c.Close()
		t.Errorf("dialing a closed server succeeded")
	}
}

func testHTTPS(t *testing.T, n *Net) {
	sec := n.HTTPS(t, "198.51.100.11", 443, []string{"secure.test"}, nil)
	tr := &http.Transport{Proxy: nil, TLSClientConfig: n.CA().ClientConfig("secure.test"), DisableKeepAlives: true}
	get(t, tr, "https://198.51.100.11/x", "secure.test", http.StatusOK)
	if got := sec.SNIs(); !slices.Equal(got, []string{"secure.test"}) {
		t.Errorf("SNIs() = %q, want [secure.test]", got)
	}
	if reqs := sec.Requests(); len(reqs) != 1 || reqs[0].SNI != "secure.test" || reqs[0].Host != "secure.test" {
		t.Errorf("Requests() = %+v, want one for secure.test with SNI secure.test", reqs)
	}

	// Nothing but the Net's CA vouches for the certificate, and its PEM is what a guest needs.
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: clientTimeout}, "tcp", sec.Addr.String(), &tls.Config{ServerName: "secure.test"})
	if err == nil {
		c.Close()
		t.Errorf("the system roots trusted the test CA")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(n.CA().PEM) {
		t.Errorf("CA().PEM does not parse")
	}
	if got := sec.SNIs(); len(got) != 2 || sec.Conns() != 2 || sec.Hits() != 1 {
		t.Errorf("after a failed handshake: SNIs %q, conns %d, hits %d; want 2, 2, 1", got, sec.Conns(), sec.Hits())
	}
}

func testTCP(t *testing.T, n *Net) {
	const banner = "SSH-2.0-inet\r\n"
	ssh := n.TCP(t, "198.51.100.22", 22, banner)
	c, err := net.DialTimeout("tcp", ssh.Addr.String(), clientTimeout)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(clientTimeout))
	got := make([]byte, len(banner))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != banner {
		t.Fatalf("banner: got %q, %v; want %q", got, err, banner)
	}
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	deadline := time.Now().Add(clientTimeout)
	for ssh.BytesIn() < 6 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if p := ssh.Payloads(); len(p) != 1 || string(p[0]) != "hello\n" || ssh.Hits() != 1 {
		t.Errorf("Payloads() = %q, hits %d; want [hello\\n], 1", p, ssh.Hits())
	}
}

func testUDP(t *testing.T, n *Net) {
	u := n.UDP(t, "198.51.100.23", 9999)
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(u.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(clientTimeout))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	k, err := c.Read(buf)
	if err != nil || string(buf[:k]) != "ping" {
		t.Fatalf("echo: got %q, %v; want ping", buf[:k], err)
	}
	if p := u.Payloads(); len(p) != 1 || string(p[0]) != "ping" || u.Hits() != 1 || u.Conns() != 0 {
		t.Errorf("Payloads() = %q, hits %d, conns %d; want [ping], 1, 0", p, u.Hits(), u.Conns())
	}
}

func testDownload(t *testing.T, n *Net) {
	d := n.Download(t, "198.51.100.30", 8080, 3<<20)
	base := "http://" + d.Addr.String()
	if body := get(t, nil, base+"/", "", http.StatusOK); len(body) != 3<<20 || bytes.ContainsFunc(body, func(r rune) bool { return r != 0 }) {
		t.Errorf("GET /: %d bytes, want %d zeros", len(body), 3<<20)
	}
	if body := get(t, nil, base+"/bytes?n=12345", "", http.StatusOK); len(body) != 12345 {
		t.Errorf("GET /bytes?n=12345: %d bytes", len(body))
	}
	b := n.HTTP(t, "198.51.100.30", 8081, Bytes())
	get(t, nil, "http://"+b.Addr.String()+"/bytes", "", http.StatusBadRequest)
	if body := get(t, nil, "http://"+b.Addr.String()+"/bytes?n=7", "", http.StatusOK); len(body) != 7 {
		t.Errorf("Bytes() with n=7: %d bytes", len(body))
	}
}

// testPrivate shows an internal-target server: a private address the host routes into the
// namespace for the Net's lifetime.
func testPrivate(t *testing.T, n *Net) {
	p := n.HTTP(t, "10.254.0.5", 80, nil)
	get(t, nil, "http://10.254.0.5/", "", http.StatusOK)
	if reqs := p.Requests(); len(reqs) != 1 || reqs[0].Remote.Addr() != n.HostAddr {
		t.Errorf("Requests() = %+v, want one from %s", reqs, n.HostAddr)
	}
}

func testExec(t *testing.T, n *Net) {
	out, err := n.Exec(t, "ip", "-4", "-o", "addr", "show", "dev", nsLink)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, want := range []string{"198.51.100.254/24", "198.51.100.53/32", "198.51.100.10/32", "10.254.0.5/32"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("namespace addresses lack %s:\n%s", want, out)
		}
	}
}

// get fetches url with the given Host header (none: from url) and wants status.
func get(t *testing.T, tr http.RoundTripper, url, host string, status int) []byte {
	t.Helper()
	if tr == nil {
		// Never a proxy from the environment: these requests stay on this host.
		tr = &http.Transport{Proxy: nil, DisableKeepAlives: true}
	}
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	if resp.StatusCode != status {
		t.Fatalf("GET %s: %s, want %d", url, resp.Status, status)
	}
	return body
}

func assertGone(t *testing.T, ns, hostIf string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == ns {
			t.Errorf("namespace %s survived cleanup", ns)
		}
	}
	out, err = exec.Command("ip", "-o", "link").CombinedOutput()
	if err != nil {
		t.Fatalf("ip link: %v: %s", err, out)
	}
	if strings.Contains(string(out), " "+hostIf+"@") || strings.Contains(string(out), " "+hostIf+":") {
		t.Errorf("link %s survived cleanup:\n%s", hostIf, out)
	}
}

// TestParallel starts two Nets at once: the host lock makes the second wait for the first's
// cleanup instead of clashing over 198.51.100.0/24.
func TestParallel(t *testing.T) {
	for i := range 2 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			n := Start(t)
			s := n.HTTP(t, "198.51.100.10", 80, nil)
			get(t, nil, "http://198.51.100.10/", "", http.StatusOK)
			if s.Hits() != 1 {
				t.Errorf("hits %d, want 1", s.Hits())
			}
		})
	}
}

// TestStale shows that Start removes what a crashed run left: a namespace and a host link with
// the Net prefixes.
func TestStale(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create namespaces; run as root (./scripts/test.sh)")
	}
	pid := strconv.Itoa(os.Getpid())
	ns, link := nsPrefix+"stale-"+pid, linkPrefix+"st"+strconv.FormatInt(int64(os.Getpid()), 36)
	// Both veth ends on the host, without addresses: a real leftover would carry
	// 198.51.100.1/24, but adding that outside the lock could clash with a live Net of another
	// package.
	for _, args := range [][]string{{"netns", "add", ns}, {"link", "add", link, "type", "veth", "peer", "name", link + "p"}} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = ip("netns", "del", ns)
		_ = ip("link", "del", link)
	})
	Start(t)
	if exists("/run/netns/" + ns) {
		t.Errorf("stale namespace %s survived Start", ns)
	}
	if exists("/sys/class/net/"+link) || exists("/sys/class/net/"+link+"p") {
		t.Errorf("stale link %s survived Start", link)
	}
}

func TestCheckHostAddr(t *testing.T) {
	for _, tc := range []struct {
		ip string
		ok bool
	}{
		{"198.51.100.10", true},
		{"198.51.100.254", true},
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"192.168.1.1", true},
		{"100.64.0.1", true},
		{"169.254.169.254", true},
		{"198.51.100.1", false}, // the host end
		{"192.0.2.9", false},    // the host's own network
		{"203.0.113.9", false},  // the registries' route
		{"8.8.8.8", false},      // public
		{"127.0.0.1", false},
		{"0.0.0.0", false},
		{"224.0.0.1", false},
		{"2001:db8::1", false},
	} {
		err := checkHostAddr(netip.MustParseAddr(tc.ip))
		if (err == nil) != tc.ok {
			t.Errorf("checkHostAddr(%s) = %v, want ok %v", tc.ip, err, tc.ok)
		}
	}
}

// TestZone checks the DNS answers without a network.
func TestZone(t *testing.T) {
	n := &Net{zone: newZone()}
	n.SetA("a.test", "198.51.100.10", "198.51.100.11")
	n.SetAAAA("a.test", "2001:db8::1")
	n.SetCNAME("alias.test", "a.test")
	n.SetCNAME("loop1.test", "loop2.test")
	n.SetCNAME("loop2.test", "loop1.test")
	n.SetCNAME("dangling.test", "gone.test")
	n.SetA("deep.empty.test", "198.51.100.12")
	n.SetTTL(7)
	for _, tc := range []struct {
		name  string
		qtype uint16
		rcode int
		want  []string
	}{
		{"a.test.", dns.TypeA, dns.RcodeSuccess, []string{"A 198.51.100.10", "A 198.51.100.11"}},
		{"A.Test.", dns.TypeA, dns.RcodeSuccess, []string{"A 198.51.100.10", "A 198.51.100.11"}},
		{"a.test.", dns.TypeAAAA, dns.RcodeSuccess, []string{"a.test.\t7\tIN\tAAAA\t2001:db8::1"}},
		{"a.test.", dns.TypeMX, dns.RcodeSuccess, nil},
		{"alias.test.", dns.TypeA, dns.RcodeSuccess, []string{"CNAME a.test.", "A 198.51.100.10", "A 198.51.100.11"}},
		{"alias.test.", dns.TypeCNAME, dns.RcodeSuccess, []string{"CNAME a.test."}},
		{"dangling.test.", dns.TypeA, dns.RcodeNameError, []string{"CNAME gone.test."}},
		{"empty.test.", dns.TypeA, dns.RcodeSuccess, nil},
		{"nope.test.", dns.TypeA, dns.RcodeNameError, nil},
		{"loop1.test.", dns.TypeA, dns.RcodeSuccess, slices.Repeat([]string{"CNAME loop2.test.", "CNAME loop1.test."}, maxCNAMEHops/2)},
	} {
		m := new(dns.Msg)
		m.SetQuestion(tc.name, tc.qtype)
		r := n.zone.answer(m)
		if got := answers(r); r.Rcode != tc.rcode || !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: %s %q, want %s %q", tc.name, dns.TypeToString[tc.qtype], dns.RcodeToString[r.Rcode], got, dns.RcodeToString[tc.rcode], tc.want)
		}
		for _, rr := range r.Answer {
			if rr.Header().Ttl != 7 {
				t.Errorf("%s: TTL %d, want 7", rr.Header().Name, rr.Header().Ttl)
			}
		}
		if len(tc.want) == 0 && (len(r.Ns) != 1 || r.Ns[0].Header().Name != "test.") {
			t.Errorf("%s %s: authority %v, want the test. SOA", tc.name, dns.TypeToString[tc.qtype], r.Ns)
		}
	}
	// Answers keep the spelling of the question, as 0x20-randomising resolvers check.
	m := new(dns.Msg)
	m.SetQuestion("A.Test.", dns.TypeA)
	if r := n.zone.answer(m); r.Answer[0].Header().Name != "A.Test." {
		t.Errorf("owner %q, want A.Test.", r.Answer[0].Header().Name)
	}
}
