package gateserve

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/termtest"
	"moat.dev/moat/test/inet"
)

// fixture is a running service with two tenants' client namespaces and an
// upstream internet whose DNS server logs every query.
type fixture struct {
	n              *inet.Net
	svc            *Service
	cfg            *Config
	a, b           *clientNS
	roots          *x509.CertPool // the service's CA, as a client gets it
	canary         string         // the real secret value
	placeholder    string         // alpha's placeholder for it, from its file
	alphaPolicy    string
	logs           *termtest.Screen
	allowed        *inet.Server
	secretSrv      *inet.Server
	other, denied  *inet.Server
	betaSrv        *inet.Server
	metadataServed *inet.Server
	// slow gets each request to /slow as it arrives; the upstream answers
	// it after the query's d (at most 30 s).
	slow chan string
	// stop ends Serve's context and waits for it to return (at most
	// 10 s); the test's cleanup calls it too.
	stop func()
}

const alphaRules = `
[network]
use = ["none"]
allow = ["allowed.test", "secret.test", "other.test", "metadata.test"]
inspect = true
trust = ["%[1]s"]

[secrets.API_TOKEN]
from = "env:MOAT_GATESERVE_TEST_TOKEN"
hosts = ["secret.test"]
require = true
`

const betaRules = `
[network]
use = ["none"]
allow = ["beta.test", "secret.test"]
inspect = true
trust = ["%[1]s"]
`

func start(t *testing.T, opts ...func(*Options)) *fixture {
	n := inet.Start(t) // skips without root
	f := &fixture{n: n, logs: &termtest.Screen{}, slow: make(chan string, 16)}
	mux := http.NewServeMux()
	mux.Handle("/events", inet.SSE(5, 300*time.Millisecond))
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		d, _ := time.ParseDuration(r.URL.Query().Get("d"))
		select {
		case f.slow <- r.URL.RequestURI():
		default:
		}
		select {
		case <-time.After(min(d, 30*time.Second)):
			fmt.Fprintf(w, "slow %s\n", r.URL.RequestURI())
		case <-r.Context().Done():
		}
	})
	mux.Handle("/", inet.Echo())
	for _, h := range []struct {
		name, ip string
		srv      **inet.Server
	}{
		{"allowed.test", "198.51.100.10", &f.allowed}, {"secret.test", "198.51.100.11", &f.secretSrv},
		{"other.test", "198.51.100.12", &f.other}, {"beta.test", "198.51.100.13", &f.betaSrv},
		{"denied.test", "198.51.100.14", &f.denied},
	} {
		n.SetA(h.name, h.ip)
		*h.srv = n.HTTPS(t, h.ip, 443, []string{h.name}, mux)
	}
	// An allowed name that resolves to the metadata address: refused at
	// resolution and again at dial time. A server there would show a
	// leak.
	n.SetA("metadata.test", "169.254.169.254")
	f.metadataServed = n.HTTP(t, "169.254.169.254", 80, inet.Echo())

	f.a, f.b = newClientNS(t, 1), newClientNS(t, 2)
	dir := t.TempDir()
	trust := filepath.Join(dir, "upstream-ca.pem")
	must(t, os.WriteFile(trust, n.CA().PEM, 0o644))
	f.alphaPolicy = filepath.Join(dir, "alpha.toml")
	must(t, os.WriteFile(f.alphaPolicy, fmt.Appendf(nil, alphaRules, trust), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "beta.toml"), fmt.Appendf(nil, betaRules, trust), 0o644))
	conf := filepath.Join(dir, "gate.toml")
	must(t, os.WriteFile(conf, fmt.Appendf(nil, `
[service]
state_dir = "%[1]s/state"

[listen]
dns = ["%[2]s:53", "%[3]s:53"]
http = ["%[2]s:80", "%[3]s:80"]
https = ["%[2]s:443", "%[3]s:443"]
metrics = "%[2]s:9153"

[upstream]
dns = ["%[4]s"]

[tenants.alpha]
sources = ["%[5]s"]
policy = ["%[1]s/alpha.toml"]

[tenants.beta]
sources = ["%[6]s/32"]
policy = ["%[1]s/beta.toml"]
`, dir, f.a.gw, f.b.gw, n.DNS, f.a.addr, f.b.addr), 0o644))

	f.canary = "moat-canary-" + randHex(t, 16)
	t.Setenv("MOAT_GATESERVE_TEST_TOKEN", f.canary)
	cfg, err := LoadConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	f.cfg = cfg
	ls, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Config: cfg, Listeners: ls, Log: slog.New(slog.NewJSONHandler(f.logs, nil))}
	for _, opt := range opts {
		opt(&o)
	}
	svc, err := New(o)
	if err != nil {
		ls.Close()
		t.Fatal(err)
	}
	f.svc = svc
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		// Labelled for the CPU profiles of bench/gate-service.sh: the
		// service's goroutines and those they start, apart from the
		// upstream's in the same process.
		pprof.Do(ctx, pprof.Labels("moat", "service"), func(ctx context.Context) { svc.Serve(ctx) })
		close(done)
	}()
	f.stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the service did not stop within 10 s")
		}
	}
	t.Cleanup(f.stop)

	// What a client is handed: the CA's certificate and the placeholders.
	pem, err := os.ReadFile(cfg.CACert)
	if err != nil {
		t.Fatal(err)
	}
	f.roots = x509.NewCertPool()
	if !f.roots.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", cfg.CACert)
	}
	if bytes.Contains(pem, []byte("PRIVATE")) {
		t.Fatalf("%s holds a private key", cfg.CACert)
	}
	ph, err := readPlaceholders(cfg.Tenants[0].Placeholders)
	if err != nil || ph["API_TOKEN"] == "" {
		t.Fatalf("alpha's placeholders: %v, %v", ph, err)
	}
	f.placeholder = ph["API_TOKEN"]
	return f
}

