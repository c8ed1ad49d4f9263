package e2e

// End-to-end test of a host-local MCP server (docs/mcp.md, "Servers on the host"): a real MCP
// server built with the official Go SDK on the host's 127.0.0.1 with three tools, declared as
// [mcp.ed] url = "http://127.0.0.1:PORT/mcp", and the same SDK's client in the guest at
// 10.88.0.1:PORT, through the real daemon, netstack and gate of a real sandbox.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
)

// mcpLocalToml leaves search_code to no pattern: refused at once without a watcher, held for
// one when one is attached.
const mcpLocalToml = `[network]
use = ["none"]

[mcp.ed]
url = "http://127.0.0.1:%d/mcp"
tools = ["read_file", "!delete_*"]
`

// localMCPServer serves the SDK's streamable HTTP handler, with its DNS rebinding protection on
// (the default), on the host's 127.0.0.1; log records what reached it.
func localMCPServer(t *testing.T, log *mcpServerLog) int {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "moat-e2e-local-server", Version: "v1"}, nil)
	type in struct {
		Q string `json:"q"`
	}
	for _, name := range []string{"read_file", "search_code", "delete_repo"} {
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: "test tool " + name},
			func(ctx context.Context, req *mcp.CallToolRequest, args in) (*mcp.CallToolResult, any, error) {
				log.add(name)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran " + name}}}, nil, nil
			})
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		log.mu.Lock()
		log.reqs = append(log.reqs, "OTHER "+r.Method+" "+r.URL.Path)
		log.mu.Unlock()
		http.Error(w, "the host server's other page", http.StatusTeapot)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func TestMCPLocal(t *testing.T) {
	log := &mcpServerLog{}
	port := localMCPServer(t, log)
	other := hostServer(t, "must-not-be-reached")
	g := &gateEnv{name: "mcp-local-e2e", state: filepath.Join(moatHome, "state", "sandboxes", "mcp-local-e2e")}
	g.dir = project(t, g.name)
	if err := os.WriteFile(filepath.Join(g.dir, "moat.toml"), []byte(fmt.Sprintf(mcpLocalToml, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	installMCPClient(t, g.dir)
	if r := moat(t, g.dir, nil, "up", "--trust-project"); r.code != 0 {
		t.Fatalf("moat up: exit %d\nstdout: %s\nstderr: %s\n%s", r.code, r.stdout, r.stderr, g.daemonLog())
	}
	url := fmt.Sprintf("http://%s:%d/mcp", gatewayIP, port)

	// The client through the declared path; then, by hand, what is not MCP: another path on the
	// same port, bytes that are not HTTP, and a host port nothing declares.
	script := fmt.Sprintf(`echo "SERVERS=$MOAT_MCP_SERVERS"; ./mcpclient %s read_file delete_repo search_code
curl -s -o /dev/null -w 'OTHERPATH=%%{http_code}\n' http://%s:%d/admin
python3 - <<'EOF'
import socket
s = socket.create_connection(("%s", %d), 5)
s.settimeout(5)
s.sendall(b"\x16\x03\x01\x02\x00 not http\r\n\r\n")
print("RAW=" + s.recv(200).decode(errors="replace").split("\r\n")[0])
try:
    socket.create_connection(("%s", %d), 3)
    print("UNDECLARED=open")
except ConnectionRefusedError:
    print("UNDECLARED=refused")
EOF`, url, gatewayIP, port, gatewayIP, port, gatewayIP, other.port)
	r := moat(t, g.dir, nil, "run", "--", "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("the guest: exit %d\nstdout: %s\nstderr: %s\n%s", r.code, r.stdout, r.stderr, g.daemonLog())
	}
	t.Logf("guest:\n%s", r.stdout)
	out := fields(r.stdout)
	if !strings.Contains(out["SERVERS"], url) {
		t.Errorf("the session's MCP servers name %q, want the in-guest URL %s", out["SERVERS"], url)
	}
	if out["TOOLS"] != "read_file" {
		t.Errorf("tools/list gave %q, want read_file only", out["TOOLS"])
	}
	if out["OK_read_file"] != "ran read_file" {
		t.Errorf("the allowed call: %q", out["OK_read_file"])
	}
	if e := out["ERR_delete_repo"]; !strings.Contains(e, `refused tools/call "delete_repo" on MCP server "ed"`) || !strings.Contains(e, `"!delete_*"`) {
		t.Errorf("the refused call's error: %q", e)
	}
	if e := out["ERR_search_code"]; !strings.Contains(e, `no pattern of [mcp.ed] tools`) {
		t.Errorf("the call no pattern allows: %q", e)
	}
	if out["OTHERPATH"] != "404" || out["RAW"] != "HTTP/1.1 400 Bad Request" || out["UNDECLARED"] != "refused" {
		t.Errorf("another path: %q, bytes that are not HTTP: %q, an undeclared port: %q; want 404, a 400 and refused",
			out["OTHERPATH"], out["RAW"], out["UNDECLARED"])
	}
	ran, _ := log.snapshot()
	log.mu.Lock()
	reqs := strings.Join(log.reqs, "\n")
	log.mu.Unlock()
	if strings.Join(ran, ",") != "read_file" || reqs != "" {
		t.Errorf("the server ran %q and saw %q; only read_file may arrive", ran, reqs)
	}
	if n := other.accepts.Load(); n != 0 {
		t.Errorf("the undeclared host port accepted %d connections", n)
	}

	// One audit record per call; the refused path and port are audited too.
	var calls []string
	var other404, undeclared int
	err := audit.Read(filepath.Join(g.state, "audit", "audit.jsonl"), func(rec audit.Record) bool {
		switch {
		case rec.Proto == "mcp":
			calls = append(calls, fmt.Sprintf("%s %s %s %s rule=%s", rec.MCPServer, rec.MCPMethod, rec.MCPTool, rec.Verdict, rec.Rule))
		case rec.Proto == "http" && rec.Path == "/admin" && rec.Verdict == audit.Deny:
			other404++
		case rec.Proto == "tcp" && rec.Dst == fmt.Sprintf("%s:%d", gatewayIP, other.port) && rec.Verdict == audit.Deny:
			undeclared++
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ed tools/call read_file allow rule=read_file",
		"ed tools/call delete_repo deny rule=!delete_*",
		"ed tools/call search_code deny rule=",
	}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("mcp audit records:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
	if other404 != 1 || undeclared != 1 {
		t.Errorf("records of the other path: %d, of the undeclared port: %d; want one each", other404, undeclared)
	}

	// No reverse forward may meet the server's port, on the gateway's side or the host's: it
	// would carry raw bytes to the server around its rules.
	t.Run("no_forward_around_it", func(t *testing.T) {
		for _, spec := range []string{fmt.Sprint(port), fmt.Sprintf("%d:%d", port, freePort(t))} {
			r := moat(t, g.dir, nil, "forward", "add", "--reverse", g.name, spec)
			if r.code != 2 || !strings.Contains(r.stderr, "MCP server ed's") {
				t.Errorf("forward add --reverse %s: exit %d, stderr %q; want a usage error naming the server", spec, r.code, r.stderr)
			}
		}
	})

	// A call no pattern decides waits for a watcher, as for a remote server.
	t.Run("watcher", func(t *testing.T) {
		w := attachWatcher(t, g)
		run := startGuest(t, g, "./mcpclient "+url+" search_code search_code")
		isHold := func(not string) func(control.Event) bool {
			return func(ev control.Event) bool {
				return ev.Type == control.EventHold && ev.Hold != nil && ev.Hold.Kind == "mcp-tool" &&
					ev.Hold.Name == "ed search_code" && ev.Hold.ID != not
			}
		}
		first := w.waitFor(t, "hold of search_code", isHold("")).Hold
		answer(t, w, first, control.AnswerOnce, "")
		second := w.waitFor(t, "second hold of search_code", isHold(first.ID)).Hold
		answer(t, w, second, control.AnswerDeny, "")
		out := fields(run.wait(t))
		if out["OK_search_code"] != "ran search_code" || !strings.Contains(out["ERR_search_code"], "denied by a watcher") {
			t.Errorf("guest: %q", out)
		}
		if ran, _ := log.snapshot(); strings.Count(strings.Join(ran, ","), "search_code") != 1 {
			t.Errorf("the server ran %q; search_code once", ran)
		}
	})

	// The cost of a tool call: the same client and calls from the guest through the gate, and
	// from the host straight to the server. Figures for docs/mcp.md; no bound is checked.
	t.Run("bench", func(t *testing.T) {
		const calls = "300"
		r := moat(t, g.dir, nil, "run", "--", "./mcpclient", "bench", url, calls)
		if r.code != 0 {
			t.Fatalf("through the gate: exit %d\n%s", r.code, r.stderr)
		}
		gate := fields(r.stdout)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		b, err := exec.CommandContext(ctx, filepath.Join(g.dir, "mcpclient"), "bench", fmt.Sprintf("http://127.0.0.1:%d/mcp", port), calls).Output()
		if err != nil {
			t.Fatalf("direct: %v", err)
		}
		direct := fields(string(b))
		t.Logf("local tool call x%s   gate p50 %s us p99 %s us %s calls/s   direct p50 %s us p99 %s us %s calls/s",
			calls, gate["P50_US"], gate["P99_US"], gate["PER_S"], direct["P50_US"], direct["P99_US"], direct["PER_S"])
	})
}
