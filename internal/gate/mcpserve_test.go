package gate

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/secret"
	"moat.dev/moat/internal/tlsca"
)

// fakeMCP is a streamable-HTTP MCP server reduced to what the gate
// sees: it logs every message that reaches it (so "never arrived" is a
// checked fact) and answers listings with every tool it has.
type fakeMCP struct {
	mu   sync.Mutex
	got  []string // "method name-or-uri" of each message that arrived
	auth []string
}

func (f *fakeMCP) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func (f *fakeMCP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var msgs []map[string]json.RawMessage
	if json.Unmarshal(body, &msgs) != nil {
		var one map[string]json.RawMessage
		json.Unmarshal(body, &one)
		msgs = append(msgs, one)
	}
	var answers []string
	f.mu.Lock()
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	for _, m := range msgs {
		var method string
		var p struct{ Name, URI string }
		json.Unmarshal(m["method"], &method)
		json.Unmarshal(m["params"], &p)
		f.got = append(f.got, strings.TrimSpace(method+" "+p.Name+p.URI))
		id := string(m["id"])
		switch method {
		case "tools/list":
			answers = append(answers, strings.Replace(toolList, `"id":1`, `"id":`+id, 1))
		case "tools/call":
			answers = append(answers, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"ran %s auth=%s"}]}}`,
				id, p.Name, r.Header.Get("Authorization")))
		case "":
		default:
			if id != "" {
				answers = append(answers, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{}}`, id))
			}
		}
	}
	f.mu.Unlock()
	switch {
	case strings.HasSuffix(r.URL.Path, "/cut"):
		// A stream cut in the middle of its second event.
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n")
		fmt.Fprint(w, "data: "+toolList[:len(toolList)-10])
		return
	case len(answers) == 0:
		w.WriteHeader(http.StatusAccepted)
	case r.URL.Query().Get("gzip") == "1":
		// A server that compresses whatever it was asked.
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		for _, a := range answers {
			fmt.Fprintf(zw, "data: %s\n\n", a)
		}
		zw.Close()
	case r.URL.Query().Get("json") == "1":
		w.Header().Set("Content-Type", "application/json")
		if len(msgs) > 1 {
			fmt.Fprint(w, "["+strings.Join(answers, ",")+"]")
		} else {
			fmt.Fprint(w, answers[0])
		}
	default:
		w.Header().Set("Content-Type", "text/event-stream")
		for _, a := range answers {
			fmt.Fprintf(w, "event: message\ndata: %s\n\n", a)
		}
	}
}

type mcpFixture struct {
	*mitmFixture
	srv *fakeMCP
	ph  string // the placeholder the guest holds
	c   *http.Client
	// upAddr and upRoots reach the server directly (benchmarks).
	upAddr  string
	upRoots *x509.CertPool
}

// newMCPFixture is a gate with testMCP declared, in front of a fakeMCP
// at mcp.test, with a secret bound to mcp.test.
func newMCPFixture(t testing.TB, s MCPServer, allow ...string) *mcpFixture {
	return newMCPFixtureWith(t, s, true, allow...)
}

// newMCPFixtureWith is newMCPFixture, with or without the secret.
func newMCPFixtureWith(t testing.TB, s MCPServer, withSecret bool, allow ...string) *mcpFixture {
	return newMCPFixtureHolds(t, s, withSecret, nil, allow...)
}

