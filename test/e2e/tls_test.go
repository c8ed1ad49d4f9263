package e2e

// End-to-end tests of TLS inspection and credentials (docs/credentials.md;
// threat model 23-26): real clients in a real guest, through the real gate, against upstreams in the
// test internet that hold their own test CA, which the gate is told to trust.
//
// One sandbox carries every check (a start costs about a second). Its policy makes four kinds of
// HTTPS host:
//
//	up.test      intercepted because a secret (MOAT_UPKEY) is bound to it; the site of every
//	             client, protocol and streaming check
//	splice.test  allowed with no reason to intercept: spliced, its own certificate untouched
//	bound.test   intercepted; MOAT_CANARY is bound to it, with require
//	ro.test      intercepted because of a GET,HEAD rule; bound to nothing
//
// The secrets' values are random per run and reach moat only through its own environment
// (MOAT_TEST_CANARY, MOAT_TEST_UPKEY). TestTLS ends by searching every place a value could have
// been left for them: the state directory, the workspace, the guest's files and processes, and
// moat's own processes on the host.

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/test/inet"
)

const (
	upIP     = "198.51.100.10"
	spliceIP = "198.51.100.20"
	boundIP  = "198.51.100.30"
	roIP     = "198.51.100.40"

	// streamSize is the size of the large upload and download: far more than any buffer a gate
	// should hold, so one that buffered whole bodies would show in its peak RSS.
	streamSize = 200 << 20
	// daemonHWMBound is the most the daemon's peak RSS may reach over the whole test.
	daemonHWMBound = 200 << 20
	// tlsRunBound bounds one guest session of ordinary checks; streamRunBound the one moving
	// 400 MiB.
	tlsRunBound    = 30 * time.Second
	streamRunBound = 100 * time.Second
)

// tlsToml is the sandbox's policy; the %q are the test CA's path and MOAT_FILEKEY's file.
const tlsToml = `[network]
use = ["none"]
allow = ["up.test", "splice.test", "bound.test", "GET,HEAD ro.test/*"]
inspect = false
trust = [%q]

[secrets.MOAT_CANARY]
from = "env:MOAT_TEST_CANARY"
hosts = ["bound.test"]
header = "authorization"
query = "key"
require = true

[secrets.MOAT_UPKEY]
from = "env:MOAT_TEST_UPKEY"
hosts = ["up.test"]

[secrets.MOAT_FILEKEY]
from = "file:%s"
hosts = ["up.test"]
header = "x-file-key"
`

// tlsEnv is the sandbox of TestTLS and the test internet around it.
type tlsEnv struct {
	*gateEnv
	canary, upkey string // the secrets' real values: only the host may ever hold them
	// fileKey is MOAT_FILEKEY's file, outside the workspace; fileKeys every value it held.
	fileKey  string
	fileKeys []string
	gitRoot  string
	hwmStart int64 // the daemon's VmHWM right after start, bytes
}