func TestService(t *testing.T) {
	f := start(t)
	a, b := f.a, f.b

	t.Run("dns", func(t *testing.T) {
		f.n.ResetQueries()
		for _, proto := range []string{"udp", "tcp"} {
			for _, name := range []string{"allowed.test", "denied.test", "anything.invalid", "exfil-6d6f6174.denied.test"} {
				r, err := a.query(t, proto, name, dns.TypeA, netip.Addr{})
				if err != nil {
					t.Fatalf("%s over %s: %v", name, proto, err)
				}
				if got := answersOf(r); len(got) != 1 || got[0] != a.gw {
					t.Errorf("%s A over %s: %v (%s), want the service's own address %s", name, proto, got, dns.RcodeToString[r.Rcode], a.gw)
				}
			}
		}
		// Tenant beta asks at its own end of the service.
		if r, err := b.query(t, "udp", "beta.test", dns.TypeA, netip.Addr{}); err != nil || len(answersOf(r)) != 1 || answersOf(r)[0] != b.gw {
			t.Errorf("beta.test from beta: %v, %v; want %s", r, err, b.gw)
		}
		if got := f.n.Asked("allowed.test"); got == 0 {
			t.Errorf("the upstream was never asked for allowed.test: the positive control failed")
		}
		for _, name := range []string{"denied.test", "invalid"} {
			if got := f.n.Asked(name); got != 0 {
				t.Errorf("the upstream DNS server was asked %d times for %s (or below it): %q", got, name, f.n.Queries())
			}
		}
		// The metadata answer is left out: nothing to aim at.
		if r, err := a.query(t, "udp", "metadata.test", dns.TypeA, netip.Addr{}); err != nil || len(r.Answer) != 0 {
			t.Errorf("metadata.test: %v, %v; want no answer", r, err)
		}
	})

	t.Run("allowed https through the service's CA", func(t *testing.T) {
		resp := get(t, a.client(t, f.roots), "https://allowed.test/hello", nil)
		if resp.status != 200 || !strings.Contains(resp.body, `"path":"/hello"`) {
			t.Fatalf("GET https://allowed.test/hello: %d %s", resp.status, resp.body)
		}
		if !strings.Contains(resp.issuer, "moat") {
			t.Errorf("the client saw a certificate from %q, want the service's CA", resp.issuer)
		}
		if f.allowed.Hits() == 0 {
			t.Errorf("the upstream was not reached")
		}
	})

	t.Run("denied host gets 403 and a record naming the step", func(t *testing.T) {
		resp := get(t, a.client(t, f.roots), "https://denied.test/", nil)
		if resp.status != http.StatusForbidden || !strings.Contains(resp.body, "denied.test") {
			t.Errorf("GET https://denied.test/: %d %s; want 403 with a page naming it", resp.status, resp.body)
		}
		plain := get(t, a.client(t, f.roots), "http://denied.test/", nil)
		if plain.status != http.StatusForbidden {
			t.Errorf("GET http://denied.test/: %d, want 403", plain.status)
		}
		if f.denied.Contacted() {
			t.Errorf("the denied upstream was contacted")
		}
		r := waitRecord(t, f.cfg.Tenants[0].Audit, func(r audit.Record) bool {
			return r.Name == "denied.test" && r.Proto == "tcp" && r.Verdict == audit.Deny
		})
		if r.RejectedBy != audit.StepPolicy || len(r.Steps) == 0 || r.Sandbox != "alpha" {
			t.Errorf("denial record: rejected_by %q, steps %+v, tenant %q; want policy, a trace, alpha", r.RejectedBy, r.Steps, r.Sandbox)
		}
	})

	t.Run("refused address class", func(t *testing.T) {
		// An allowed name whose address is the metadata service, reached
		// by a client that knows the service's address anyway.
		resp := get(t, a.client(t, f.roots), "http://metadata.test/", map[string]string{"X-Resolve": a.gw.String()})
		if resp.status == 200 {
			t.Errorf("GET http://metadata.test/: 200, want a refusal")
		}
		if f.metadataServed.Contacted() {
			t.Errorf("the metadata address was contacted")
		}
		r := waitRecord(t, f.cfg.Tenants[0].Audit, func(r audit.Record) bool {
			return r.Name == "metadata.test" && r.Proto == "tcp" && r.Verdict == audit.Deny
		})
		if r.RejectedBy != audit.StepAddressClass {
			t.Errorf("metadata.test: rejected_by %q (%s), want %s", r.RejectedBy, r.Reason, audit.StepAddressClass)
		}
	})

	t.Run("secret swapped for its bound host only", func(t *testing.T) {
		hdr := map[string]string{"Authorization": "Bearer " + f.placeholder}
		resp := get(t, a.client(t, f.roots), "https://secret.test/", hdr)
		if resp.status != 200 {
			t.Fatalf("GET https://secret.test/: %d %s", resp.status, resp.body)
		}
		if got := lastAuth(f.secretSrv); got != "Bearer "+f.canary {
			t.Errorf("secret.test received Authorization %q, want the real value", got)
		}
		if strings.Contains(resp.body, f.canary) || strings.Contains(resp.header, f.canary) {
			t.Errorf("the echoed value reached the client unscrubbed")
		}
		// require: a substitute token to the bound host is refused by
		// the secrets step, and never reaches it.
		hits := f.secretSrv.Hits()
		sub := get(t, a.client(t, f.roots), "https://secret.test/substitute", map[string]string{"Authorization": "Bearer sk-substitute-token"})
		if sub.status != http.StatusForbidden || f.secretSrv.Hits() != hits {
			t.Errorf("a substitute token to secret.test: %d, upstream hits %d -> %d; want 403 and none", sub.status, hits, f.secretSrv.Hits())
		}
		rec := waitRecord(t, f.cfg.Tenants[0].Audit, func(r audit.Record) bool { return r.Path == "/substitute" })
		if rec.Verdict != audit.Deny || rec.RejectedBy != audit.StepSecrets {
			t.Errorf("the substitute's record: verdict %s, rejected_by %q; want deny by %s", rec.Verdict, rec.RejectedBy, audit.StepSecrets)
		}
		resp = get(t, a.client(t, f.roots), "https://other.test/", hdr)
		if resp.status != 200 {
			t.Fatalf("GET https://other.test/: %d %s", resp.status, resp.body)
		}
		if got := lastAuth(f.other); got != "Bearer "+f.placeholder {
			t.Errorf("other.test received Authorization %q, want the placeholder unchanged", got)
		}
	})

	t.Run("tenants do not share rules or secrets", func(t *testing.T) {
		if resp := get(t, b.client(t, f.roots), "https://allowed.test/", nil); resp.status != http.StatusForbidden {
			t.Errorf("beta GET https://allowed.test/ (alpha's rule): %d, want 403", resp.status)
		}
		if resp := get(t, b.client(t, f.roots), "https://beta.test/", nil); resp.status != 200 {
			t.Errorf("beta GET https://beta.test/ (its own rule): %d %s, want 200", resp.status, resp.body)
		}
		if resp := get(t, a.client(t, f.roots), "https://beta.test/", nil); resp.status != http.StatusForbidden {
			t.Errorf("alpha GET https://beta.test/ (beta's rule): %d, want 403", resp.status)
		}
		resp := get(t, b.client(t, f.roots), "https://secret.test/", map[string]string{"Authorization": "Bearer " + f.placeholder})
		if resp.status != 200 {
			t.Fatalf("beta GET https://secret.test/: %d %s", resp.status, resp.body)
		}
		if got := lastAuth(f.secretSrv); got != "Bearer "+f.placeholder {
			t.Errorf("beta's request with alpha's placeholder arrived as %q, want the placeholder unchanged", got)
		}
		waitRecord(t, f.cfg.Tenants[1].Audit, func(r audit.Record) bool { return r.Name == "allowed.test" && r.Verdict == audit.Deny })
		audit.Read(f.cfg.Tenants[1].Audit, func(r audit.Record) bool {
			if r.Sandbox != "beta" {
				t.Errorf("beta's audit holds a record of %q: %+v", r.Sandbox, r)
			}
			return true
		})
	})

	t.Run("unknown source gets nothing", func(t *testing.T) {
		r, err := a.query(t, "udp", "allowed.test", dns.TypeA, a.stray)
		if err != nil || r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("DNS from %s: %v, %v; want REFUSED", a.stray, r, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := a.dial(ctx, "tcp4", netip.AddrPortFrom(a.gw, 443).String(), a.stray)
		if err == nil {
			c.SetDeadline(time.Now().Add(3 * time.Second))
			c.Write([]byte("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"))
			n, rerr := c.Read(make([]byte, 64))
			c.Close()
			if n > 0 || rerr == nil {
				t.Errorf("a connection from %s got %d bytes, err %v; want a reset", a.stray, n, rerr)
			}
		}
		for _, proto := range []string{"dns", "tcp"} {
			rec := waitRecord(t, f.cfg.Audit, func(r audit.Record) bool { return r.Proto == proto })
			if rec.RejectedBy != audit.StepSource || !strings.Contains(string(rec.Reason), a.stray.String()) || rec.Verdict != audit.Deny {
				t.Errorf("unknown %s record: %+v", proto, rec)
			}
		}
	})

	t.Run("metrics and health", func(t *testing.T) {
		body := fetch(t, "http://"+f.cfg.Metrics.String()+"/metrics")
		for _, want := range []string{
			`moat_gate_decisions_total{proto="tcp",reason="no rule allows it",rejected_by="policy",tenant="alpha",verdict="deny"}`,
			`moat_gate_dns_answers_total{tenant="alpha",verdict="deny"}`,
			`moat_gate_bytes_total{direction="down",tenant="alpha"}`,
			`moat_gate_open_connections{tenant="alpha"}`,
			`tenant="",verdict="deny"`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
		if h := fetch(t, "http://"+f.cfg.Metrics.String()+"/healthz"); !strings.HasPrefix(h, "ok") {
			t.Errorf("healthz: %q", h)
		}
	})

	t.Run("reload keeps open connections", func(t *testing.T) {
		// An event stream through allowed.test stays open across a reload
		// that removes allowed.test; a new request then gets 403.
		cl := a.client(t, f.roots)
		resp, err := cl.Get("https://allowed.test/events?n=5&gap_ms=400")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		events := 0
		readEvent := func() bool {
			for {
				line, err := br.ReadString('\n')
				if strings.HasPrefix(line, "data: ") {
					events++
					return true
				}
				if err != nil {
					return false
				}
			}
		}
		if !readEvent() {
			t.Fatal("no first event")
		}
		rules := strings.Replace(mustRead(t, f.alphaPolicy), `"allowed.test", `, "", 1)
		must(t, os.WriteFile(f.alphaPolicy, []byte(rules), 0o644))
		if err := f.svc.Reload(); err != nil {
			t.Fatalf("reload: %v", err)
		}
		for readEvent() {
		}
		if events != 5 {
			t.Errorf("the stream opened before the reload carried %d of 5 events", events)
		}
		if r := get(t, a.client(t, f.roots), "https://allowed.test/", nil); r.status != http.StatusForbidden {
			t.Errorf("after the reload, GET https://allowed.test/: %d, want 403", r.status)
		}
		if r := get(t, a.client(t, f.roots), "https://other.test/", nil); r.status != 200 {
			t.Errorf("after the reload, GET https://other.test/: %d, want 200 (still allowed)", r.status)
		}
		// The placeholder survives the reload.
		if ph, _ := readPlaceholders(f.cfg.Tenants[0].Placeholders); ph["API_TOKEN"] != f.placeholder {
			t.Errorf("the placeholder changed on reload: %q -> %q", f.placeholder, ph["API_TOKEN"])
		}
		// What a reload cannot apply is refused whole.
		conf := mustRead(t, f.cfg.Path)
		must(t, os.WriteFile(f.cfg.Path, []byte(strings.Replace(conf, "[tenants.beta]", "[tenants.gamma]\nsources = [\"100.77.9.0/24\"]\npolicy = [\""+f.alphaPolicy+"\"]\n\n[tenants.beta]", 1)), 0o644))
		if err := f.svc.Reload(); err == nil || !strings.Contains(err.Error(), "restart") {
			t.Errorf("a reload adding a tenant: %v, want a refusal that says restart", err)
		}
		must(t, os.WriteFile(f.cfg.Path, []byte(conf), 0o644))
	})

	t.Run("the secret's value is nowhere", func(t *testing.T) {
		var sources []string
		for _, p := range []string{f.cfg.Audit, f.cfg.Tenants[0].Audit, f.cfg.Tenants[1].Audit, f.cfg.Tenants[0].Placeholders} {
			b, _ := os.ReadFile(p)
			nb, _ := os.ReadFile(audit.NoisePath(p))
			sources = append(sources, string(b)+string(nb))
		}
		sources = append(sources, f.logs.String(), fetch(t, "http://"+f.cfg.Metrics.String()+"/metrics"))
		for i, s := range sources {
			if n := strings.Count(s, f.canary); n != 0 {
				t.Errorf("source %d holds the secret's value %d times", i, n)
			}
		}
		// Positive control: the swap did happen, under the secret's name.
		waitRecord(t, f.cfg.Tenants[0].Audit, func(r audit.Record) bool {
			return len(r.Transforms) > 0 && strings.HasPrefix(r.Transforms[0], "API_TOKEN:")
		})
	})
}

type response struct {
	status       int
	body, header string
	issuer       string
}

// get fetches url with extra headers; X-Resolve pins the address dialed
// instead of asking the service's DNS.
func get(t *testing.T, cl *http.Client, url string, hdr map[string]string) response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "X-Resolve" {
			tr := cl.Transport.(*http.Transport).Clone()
			dial := tr.DialContext
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				_, port, _ := net.SplitHostPort(addr)
				return dial(ctx, network, net.JoinHostPort(v, port))
			}
			cl = &http.Client{Transport: tr, Timeout: cl.Timeout}
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return response{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	out := response{status: resp.StatusCode, body: string(b), header: fmt.Sprint(resp.Header)}
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		out.issuer = resp.TLS.PeerCertificates[0].Issuer.String()
	}
	return out
}

func lastAuth(s *inet.Server) string {
	reqs := s.Requests()
	if len(reqs) == 0 {
		return ""
	}
	return reqs[len(reqs)-1].Header.Get("Authorization")
}

// waitRecord waits up to 5 s for a record of the audit at path that
// matches (the log is written by its own goroutine).
func waitRecord(t *testing.T, path string, match func(audit.Record) bool) audit.Record {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var found *audit.Record
		audit.Read(path, func(r audit.Record) bool {
			if match(r) {
				found = &r
				return false
			}
			return true
		})
		if found != nil {
			return *found
		}
		if time.Now().After(deadline) {
			t.Fatalf("no matching record in %s within 5 s", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fetch(t *testing.T, url string) string {
	t.Helper()
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func answersOf(r *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ip)
		}
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	must(t, err)
	return string(b)
}

func randHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