// newMCPFixtureHolds is newMCPFixtureWith with the interactive gate's holds.
func newMCPFixtureHolds(t testing.TB, s MCPServer, withSecret bool, holds *Holds, allow ...string) *mcpFixture {
	t.Helper()
	ca, err := tlsca.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	upCA, err := tlsca.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	addr := loopback()
	srv := &fakeMCP{}
	hs := httptest.NewUnstartedServer(srv)
	hs.Listener = listenAt(t, addr+":443")
	hs.EnableHTTP2 = true
	hs.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(h.ServerName) }}
	hs.StartTLS()
	t.Cleanup(hs.Close)
	upRoots := x509.NewCertPool()
	upRoots.AddCert(upCA.Cert())

	dns := startDNS(t, map[string]string{"mcp.test": addr})
	cs := config.MCPServer{Host: s.Host, Port: s.Port, Path: s.Path}
	rules, err := policy.FromEntries(append(cs.AllowEntries(), addr), policy.Allow, policy.LayerProject, "moat.toml")
	if err != nil {
		t.Fatal(err)
	}
	// allow: what a person added at run time, a layer above the declaration.
	runtime, err := policy.FromEntries(allow, policy.Allow, policy.LayerRuntime, "runtime")
	if err != nil {
		t.Fatal(err)
	}
	rules = append(rules, runtime...)
	creds, err := secret.Resolve(context.Background(), map[string]config.Secret{
		"MCP_TOKEN": {Name: "MCP_TOKEN", From: "env:MOAT_TEST_MCP", Hosts: []string{"mcp.test"}},
	}, func(k string) (string, bool) { return canary, k == "MOAT_TEST_MCP" })
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	al, err := audit.Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	f := &mcpFixture{mitmFixture: &mitmFixture{fixture: &fixture{dns: dns, ledger: audit.NewLedger(100), log: al, path: path},
		ca: ca, roots: x509.NewCertPool()}, srv: srv, ph: creds.Placeholders()["MCP_TOKEN"], upAddr: addr, upRoots: upRoots}
	f.roots.AddCert(ca.Cert())
	var gc Credentials = creds
	if !withSecret {
		gc = nil
	}
	f.g = New(Options{
		Sandbox: "sb", Policy: policy.Compile(rules),
		Resolver: NewResolver(ResolverOptions{Servers: []netip.AddrPort{dns.addr}}),
		Audit:    al, Ledger: f.ledger, PeekTimeout: 2 * time.Second, DialTimeout: 2 * time.Second,
		Certs: ca, UpstreamRoots: upRoots, Credentials: gc,
		MCP: []MCPServer{s}, Holds: holds,
	})
	f.c = f.client(t, false, f.roots)
	return f
}