func newTLSEnv(t *testing.T) *tlsEnv {
	t.Helper()
	n := inet.Start(t)
	e := &tlsEnv{canary: "mc" + randHex(t, 20), upkey: "mu" + randHex(t, 20), gitRoot: t.TempDir()}
	e.fileKey = filepath.Join(t.TempDir(), "filekey")
	e.fileKeys = []string{"mf" + randHex(t, 20)}
	if err := os.WriteFile(e.fileKey, []byte(e.fileKeys[0]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inet.GitRepo(t, e.gitRoot, "repo.git", map[string]string{"README": "cloned through the gate\n"})
	g := newGateEnv(t, n, "tls-e2e", "")
	e.gateEnv = g
	if err := os.WriteFile(filepath.Join(g.dir, "moat.toml"), []byte(fmt.Sprintf(tlsToml, g.ca, e.fileKey)), 0o644); err != nil {
		t.Fatal(err)
	}
	g.env = append(g.env, "MOAT_TEST_CANARY="+e.canary, "MOAT_TEST_UPKEY="+e.upkey)
	g.serve("up:443", n.HTTPS(t, upIP, 443, []string{"up.test"}, inet.Site(e.gitRoot)), false)
	g.serve("splice:443", n.HTTPS(t, spliceIP, 443, []string{"splice.test"}, inet.Site("")), false)
	g.serve("bound:443", n.HTTPS(t, boundIP, 443, []string{"bound.test"}, inet.Site("")), false)
	g.serve("bound:80", n.HTTP(t, boundIP, 80, inet.Site("")), false)
	g.serve("ro:443", n.HTTPS(t, roIP, 443, []string{"ro.test"}, inet.Site("")), false)
	for name, ip := range map[string]string{"up.test": upIP, "splice.test": spliceIP, "bound.test": boundIP, "ro.test": roIP} {
		n.SetA(name, ip)
	}
	// Guest-side helpers, in the workspace the guest sees at the same path.
	for name, body := range map[string]string{"ws.py": wsPy, "sse.py": ssePy} {
		if err := os.WriteFile(filepath.Join(g.dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The project's secrets and trusted root need the user's consent; on no terminal that is
	// --trust-project at create.
	start := time.Now()
	if r := moat(t, g.dir, g.env, "up", "--trust-project"); r.code != 0 {
		t.Fatalf("moat up --trust-project %s: exit %d\nstdout: %s\nstderr: %s\n%s", g.name, r.code, r.stdout, r.stderr, g.daemonLog())
	}
	t.Logf("sandbox %s up in %v", g.name, time.Since(start).Round(time.Millisecond))
	e.hwmStart = e.daemonHWM(t)
	return e
}

func randHex(t *testing.T, k int) string {
	t.Helper()
	b := make([]byte, k)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestTLS runs the TLS inspection and credential checks against one sandbox.
func TestTLS(t *testing.T) {
	e := newTLSEnv(t)
	for _, st := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"clients_through_interception", e.testClients},
		{"spliced_certificate_untouched", e.testSpliced},
		{"http2", e.testHTTP2},
		{"websocket", e.testWebSocket},
		{"sse_one_by_one", e.testSSE},
		{"get_only_rule_refuses_post", e.testGetOnly},
		{"canary_swapped_only_for_bound_host", e.testCanary},
		{"secrets_refresh", e.testRefresh},
		{"stream_200MiB_both_ways", e.testStream},
		// Last: after every other check has had its chance to leave a value somewhere.
		{"canary_nowhere", e.testNowhere},
	} {
		t.Run(st.name, st.f)
	}
}

// guest runs a shell script in the sandbox, bounded by within; the script must exit 0.
func (e *tlsEnv) guest(t *testing.T, within time.Duration, script string) string {
	t.Helper()
	start := time.Now()
	r := moat(t, e.dir, e.env, "run", "--", "sh", "-c", script)
	took := time.Since(start)
	t.Logf("guest session took %v", took.Round(time.Millisecond))
	if took > within {
		t.Errorf("one guest run took %v (bound %v)", took.Round(time.Millisecond), within)
	}
	if r.code != 0 {
		t.Fatalf("guest script failed: exit %d\nscript: %s\nstdout: %s\nstderr: %s\n%s", r.code, gateClip(script, 2000), gateTail(r.stdout, 40), r.stderr, e.daemonLog())
	}
	return r.stdout
}

// fields parses the "KEY=value" lines a guest script printed; later lines win.
func fields(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && k != "" && !strings.ContainsAny(k, " \t") {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// curl, git over HTTPS, node's fetch and python all reach an intercepted test
// upstream without certificate errors, trusting only what the guest trusts by default.
func (e *tlsEnv) testClients(t *testing.T) {
	m := e.mark(t)
	out := e.guest(t, tlsRunBound, `
echo "CURL=$(curl -sS --max-time 10 https://up.test/ 2>&1)"
d=$(mktemp -d)
echo "GIT=$(git clone -q https://up.test/git/repo.git "$d/repo" 2>&1 && cat "$d/repo/README")"
echo "NODE=$(node -v) $(node -e 'fetch("https://up.test/echo").then(async r => console.log(r.status, (await r.json()).host)).catch(e => console.log("ERR", String(e.cause || e)))' 2>&1)"
echo "URLLIB=$(python3 -c 'import json, urllib.request as u; r = u.urlopen("https://up.test/echo", timeout=10); print(r.status, json.load(r)["host"])' 2>&1 | tail -1)"
if python3 -c 'import requests' 2>/dev/null; then
  echo "REQUESTS=$(python3 -c 'import requests; r = requests.get("https://up.test/echo", timeout=10); print(r.status_code, r.json()["host"])' 2>&1 | tail -1)"
else
  echo "REQUESTS=not importable"
fi
echo "ISSUER=$(openssl s_client -connect up.test:443 -servername up.test </dev/null 2>/dev/null | openssl x509 -noout -issuer 2>&1)"
echo "NODE_CA=${NODE_EXTRA_CA_CERTS:-unset}"
echo "TRUST_ENV=REQUESTS_CA_BUNDLE=${REQUESTS_CA_BUNDLE:-unset} PIP_CERT=${PIP_CERT:-unset} SSL_CERT_FILE=${SSL_CERT_FILE:-unset}"
echo "SSL_CERT_FILE_CERTS=$(if [ -n "$SSL_CERT_FILE" ]; then grep -c 'BEGIN CERTIFICATE' "$SSL_CERT_FILE"; else echo unset; fi)"
`)
	f := fields(out)
	t.Logf("guest:\n%s", out)
	for _, c := range []struct{ key, want string }{
		{"CURL", "inet site up.test/"},
		{"GIT", "cloned through the gate"},
		{"NODE", "200 up.test"},
		{"URLLIB", "200 up.test"},
	} {
		if !strings.Contains(f[c.key], c.want) {
			t.Errorf("%s in the guest: got %q, want %q", c.key, f[c.key], c.want)
		}
	}
	if r := f["REQUESTS"]; r == "not importable" {
		t.Logf("python requests is not importable in the guest: only urllib was checked")
	} else if !strings.Contains(r, "200 up.test") {
		t.Errorf("python requests in the guest: got %q, want 200 up.test", r)
	}
	// Intercepted: the guest sees a leaf from the sandbox's CA, not the upstream's.
	if is := f["ISSUER"]; is == "" || strings.Contains(is, "moat test internet CA") {
		t.Errorf("up.test's issuer as the guest sees it: %q; want the sandbox's CA (up.test must be intercepted)", is)
	}
	if f["NODE_CA"] == "unset" {
		t.Errorf("the guest's sessions have no NODE_EXTRA_CA_CERTS")
	}
	// never a global SSL_CERT_FILE that holds only the sandbox's CA (it would make
	// every other upstream untrusted to clients that read it).
	if k := f["SSL_CERT_FILE_CERTS"]; k != "unset" && k != "" {
		if c, _ := strconv.Atoi(k); c < 2 {
			t.Errorf("the guest's SSL_CERT_FILE holds %s certificates: only the sandbox's CA", k)
		}
	}
	t.Logf("trust in the guest's environment: NODE_EXTRA_CA_CERTS=%s %s", f["NODE_CA"], f["TRUST_ENV"])
	var smart bool
	for _, r := range e.srv["up:443"].Requests() {
		smart = smart || r.Path == "/git/repo.git/git-upload-pack"
	}
	if !smart {
		t.Errorf("git never reached git-upload-pack on up.test: not a smart-HTTP clone")
	}
	e.expect(t, m, match{Proto: "tcp", Name: "up.test", Verdict: "allow"})
}

// A spliced host presents its own certificate, byte for byte.
func (e *tlsEnv) testSpliced(t *testing.T) {
	out := e.guest(t, tlsRunBound, fmt.Sprintf(`
echo "FP=$(openssl s_client -connect splice.test:443 -servername splice.test </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256 -issuer 2>&1 | tr '\n' ' ')"
echo "CURL=$(curl -sS --max-time 10 --cacert %s https://splice.test/ 2>&1)"
echo "CURL_SYSTEM=$(curl -sS --max-time 10 -o /dev/null -w '%%{http_code}' https://splice.test/ 2>&1)"
`, e.ca))
	f := fields(out)
	t.Logf("guest:\n%s", out)
	sum := sha256.Sum256(e.srv["splice:443"].Cert.Raw)
	want := strings.ToUpper(hex.EncodeToString(sum[:]))
	got := strings.ReplaceAll(strings.ToUpper(f["FP"]), ":", "")
	if !strings.Contains(got, want) || !strings.Contains(f["FP"], "moat test internet CA") {
		t.Errorf("splice.test's certificate in the guest: %q; want the upstream's own (sha256 %s, issuer moat test internet CA)", f["FP"], want)
	}
	if !strings.Contains(f["CURL"], "inet site splice.test/") {
		t.Errorf("curl to the spliced host with the upstream's CA: %q", f["CURL"])
	}
	// [network] trust lists the test internet's CA, so the guest's own store holds it too and
	// accepts the upstream's certificate (TestTrustSplicedHost shows the refusal without it).
	if !strings.HasPrefix(f["CURL_SYSTEM"], "200") {
		t.Errorf("curl to the spliced host trusting the system store: %q; want 200 (the [network] trust roots are in the guest's store)", f["CURL_SYSTEM"])
	}
}

func (e *tlsEnv) testHTTP2(t *testing.T) {
	out := e.guest(t, tlsRunBound, `
echo "H2=$(curl -sS --max-time 10 --http2 -o /tmp/h2.json -w '%{http_version}' https://up.test/echo 2>&1)"
echo "H2PROTO=$(python3 -c 'import json; print(json.load(open("/tmp/h2.json"))["proto"])' 2>&1)"
echo "H11=$(curl -sS --max-time 10 --http1.1 -o /dev/null -w '%{http_version}' https://up.test/echo 2>&1)"
`)
	f := fields(out)
	t.Logf("guest:\n%s", out)
	if f["H2"] != "2" {
		t.Errorf("curl --http2 to an intercepted host: http_version %q, want 2", f["H2"])
	}
	if f["H11"] != "1.1" {
		t.Errorf("curl --http1.1 to an intercepted host: http_version %q, want 1.1", f["H11"])
	}
	t.Logf("the upstream leg of the guest's HTTP/2 request spoke %s", f["H2PROTO"])
}

func (e *tlsEnv) testWebSocket(t *testing.T) {
	out := e.guest(t, tlsRunBound, "python3 "+shQuote(filepath.Join(e.dir, "ws.py"))+" up.test 2>&1")
	t.Logf("guest: %s", out)
	var r struct {
		Status, Accept, Key string
		Echo                []bool
		Close               int
	}
	if err := json.Unmarshal([]byte(lastLine(out)), &r); err != nil {
		t.Fatalf("ws.py printed %q: %v", out, err)
	}
	if !strings.Contains(r.Status, " 101 ") || r.Accept != inet.WebSocketAccept(r.Key) {
		t.Errorf("upgrade through the gate: status %q, accept %q; want 101 and %q", r.Status, r.Accept, inet.WebSocketAccept(r.Key))
	}
	if len(r.Echo) != 2 || !r.Echo[0] || !r.Echo[1] || r.Close != 8 {
		t.Errorf("echo through the gate: %+v; want both messages back and a close frame", r)
	}
}

func (e *tlsEnv) testSSE(t *testing.T) {
	const n, gapMS = 5, 400
	out := e.guest(t, tlsRunBound, fmt.Sprintf("python3 %s 'https://up.test/sse?n=%d&gap_ms=%d' 2>&1", shQuote(filepath.Join(e.dir, "sse.py")), n, gapMS))
	t.Logf("guest: %s", out)
	var r struct {
		Status int
		Ctype  string
		Events []struct {
			I      int
			SentNS int64   `json:"sent_ns"`
			RecvNS int64   `json:"recv_ns"`
			RecvMS float64 `json:"recv_ms"`
		}
	}
	if err := json.Unmarshal([]byte(lastLine(out)), &r); err != nil {
		t.Fatalf("sse.py printed %q: %v", out, err)
	}
	if r.Status != 200 || len(r.Events) != n {
		t.Fatalf("SSE through the gate: status %d, %d events; want 200 and %d", r.Status, len(r.Events), n)
	}
	for i := 1; i < n; i++ {
		gap := r.Events[i].RecvMS - r.Events[i-1].RecvMS
		lag := time.Duration(r.Events[i].RecvNS - r.Events[i].SentNS)
		t.Logf("event %d: %.0f ms after the one before, %v after the server sent it", i, gap, lag.Round(time.Millisecond))
		if gap < gapMS/2 {
			t.Errorf("event %d came %.0f ms after event %d (sent %d ms apart): the gate held events back", i, gap, i-1, gapMS)
		}
	}
}

// An intercepted host with a GET-only rule: POST is refused with the gate's readable 403.
func (e *tlsEnv) testGetOnly(t *testing.T) {
	before := e.srv["ro:443"].Hits()
	m := e.mark(t)
	out := e.guest(t, tlsRunBound, `
echo "GET=$(curl -sS --max-time 10 -o /dev/null -w '%{http_code}' https://ro.test/echo 2>&1)"
echo "POST=$(curl -sS --max-time 10 -X POST -d x=1 -o /tmp/post.body -D /tmp/post.head -w '%{http_code}' https://ro.test/echo 2>&1)"
echo "POSTBODY=$(tr '\n' ' ' </tmp/post.body)"
echo "POSTHEAD=$(tr '\r\n' '  ' </tmp/post.head)"
`)
	f := fields(out)
	t.Logf("guest:\n%s", out)
	if f["GET"] != "200" {
		t.Errorf("GET to ro.test under a GET,HEAD rule: %q, want 200", f["GET"])
	}
	if f["POST"] != "403" {
		t.Errorf("POST to ro.test under a GET,HEAD rule: %q, want the gate's 403", f["POST"])
	}
	body := f["POSTBODY"]
	if !strings.Contains(body, "ro.test") || !strings.Contains(body, "GET") || !strings.Contains(body, "POST") {
		t.Errorf("the 403 page does not name the host, the method and the rule: %q", body)
	}
	if !strings.Contains(strings.ToLower(f["POSTHEAD"]), "x-moat-denied") {
		t.Errorf("the 403 lacks X-Moat-Denied, so it is not the gate's: %q", f["POSTHEAD"])
	}
	if got := e.srv["ro:443"].Hits() - before; got != 1 {
		t.Errorf("ro.test received %d requests, want 1 (the GET only; the POST must never reach it)", got)
	}
	e.denied(t, m, match{Name: "ro.test"})
}

// The canary test: the real value goes only to the bound host, only over TLS; everything the
// guest sees carries the placeholder.
func (e *tlsEnv) testCanary(t *testing.T) {
	bound, plain, ro, up := e.srv["bound:443"], e.srv["bound:80"], e.srv["ro:443"], e.srv["up:443"]
	plainBefore := countsOf(plain)
	m := e.mark(t)
	o := filepath.Join(e.dir, "out", "canary")
	out := e.guest(t, tlsRunBound, fmt.Sprintf(`
o=%s; mkdir -p $o
echo "PH=$MOAT_CANARY"
echo "UPPH=$MOAT_UPKEY"
c() { name=$1; shift; echo "$name=$(curl -sS --max-time 10 -o $o/$name.body -D $o/$name.head -w '%%{http_code}' "$@" 2>$o/$name.err; echo " rc=$?")"; }
c BOUND -H "Authorization: Bearer $MOAT_CANARY" "https://bound.test/echo?key=$MOAT_CANARY"
c UNBOUND_RO -H "Authorization: Bearer $MOAT_CANARY" "https://ro.test/echo?key=$MOAT_CANARY"
c UNBOUND_UP -H "Authorization: Bearer $MOAT_CANARY" "https://up.test/echo?key=$MOAT_CANARY"
c UP_OWN -H "Authorization: Bearer $MOAT_UPKEY" https://up.test/echo
c PLAIN -H "Authorization: Bearer $MOAT_CANARY" "http://bound.test/echo?key=$MOAT_CANARY"
c FOREIGN -H "Authorization: Bearer sk-foreign-token-0000" https://bound.test/echo
c NONE https://bound.test/echo
c ELSEWHERE1 --http1.1 -H "Authorization: Bearer $MOAT_CANARY" https://bound.test/echo-elsewhere
c ELSEWHERE2 --http2 -H "Authorization: Bearer $MOAT_CANARY" https://bound.test/echo-elsewhere
`, shQuote(o)))
	f := fields(out)
	t.Logf("guest:\n%s", out)
	read := func(name, ext string) string { b, _ := os.ReadFile(filepath.Join(o, name+"."+ext)); return string(b) }
	ph, upph := f["PH"], f["UPPH"]
	if ph == "" || ph == e.canary || strings.Contains(ph, e.canary) || upph == "" || upph == e.upkey {
		t.Fatalf("the guest's MOAT_CANARY is %q and MOAT_UPKEY %q: want placeholders, never the values", ph, upph)
	}
	if !strings.HasPrefix(ph, "moat-ph-") {
		t.Logf("note: the placeholder %q does not start with moat-ph-", ph)
	}

	// The bound host got the real value, in the header and the query parameter.
	var got *inet.Req
	for _, r := range bound.Requests() {
		r := r
		if strings.Contains(r.Query, "key=") {
			got = &r
		}
	}
	if !strings.HasPrefix(f["BOUND"], "200") || got == nil {
		t.Fatalf("request to the bound host: %q (stderr %q); the server recorded %d requests", f["BOUND"], read("BOUND", "err"), len(bound.Requests()))
	}
	if a := got.Header.Get("Authorization"); a != "Bearer "+e.canary {
		t.Errorf("the bound host received Authorization %q; want the real value (redacted here: %d bytes)", redact(a, e.canary), len("Bearer "+e.canary))
	}
	if got.Query != "key="+e.canary {
		t.Errorf("the bound host received query %q; want key= the real value", redact(got.Query, e.canary))
	}
	// Its echo came back to the guest with the placeholder, never the value, in headers and body.
	for _, part := range []string{"head", "body"} {
		s := read("BOUND", part)
		if strings.Contains(s, e.canary) {
			t.Errorf("LEAK: the bound host's echo reached the guest with the real value in its %s", part)
		}
		if !strings.Contains(s, ph) {
			t.Errorf("the bound host's echo (%s) does not carry the placeholder back: %q", part, gateClip(redact(s, e.canary), 600))
		}
	}
	if h := read("BOUND", "head"); !strings.Contains(h, "Bearer "+ph) {
		t.Errorf("X-Echo-Authorization back in the guest: want Bearer <placeholder>; head: %q", gateClip(redact(h, e.canary), 600))
	}

	// What the bound host echoes in a 103 response and in a trailer, over HTTP/1.1 and HTTP/2,
	// reaches the guest scrubbed too (curl's -D has the 103 block and the trailers).
	for _, key := range []string{"ELSEWHERE1", "ELSEWHERE2"} {
		h := read(key, "head")
		if strings.Contains(h, e.canary) {
			t.Errorf("LEAK: %s: the bound host's 103 or trailer reached the guest with the real value", key)
		}
		lower := strings.ToLower(h)
		if !strings.HasPrefix(f[key], "200") || !strings.Contains(lower, " 103") ||
			!strings.Contains(lower, "x-echo-hint: bearer "+ph) || !strings.Contains(lower, "x-echo-trailer: bearer "+ph) {
			t.Errorf("%s: %q; want 200 with a 103 and a trailer carrying the placeholder; head: %q", key, f[key], gateClip(redact(h, e.canary), 800))
		}
	}
	// moat network denials gives the audit's reason for the plain-HTTP refusal, not the
	// rule that allowed the name.
	den := mustMoat(t, e.dir, "network", "denials", e.name)
	for _, l := range strings.Split(den, "\n") {
		if strings.Contains(l, "bound.test:80") && !strings.Contains(l, "only sent over TLS") {
			t.Errorf("moat network denials shows %q for bound.test:80, want the audit's reason (secrets are only sent over TLS)", l)
		}
	}
	if !strings.Contains(den, "bound.test:80") {
		t.Errorf("moat network denials does not list bound.test:80:\n%s", den)
	}

	// Unbound hosts, intercepted as they are, got the placeholder untouched.
	for _, c := range []struct {
		key string
		srv *inet.Server
	}{{"UNBOUND_RO", ro}, {"UNBOUND_UP", up}} {
		if !strings.HasPrefix(f[c.key], "200") {
			t.Errorf("%s: %q (stderr %q)", c.key, f[c.key], read(c.key, "err"))
			continue
		}
		seen := 0
		for _, r := range c.srv.Requests() {
			if strings.Contains(r.Header.Get("Authorization"), e.canary) || strings.Contains(r.Query, e.canary) {
				t.Errorf("LEAK: %s received the real value of MOAT_CANARY, which is bound to bound.test only", c.key)
			}
			if r.Query == "key="+ph {
				seen++
				if a := r.Header.Get("Authorization"); a != "Bearer "+ph {
					t.Errorf("%s received Authorization %q, want Bearer <placeholder>", c.key, redact(a, e.canary))
				}
			}
		}
		if seen != 1 {
			t.Errorf("%s: %d requests carried the placeholder in the query, want 1", c.key, seen)
		}
	}
	// up.test's own secret is swapped there, which is also why up.test is intercepted.
	upOwn := false
	for _, r := range up.Requests() {
		upOwn = upOwn || r.Header.Get("Authorization") == "Bearer "+e.upkey
	}
	if !strings.HasPrefix(f["UP_OWN"], "200") || !upOwn {
		t.Errorf("up.test did not receive MOAT_UPKEY's real value for its placeholder: %q", f["UP_OWN"])
	}

	// Plain HTTP to the bound host is refused, and the server heard nothing.
	if strings.HasPrefix(f["PLAIN"], "200") {
		t.Errorf("plain HTTP to the bound host succeeded: %q", f["PLAIN"])
	}
	if now := countsOf(plain); now != plainBefore {
		t.Errorf("LEAK: bound.test:80 was contacted over plain HTTP: %+v → %+v", plainBefore, now)
	}

	// require: a foreign token, and no token at all, are refused before the upstream.
	boundAfterOK := len(bound.Requests())
	for _, key := range []string{"FOREIGN", "NONE"} {
		if !strings.HasPrefix(f[key], "403") {
			t.Errorf("%s to the bound host with require: %q, want 403", key, f[key])
		}
	}
	if reqs := bound.Requests(); len(reqs) != boundAfterOK {
		t.Errorf("requests refused by require still reached bound.test")
	}
	for _, r := range bound.Requests() {
		if strings.Contains(r.Header.Get("Authorization"), "sk-foreign") {
			t.Errorf("the foreign token reached bound.test")
		}
	}
	e.denied(t, m, match{Name: "bound.test"})
	raw, _ := os.ReadFile(filepath.Join(e.state, "audit", "audit.jsonl"))
	if !bytes.Contains(raw, []byte("MOAT_CANARY")) {
		t.Errorf("no audit line names the secret MOAT_CANARY where it was swapped")
	}
}

// testRefresh: `moat secrets refresh` reads a running sandbox's secrets again. The file behind
// MOAT_FILEKEY is rewritten; the next request to up.test carries the new value for the same
// placeholder, and the echo brings the guest the placeholder only. A source that cannot be read
// fails the refresh, names the secret, and leaves the values as they were.
func (e *tlsEnv) testRefresh(t *testing.T) {
	up := e.srv["up:443"]
	received := func(value string) bool {
		for _, r := range up.Requests() {
			if r.Header.Get("X-File-Key") == value {
				return true
			}
		}
		return false
	}
	o := filepath.Join(e.dir, "out", "refresh")
	ask := func(t *testing.T, tag string) (ph, head string) {
		t.Helper()
		out := e.guest(t, tlsRunBound, fmt.Sprintf(`o=%s; mkdir -p $o; echo "PH=$MOAT_FILEKEY"
curl -sS --max-time 10 -o $o/%s.echo -D $o/%s.echo -H "X-File-Key: $MOAT_FILEKEY" https://up.test/echo`, shQuote(o), tag, tag))
		b, _ := os.ReadFile(filepath.Join(o, tag+".echo"))
		return fields(out)["PH"], string(b)
	}
	ph, _ := ask(t, "before")
	if ph == "" || !received(e.fileKeys[0]) {
		t.Fatalf("before the refresh: placeholder %q; up.test did not receive the file's first value", ph)
	}

	second := "mf" + randHex(t, 20)
	e.fileKeys = append(e.fileKeys, second)
	if err := os.WriteFile(e.fileKey, []byte(second+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := moat(t, e.dir, e.env, "secrets", "refresh", e.name)
	if r.code != 0 || !strings.Contains(r.stdout, "changed: MOAT_FILEKEY)") {
		t.Fatalf("moat secrets refresh: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	ph2, echo := ask(t, "after")
	if ph2 != ph {
		t.Errorf("the placeholder changed on refresh: %q, then %q", ph, ph2)
	}
	if !received(second) {
		t.Errorf("after the refresh up.test did not receive the file's new value")
	}
	for i, v := range e.fileKeys {
		if strings.Contains(echo, v) {
			t.Errorf("LEAK: the echo brought value %d of MOAT_FILEKEY back to the guest", i+1)
		}
	}
	if !strings.Contains(echo, ph) {
		t.Errorf("up.test's echo does not carry the placeholder back: %q", gateClip(echo, 600))
	}

	// A source that cannot be read: the refresh fails naming it, and nothing changes.
	if err := os.Remove(e.fileKey); err != nil {
		t.Fatal(err)
	}
	r = moat(t, e.dir, e.env, "secrets", "refresh", e.name)
	if r.code == 0 || !strings.Contains(r.stderr, "MOAT_FILEKEY") || !strings.Contains(r.stderr, "nothing changed") {
		t.Errorf("refresh with the file gone: exit %d, stderr %q; want a failure naming MOAT_FILEKEY and saying nothing changed", r.code, r.stderr)
	}
	before := len(up.Requests())
	ask(t, "failed")
	got := up.Requests()
	if len(got) <= before || got[len(got)-1].Header.Get("X-File-Key") != second {
		t.Errorf("after a failed refresh up.test did not receive the value from before it")
	}
	if err := os.WriteFile(e.fileKey, []byte(second+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// redact replaces the real value in s, so a failure message never prints it.
func redact(s, value string) string {
	return strings.ReplaceAll(s, value, "<REAL VALUE>")
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// A 200 MiB upload and download through an intercepted host: streamed both ways, byte for byte,
// while the daemon's memory stays bounded.
func (e *tlsEnv) testStream(t *testing.T) {
	file := filepath.Join(e.dir, "upload.bin")
	if err := inet.WritePatternFile(file, streamSize); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(file)
	want := inet.PatternSHA256(streamSize)
	start := time.Now()
	out := e.guest(t, streamRunBound, fmt.Sprintf(`
s=$(date +%%s%%N)
echo "UP=$(curl -sS --max-time 90 -T %s https://up.test/upload 2>&1)"
m=$(date +%%s%%N)
echo "DOWN=$(curl -sS --max-time 90 'https://up.test/count?n=%d' | sha256sum | cut -d' ' -f1) $(date +%%s%%N)"
echo "UPNS=$((m - s))"
echo "START=$m"
`, shQuote(file), streamSize))
	t.Logf("guest:\n%s (%v)", out, time.Since(start).Round(time.Millisecond))
	f := fields(out)
	var up inet.UploadReply
	if err := json.Unmarshal([]byte(f["UP"]), &up); err != nil || up.Bytes != streamSize || up.SHA256 != want {
		t.Errorf("200 MiB upload through interception: server got %q (%v); want %d bytes, sha256 %s", f["UP"], err, streamSize, want)
	} else {
		t.Logf("upload: the server read the body in %d pieces", up.Chunks)
	}
	down := strings.Fields(f["DOWN"])
	if len(down) != 2 || down[0] != want {
		t.Errorf("200 MiB download through interception: guest digest %q, want %s", f["DOWN"], want)
	}
	if upNS, err := strconv.ParseFloat(f["UPNS"], 64); err == nil && upNS > 0 {
		t.Logf("upload %.0f MiB/s", float64(streamSize)/(1<<20)/(upNS/1e9))
	}
	if len(down) == 2 {
		end, _ := strconv.ParseFloat(down[1], 64)
		st, _ := strconv.ParseFloat(f["START"], 64)
		if end > st {
			t.Logf("download %.0f MiB/s", float64(streamSize)/(1<<20)/((end-st)/1e9))
		}
	}
	hwm := e.daemonHWM(t)
	t.Logf("daemon peak RSS (VmHWM): %d MiB after start, %d MiB after the 200 MiB transfers", e.hwmStart>>20, hwm>>20)
	if hwm > daemonHWMBound {
		t.Errorf("the daemon's peak RSS reached %d MiB (bound %d MiB): bodies are being buffered", hwm>>20, daemonHWMBound>>20)
	}
}

// daemonHWM is the gate process's peak resident set (VmHWM), in bytes.
func (e *tlsEnv) daemonHWM(t *testing.T) int64 {
	t.Helper()
	return statusBytes(t, gateProcess(t, e.daemonPID(t)), "VmHWM")
}

// statusBytes is a memory field of /proc/PID/status (VmHWM, VmRSS), in bytes.
func statusBytes(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the status of pid %d: %v", pid, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no %s in the status of pid %d", field, pid)
	return 0
}

// The canary appears nowhere: not in the state directory (logs, audit, records, the guest's
// upper layers), not in the workspace, not in any file or process of the guest, not in the
// environment or arguments of moat's own processes on the host.
func (e *tlsEnv) testNowhere(t *testing.T) {
	values := map[string]string{"MOAT_CANARY": e.canary, "MOAT_UPKEY": e.upkey}
	for i, v := range e.fileKeys {
		values[fmt.Sprintf("MOAT_FILEKEY (value %d)", i+1)] = v
	}
	// On the host: every file under MOAT_HOME and the workspace, and the
	// guest's writable layer through its disk image's mount, which is in
	// the shim's mount namespace only (scanTree skips the image itself).
	layer := guestLayer(e.state)
	if layer == "" {
		t.Errorf("found no shim to search the guest's writable layer through")
	}
	for _, root := range []string{moatHome, e.dir, layer} {
		files, scanned, hits := scanTree(t, root, values)
		t.Logf("searched %d files, %d KiB, under %s", files, scanned>>10, root)
		if files == 0 {
			t.Errorf("found no files to search under %s", root)
		}
		for _, h := range hits {
			t.Errorf("LEAK: %s", h)
		}
	}
	// moat's own processes: the daemon and everything under it (shim, runsc, gofer).
	pids := processTree(e.daemonPID(t))
	if len(pids) < 2 {
		t.Errorf("found only %d processes under the daemon; the search would miss the shim", len(pids))
	}
	for _, pid := range pids {
		for _, file := range []string{"environ", "cmdline"} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
			if err != nil {
				continue // exited
			}
			for name, v := range values {
				if bytes.Contains(b, []byte(v)) {
					cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
					t.Errorf("LEAK: the real value of %s is in /proc/%d/%s (%s)", name, pid, file, redact(strings.ReplaceAll(string(cmd), "\x00", " "), v))
				}
			}
		}
	}
	t.Logf("searched the environment and arguments of %d host processes under the daemon", len(pids))

	// In the guest, as root: its files and every process's environment and arguments. The guest
	// is given only the first half of each value, in a file: a match of half a random value
	// anywhere is a leak, and the guest never holds a whole one, not even to search for it.
	pat := filepath.Join(e.dir, "halves.pat")
	var halves []string
	for _, v := range values {
		halves = append(halves, v[:len(v)/2])
	}
	if err := os.WriteFile(pat, []byte(strings.Join(halves, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(pat)
	out := e.guest(t, 60*time.Second, fmt.Sprintf(`
(sleep 30 >/dev/null 2>&1 &) # a process whose environment holds the placeholders
sudo -n timeout 50 grep -r -l -a -F -f %[1]s --exclude=halves.pat /etc /home /tmp /root /var /run /dev/shm 2>/dev/null | sed 's/^/FILE /'
sudo -n grep -l -a -F -f %[1]s /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | sed 's/^/PROC /'
echo "PROCS=$(ls -d /proc/[0-9]* | wc -l)"
echo done
`, shQuote(pat)))
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "FILE ") || strings.HasPrefix(l, "PROC ") {
			t.Errorf("LEAK: half of a secret's value is in the guest: %s", l)
		}
	}
	if !strings.Contains(out, "done") {
		t.Errorf("the guest's search did not finish:\n%s", out)
	}
	t.Logf("guest search: %s", fields(out)["PROCS"]+" processes")
}

// processTree is pid and all its descendants.
func processTree(root int) []int {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], pid)
	}
	out := []int{root}
	for i := 0; i < len(out) && i < 10000; i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// scanTree searches every regular file under root for the values; it returns the files and bytes
// read and one line per hit, naming the file and the secret, never the value.
func scanTree(t *testing.T, root string, values map[string]string) (files int, total int64, hits []string) {
	t.Helper()
	keep := 0
	for _, v := range values {
		keep = max(keep, len(v))
	}
	buf := make([]byte, 1<<20+keep)
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		// disk.img: sparse, as large as the sandbox's disk limit, and
		// behind the page cache of its mount, which is searched instead;
		// cache/disk/ext4-SIZE.img: the pristine templates disk.img is
		// copied from, which no guest writes.
		tpl, _ := filepath.Match("ext4-*.img", d.Name())
		if err != nil || !d.Type().IsRegular() || d.Name() == "disk.img" || tpl {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		files++
		carry := 0
		found := map[string]bool{}
		for {
			k, err := f.Read(buf[carry:])
			total += int64(k)
			window := buf[:carry+k]
			for name, v := range values {
				if !found[name] && bytes.Contains(window, []byte(v)) {
					found[name] = true
					hits = append(hits, fmt.Sprintf("the real value of %s is in %s", name, p))
				}
			}
			carry = min(len(window), keep-1)
			copy(buf, window[len(window)-carry:])
			if err == io.EOF || err != nil || k == 0 {
				break
			}
		}
		return nil
	})
	return files, total, hits
}

// wsPy is a WebSocket client made of the standard library: an upgrade by hand over the guest's
// default TLS context, two masked text messages and a close.
const wsPy = `import base64, json, os, socket, ssl, struct, sys
host = sys.argv[1]
ctx = ssl.create_default_context()
ctx.set_alpn_protocols(["http/1.1"])
s = ctx.wrap_socket(socket.create_connection((host, 443), timeout=10), server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n\r\n" % (host, key)).encode())
f = s.makefile("rb")
status = f.readline().decode().strip()
headers = {}
while True:
    l = f.readline().decode().strip()
    if not l:
        break
    k, _, v = l.partition(":")
    headers[k.strip().lower()] = v.strip()
def send(op, data):
    mask = os.urandom(4)
    n = len(data)
    hdr = bytes([0x80 | op])
    if n < 126:
        hdr += bytes([0x80 | n])
    elif n < 65536:
        hdr += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        hdr += bytes([0x80 | 127]) + struct.pack(">Q", n)
    s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
def recv():
    b0, b1 = f.read(2)
    n = b1 & 0x7f
    if n == 126:
        n = struct.unpack(">H", f.read(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", f.read(8))[0]
    return b0 & 0x0f, f.read(n)
out = {"status": status, "accept": headers.get("sec-websocket-accept"), "key": key, "echo": [], "close": 0}
if " 101 " in status:
    for msg in ["hello through the gate", "x" * 1000]:
        send(1, msg.encode())
        op, data = recv()
        out["echo"].append(op == 1 and data.decode() == msg)
    send(8, struct.pack(">H", 1000))
    out["close"] = recv()[0]
print(json.dumps(out))
`

// ssePy reads an event stream and notes when each event arrived.
const ssePy = `import json, sys, time, urllib.request
t0 = time.monotonic()
r = urllib.request.urlopen(sys.argv[1], timeout=20)
ev = []
while True:
    line = r.readline()
    if not line:
        break
    line = line.decode().rstrip("\n")
    if line.startswith("data: "):
        d = json.loads(line[6:])
        d["recv_ms"] = (time.monotonic() - t0) * 1000
        d["recv_ns"] = time.time_ns()
        ev.append(d)
print(json.dumps({"status": r.status, "ctype": r.headers.get("content-type"), "events": ev}))
`
