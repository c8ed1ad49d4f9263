package gate

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
)

// localFixture is a gate with a host-local server declared, in front of
// a fakeMCP on 127.0.0.1, and a guest client whose every connection is
// served by ServeLocalMCP on the server's gateway port.
type localFixture struct {
	*fixture
	srv   *fakeMCP
	port  uint16
	c     *http.Client
	hosts []string       // the Host of each request that reached the server
	wg    sync.WaitGroup // the guest's connections being served
}

func newLocalFixture(t testing.TB) *localFixture {
	t.Helper()
	f := &localFixture{srv: &fakeMCP{}}
	var mu sync.Mutex
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		f.hosts = append(f.hosts, r.Host)
		mu.Unlock()
		f.srv.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	p, _ := strconv.Atoi(hs.URL[strings.LastIndex(hs.URL, ":")+1:])
	f.port = uint16(p)
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	al, err := audit.Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	f.fixture = &fixture{ledger: audit.NewLedger(100), log: al, path: path}
	s := testMCP
	s.Name, s.Host, s.Port, s.Local = "ed", "127.0.0.1", f.port, true
	f.g = New(Options{Sandbox: "sb", Audit: al, Ledger: f.ledger, MCP: []MCPServer{s}})
	// The guest's side: loopback TCP standing in for the netstack's
	// connection to the gateway's port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	accepting := make(chan struct{})
	t.Cleanup(func() { cancel(); ln.Close(); <-accepting; f.wg.Wait() })
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.g.ServeLocalMCP(ctx, c, f.port)
			}()
		}
	}()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
	}}
	t.Cleanup(tr.CloseIdleConnections)
	f.c = &http.Client{Timeout: 10 * time.Second, Transport: tr}
	return f
}

func (f *localFixture) do(t *testing.T, method, path, body string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, fmt.Sprintf("http://10.88.0.1:%d%s", f.port, path), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := f.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestLocalMCP(t *testing.T) {
	f := newLocalFixture(t)

	if st, body := f.do(t, "POST", "/mcp", call(1, "read_file")); st != 200 || !strings.Contains(body, "ran read_file") {
		t.Errorf("allowed call: %d %q", st, body)
	}
	st, body := f.do(t, "POST", "/mcp", call(2, "delete_repo"))
	if st != 200 || !strings.Contains(body, `"code":-32001`) || !strings.Contains(body, `refused tools/call \"delete_repo\" on MCP server \"ed\"`) {
		t.Errorf("refused call: %d %q", st, body)
	}
	if _, body = f.do(t, "POST", "/mcp", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); !strings.Contains(body, "read_file") ||
		strings.Contains(body, "delete_repo") {
		t.Errorf("tools/list: %q", body)
	}
	// Nothing but the declared path, and no upgrade out of HTTP.
	for _, tc := range []struct {
		method, path string
		hdr          []string
		want         int
	}{
		{"GET", "/", nil, 404},
		{"POST", "/admin", nil, 404},
		{"GET", "/mcpx", nil, 404},
		{"GET", "/mcp", []string{"Connection", "Upgrade", "Upgrade", "websocket"}, 400},
		{"GET", "/mcp", nil, 400}, // with a body, which only a POST may carry
		{"PUT", "/mcp", nil, 405},
	} {
		if st, body := f.do(t, tc.method, tc.path, call(4, "read_file"), tc.hdr...); st != tc.want {
			t.Errorf("%s %s %v: %d %q, want %d", tc.method, tc.path, tc.hdr, st, body, tc.want)
		}
	}
	if got := strings.Join(f.srv.log(), ","); got != "tools/call read_file,tools/list" {
		t.Errorf("the server got %q; only the allowed call and the listing may arrive", got)
	}
	for _, h := range f.hosts {
		if h != fmt.Sprintf("127.0.0.1:%d", f.port) {
			t.Errorf("the server saw Host %q, not its own address", h)
		}
	}
	// A port no server is declared on is not served, and the dialer
	// reaches no other port of the host's loopback.
	if f.g.LocalMCPPort(f.port + 1) {
		t.Error("an undeclared port is served")
	}
	if c, err := f.g.dialLocal(context.Background(), "tcp", fmt.Sprintf("127.0.0.1:%d", f.port+1)); err == nil {
		c.Close()
		t.Error("the dialer reached an undeclared port")
	}
	if c, err := f.g.dialLocal(context.Background(), "tcp", fmt.Sprintf("10.0.0.1:%d", f.port)); err == nil {
		c.Close()
		t.Error("the dialer reached another address")
	}

	f.c.CloseIdleConnections()
	f.wg.Wait()
	var got []string
	for _, r := range f.records(t) {
		got = append(got, fmt.Sprintf("%s %s %s %s %s %s", r.Proto, r.Method, r.Path, r.MCPTool, r.Verdict, r.Reason))
	}
	want := []string{
		// The request's record, then its call's (written once the answer is over).
		"http POST /mcp  allow " + string(audit.ReasonMCPLocal),
		"mcp POST /mcp read_file allow ",
		"mcp POST /mcp delete_repo deny " + string(audit.ReasonMCPNoRule),
		"http POST /mcp  allow " + string(audit.ReasonMCPLocal),
		"http GET /  deny " + string(audit.NotMCPLocalPath("/mcp")),
		"http POST /admin  deny " + string(audit.NotMCPLocalPath("/mcp")),
		"http GET /mcpx  deny " + string(audit.NotMCPLocalPath("/mcp")),
		"mcp GET /mcp  deny " + string(audit.ReasonMCPMethod),
		"mcp GET /mcp  deny " + string(audit.ReasonMCPMalformed),
		"mcp PUT /mcp  deny " + string(audit.ReasonMCPMethod),
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestLocalMCPServerDown: a declared server that is not running is a
// JSON-RPC error saying so, not a hang or a reset.
func TestLocalMCPServerDown(t *testing.T) {
	f := newLocalFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	f.g.o.MCP[0].Port, f.port = port, port
	st, body := f.do(t, "POST", "/mcp", call(1, "read_file"))
	if st != http.StatusBadGateway || !strings.Contains(body, `did not answer`) || !strings.Contains(body, "is it running?") {
		t.Errorf("%d %q", st, body)
	}
}

// BenchmarkLocalMCPCall measures one tools/call (a POST answered as an
// SSE event) from a kept-alive client to a host-local server: direct,
// and through ServeLocalMCP (the body read and decided, the answer's
// stream filtered, two audit records). Each reports p50 and p99; calls/s
// is 1e9 / ns/op. Figures: docs/mcp.md.
func BenchmarkLocalMCPCall(b *testing.B) {
	f := newLocalFixture(b)
	body := call(1, "read_file")
	run := func(b *testing.B, c *http.Client, url string) {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			req, _ := http.NewRequest("POST", url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(got), "ran read_file") {
				b.Fatalf("answer %q", got)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		reportPercentiles(b, lat)
	}
	b.Run("direct", func(b *testing.B) {
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		run(b, &http.Client{Transport: tr}, fmt.Sprintf("http://127.0.0.1:%d/mcp", f.port))
	})
	b.Run("gate", func(b *testing.B) {
		run(b, f.c, fmt.Sprintf("http://10.88.0.1:%d/mcp", f.port))
	})
}