// post sends body to path on mcp.test as the guest does, with the
// placeholder as its credential.
func (f *mcpFixture) post(t *testing.T, path, body string) (int, string, error) {
	t.Helper()
	req, _ := http.NewRequest("POST", "https://mcp.test"+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+f.ph)
	if strings.Contains(path, "gzip=1") {
		// The guest asks for compression: it still gets a body the gate could filter.
		req.Header.Set("Accept-Encoding", "gzip")
	}
	resp, err := f.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func mcpRecords(recs []audit.Record) []string {
	var out []string
	for _, r := range byProto(recs, "mcp") {
		out = append(out, fmt.Sprintf("%s %s%s %s rule=%q", r.Verdict, r.MCPTool, r.MCPURI, r.Reason, r.Rule))
	}
	return out
}

func TestMCPOverTLS(t *testing.T) {
	f := newMCPFixture(t, testMCP)

	// An allowed call reaches the server with the secret swapped in; the guest sees the placeholder.
	status, body, err := f.post(t, "/mcp", call(1, "read_file"))
	if err != nil || status != 200 || !strings.Contains(body, "ran read_file auth=Bearer "+f.ph) || strings.Contains(body, canary) {
		t.Errorf("allowed call: %d %v %q", status, err, body)
	}
	if f.srv.auth[0] != "Bearer "+canary {
		t.Errorf("the server saw %q, not the secret", f.srv.auth[0])
	}

	// A refused call gets a JSON-RPC error with its id, and never arrives.
	status, body, _ = f.post(t, "/mcp", call(7, "delete_repo"))
	var e struct {
		ID    int
		Error struct {
			Code    int
			Message string
		}
	}
	if json.Unmarshal([]byte(body), &e) != nil || status != 200 || e.ID != 7 || e.Error.Code != mcpRefused ||
		!strings.Contains(e.Error.Message, `tools/call "delete_repo"`) ||
		!strings.Contains(e.Error.Message, "no pattern of [mcp.gh] tools in /p/moat.toml allows it") ||
		!strings.Contains(e.Error.Message, "moat up --reconfigure") {
		t.Errorf("refused call: %d %q", status, body)
	}
	_, body, _ = f.post(t, "/mcp", call(8, "search_private_x"))
	if !strings.Contains(body, `the pattern \"!search_private*\"`) {
		t.Errorf("blocked call: %q", body)
	}

	// Listings are filtered, as an SSE stream and as JSON, compressed or not.
	for _, q := range []string{"", "?json=1", "?gzip=1"} {
		_, body, err = f.post(t, "/mcp"+q, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
		if err != nil || !strings.Contains(body, "search_code") || !strings.Contains(body, "read_file") ||
			strings.Contains(body, "delete_repo") || strings.Contains(body, "search_private") {
			t.Errorf("tools/list%s: %v %q", q, err, body)
		}
	}

	// A batch with one refused member is refused whole; nothing of it arrives.
	_, body, _ = f.post(t, "/mcp", "["+call(4, "read_file")+","+call(5, "delete_repo")+`,{"jsonrpc":"2.0","id":6,"method":"tools/list"}]`)
	var batch []struct {
		ID    int
		Error struct{ Message string }
	}
	if json.Unmarshal([]byte(body), &batch) != nil || len(batch) != 3 ||
		!strings.Contains(batch[0].Error.Message, "same batch was refused") || !strings.Contains(batch[1].Error.Message, "delete_repo") ||
		!strings.Contains(batch[2].Error.Message, `refused tools/list on MCP server "gh": another call`) {
		t.Errorf("mixed batch: %q", body)
	}

	// Malformed and oversized bodies are refused, and the gate keeps serving.
	for _, tc := range []struct {
		body string
		want int
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","name":"delete_repo"}}`, 400},
		{`{"jsonrpc":"2.0",`, 400},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"x":"` + strings.Repeat("a", mcpMaxRequest) + `"}}}`, 413},
	} {
		status, body, _ := f.post(t, "/mcp", tc.body)
		if status != tc.want || !strings.Contains(body, `"id":null`) || !strings.Contains(body, "nothing of it was sent") {
			t.Errorf("%.60s: %d %q", tc.body, status, gateClipTest(body))
		}
	}
	// Another spelling of the URL gets nothing through (here the policy's strict reading refuses it).
	if status, body, _ := f.post(t, "/MCP/", call(9, "delete_repo")); status == 200 && !strings.Contains(body, "refused") {
		t.Errorf("/MCP/: %d %q", status, body)
	}
	// A stream cut in the middle of an event passes what came whole, nothing of the rest.
	_, body, err = f.post(t, "/mcp/cut", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	if err == nil || strings.Contains(body, "search_code") || !strings.Contains(body, "notifications/progress") {
		t.Errorf("cut stream: %v %q", err, body)
	}
	if status, body, _ := f.post(t, "/mcp", call(10, "search_code")); status != 200 || !strings.Contains(body, "ran search_code") {
		t.Errorf("after the bad input: %d %q", status, body)
	}

	wantArrived := []string{"tools/call read_file", "tools/list", "tools/list", "tools/list", "tools/list", "tools/call search_code"}
	if got := f.srv.log(); strings.Join(got, "|") != strings.Join(wantArrived, "|") {
		t.Errorf("arrived at the server: %q\nwant %q", got, wantArrived)
	}
	recs := f.done(t, f.c)
	want := []string{
		`allow read_file  rule="read_file"`,
		`deny delete_repo no MCP rule allows it rule=""`,
		`deny search_private_x blocked by MCP rule rule="!search_private*"`,
		`deny read_file refused with its batch rule="read_file"`,
		`deny delete_repo no MCP rule allows it rule=""`,
		`deny  refused with its batch rule=""`,
		`deny  malformed MCP message rule=""`,
		`deny  malformed MCP message rule=""`,
		`deny  MCP message too large rule=""`,
		`allow search_code  rule="search_*"`,
	}
	if got := mcpRecords(recs); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("mcp records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, r := range byProto(recs, "mcp") {
		if r.MCPServer != "gh" || r.Name != "mcp.test" || r.MCPArguments != "" {
			t.Errorf("record %+v", r)
		}
	}
}

func TestMCPAuditArguments(t *testing.T) {
	s := testMCP
	s.AuditArguments = true
	f := newMCPFixture(t, s)
	f.post(t, "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a","token":"`+canary+`"}}}`)
	recs := byProto(f.done(t, f.c), "mcp")
	if len(recs) != 1 || !strings.Contains(recs[0].MCPArguments, `"path":"a"`) || strings.Contains(recs[0].MCPArguments, canary) {
		t.Errorf("records %+v", recs)
	}
}

func TestMCPReportModeLetsThrough(t *testing.T) {
	f := newMCPFixture(t, testMCP)
	f.g.SetReport(true)
	if _, body, _ := f.post(t, "/mcp", call(1, "delete_repo")); !strings.Contains(body, "ran delete_repo") {
		t.Errorf("report mode: %q", body)
	}
	if got := mcpRecords(f.done(t, f.c)); len(got) != 1 || !strings.HasPrefix(got[0], "would_deny delete_repo") {
		t.Errorf("records %q", got)
	}
}

func gateClipTest(s string) string { return clip(s, 300) }

// A bare allow of the server's host outranks the URL's request rules and
// would let the connection be spliced: the declaration still forces
// interception, and every spelling of the URL is decided.
func TestMCPDecidedUnderABareAllow(t *testing.T) {
	f := newMCPFixtureWith(t, testMCP, false, "mcp.test")
	for _, p := range []string{"/mcp", "/MCP/", "//mcp", "/%6dcp"} {
		status, body, _ := f.post(t, p, call(1, "delete_repo"))
		if !(status == 200 && strings.Contains(body, "refused")) && status != http.StatusForbidden {
			t.Errorf("%s: %d %q", p, status, body)
		}
	}
	if got := f.srv.log(); len(got) != 0 {
		t.Errorf("arrived at the server: %q", got)
	}
	f.done(t, f.c)
}

// Refused calls are audited but not listed as denied destinations: the
// destination is allowed, and moat network allow would not help.
func TestMCPRefusalsStayOutOfTheLedger(t *testing.T) {
	f := newMCPFixture(t, testMCP)
	f.post(t, "/mcp", call(1, "delete_repo"))
	recs := f.done(t, f.c)
	if got := mcpRecords(recs); len(got) != 1 || !strings.HasPrefix(got[0], "deny delete_repo") {
		t.Errorf("records %q", got)
	}
	if e := f.ledger.Entries(); len(e) != 0 {
		t.Errorf("ledger %+v", e)
	}
	if _, denied := f.g.Counts(); denied != 1 {
		t.Errorf("denied count %d", denied)
	}
}

// Without a secret bound to the host (whose answers are decompressed to
// be scrubbed), a listing the guest asked to have compressed is still
// read and filtered.
func TestMCPFiltersCompressedAnswers(t *testing.T) {
	f := newMCPFixtureWith(t, testMCP, false)
	_, body, err := f.post(t, "/mcp?gzip=1", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	if err != nil || !strings.Contains(body, "read_file") || strings.Contains(body, "delete_repo") {
		t.Errorf("compressed tools/list: %v %q", err, body)
	}
	f.done(t, f.c)
}

// A call no pattern decides waits for a watcher, as a destination does:
// "once" lets that call through, "deny" refuses it; a call a "!" pattern
// refuses is never asked about.
func TestMCPCallHeldForAWatcher(t *testing.T) {
	holds := NewHolds(HoldsOptions{Timeout: 5 * time.Second})
	var asked sync.Map
	_, detach := holds.Watch(func(e HoldEvent) {
		if e.Kind != HoldNew {
			return
		}
		asked.Store(e.Pending.Q.Name, e.Pending.Q.Kind)
		go func() {
			p, ok := holds.Take(e.Pending.ID)
			if !ok {
				return
			}
			answer := "deny"
			if strings.HasSuffix(p.Q.Name, " create_issue") {
				answer = "once"
			}
			holds.Finish(p.ID, Outcome{Allow: answer == "once", Answer: answer, By: ByWatcher})
		}()
	})
	defer detach()
	f := newMCPFixtureHolds(t, testMCP, true, holds)
	if _, body, _ := f.post(t, "/mcp", call(1, "create_issue")); !strings.Contains(body, "ran create_issue") {
		t.Errorf("answered once: %q", body)
	}
	if _, body, _ := f.post(t, "/mcp", call(2, "drop_table")); !strings.Contains(body, "denied by a watcher") {
		t.Errorf("answered deny: %q", body)
	}
	if _, body, _ := f.post(t, "/mcp", call(3, "delete_repo")); !strings.Contains(body, "denied by a watcher") {
		t.Errorf("no rule, denied: %q", body)
	}
	if _, body, _ := f.post(t, "/mcp", call(4, "search_private_x")); !strings.Contains(body, "!search_private*") {
		t.Errorf("a ! pattern: %q", body)
	}
	if k, _ := asked.Load("gh create_issue"); k != KindMCPTool {
		t.Errorf("create_issue was asked about as %v", k)
	}
	if _, ok := asked.Load("gh search_private_x"); ok {
		t.Error("a call a ! pattern refuses was held")
	}
	got := mcpRecords(f.done(t, f.c))
	want := []string{
		`allow create_issue allowed by a watcher (once) rule="once"`,
		`deny drop_table denied by a watcher rule=""`,
		`deny delete_repo denied by a watcher rule=""`,
		`deny search_private_x blocked by MCP rule rule="!search_private*"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
