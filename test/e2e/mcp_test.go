package e2e

// End-to-end test of MCP rules (docs/mcp.md; threat model 42): a real MCP server built with the
// official Go SDK, serving streamable HTTP over TLS in the test internet with three tools, and
// a client in the guest built from the same SDK, through the real gate of a real sandbox.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/test/inet"
)

const mcpIP = "198.51.100.74"

// mcpToml declares the server with one tool refused by a "!" pattern and one no pattern names
// (default deny is checked by the unit tests; here the refusal that names a rule).
const mcpToml = `[network]
use = ["none"]
trust = [%q]

[secrets.MCP_TOKEN]
from = "env:MOAT_TEST_MCP"
hosts = ["mcp.test"]

[mcp.tools]
url = "https://mcp.test/mcp"
secret = "MCP_TOKEN"
tools = ["search_*", "read_file", "!delete_*"]
`

// mcpServerLog is the server's own record of what reached it: every tool handler it ran, and
// whether each request carried the real credential.
type mcpServerLog struct {
	mu    sync.Mutex
	ran   []string
	auths []bool // per HTTP request: Authorization was "Bearer " + the real value
}

func (l *mcpServerLog) add(tool string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ran = append(l.ran, tool)
}

func (l *mcpServerLog) snapshot() ([]string, []bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ran...), append([]bool(nil), l.auths...)
}

// newMCPServer is the SDK's streamable HTTP handler for a server with three tools.
func newMCPServer(value string, log *mcpServerLog) http.Handler {
	s := mcp.NewServer(&mcp.Implementation{Name: "moat-e2e-server", Version: "v1"}, nil)
	type in struct {
		Q string `json:"q"`
	}
	for _, name := range []string{"search_code", "read_file", "delete_repo"} {
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: "test tool " + name},
			func(ctx context.Context, req *mcp.CallToolRequest, args in) (*mcp.CallToolResult, any, error) {
				log.add(name)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran " + name}}}, nil, nil
			})
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.mu.Lock()
		log.auths = append(log.auths, r.Header.Get("Authorization") == "Bearer "+value)
		log.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

// installMCPClient builds test/e2e/mcpclient into dir (the workspace, the same path in the guest).
func installMCPClient(t *testing.T, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-o", filepath.Join(dir, "mcpclient"), "./mcpclient")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the MCP client: %v\n%s", err, b)
	}
}

func TestMCP(t *testing.T) {
	n := inet.Start(t)
	value := "mv" + randHex(t, 20)
	log := &mcpServerLog{}
	g := newGateEnv(t, n, "mcp-e2e", "")
	if err := os.WriteFile(filepath.Join(g.dir, "moat.toml"), []byte(fmt.Sprintf(mcpToml, g.ca)), 0o644); err != nil {
		t.Fatal(err)
	}
	g.env = append(g.env, "MOAT_TEST_MCP="+value)
	g.serve("mcp:443", n.HTTPS(t, mcpIP, 443, []string{"mcp.test"}, newMCPServer(value, log)), false)
	n.SetA("mcp.test", mcpIP)
	installMCPClient(t, g.dir)
	if r := moat(t, g.dir, g.env, "up", "--trust-project"); r.code != 0 {
		t.Fatalf("moat up: exit %d\nstdout: %s\nstderr: %s\n%s", r.code, r.stdout, r.stderr, g.daemonLog())
	}

	r := moat(t, g.dir, g.env, "run", "--", "sh", "-c",
		`echo "PH=$MCP_TOKEN"; echo "SERVERS=$MOAT_MCP_SERVERS"; ./mcpclient https://mcp.test/mcp read_file delete_repo search_code`)
	if r.code != 0 {
		t.Fatalf("the guest's client: exit %d\nstdout: %s\nstderr: %s\n%s", r.code, r.stdout, r.stderr, g.daemonLog())
	}
	out := fields(r.stdout)
	t.Logf("guest:\n%s", r.stdout)

	// The guest holds the placeholder, never the value; the server saw the value on every request.
	if !strings.HasPrefix(out["PH"], "moat-ph-") || strings.Contains(r.stdout+r.stderr, value) {
		t.Errorf("the guest's credential is %q (or the value leaked into its output)", out["PH"])
	}
	if !strings.Contains(out["SERVERS"], `"name":"tools"`) || strings.Contains(out["SERVERS"], "moat-ph-") {
		t.Errorf("the session's MCP servers: %q", out["SERVERS"])
	}
	// tools/list shows the allowed tools only.
	if out["TOOLS"] != "read_file,search_code" && out["TOOLS"] != "search_code,read_file" {
		t.Errorf("tools/list gave %q, want read_file and search_code", out["TOOLS"])
	}
	if out["OK_read_file"] != "ran read_file" || out["OK_search_code"] != "ran search_code" {
		t.Errorf("allowed calls: read_file %q, search_code %q", out["OK_read_file"], out["OK_search_code"])
	}
	// The refused call gets the gate's JSON-RPC error, naming the rule and what allows it.
	if e := out["ERR_delete_repo"]; !strings.Contains(e, `refused tools/call "delete_repo"`) || !strings.Contains(e, `"!delete_*"`) ||
		!strings.Contains(e, "moat up --reconfigure") {
		t.Errorf("the refused call's error: %q", e)
	}
	ran, auths := log.snapshot()
	if strings.Join(ran, ",") != "read_file,search_code" {
		t.Errorf("the server ran %q; delete_repo must never arrive", ran)
	}
	for i, ok := range auths {
		if !ok {
			t.Errorf("request %d reached the server without the real credential", i)
		}
	}
	if len(auths) == 0 {
		t.Error("no request reached the server")
	}

	// One audit record per call.
	var calls []string
	err := audit.Read(filepath.Join(g.state, "audit", "audit.jsonl"), func(rec audit.Record) bool {
		if rec.Proto == "mcp" {
			calls = append(calls, fmt.Sprintf("%s %s %s %s rule=%s", rec.MCPServer, rec.MCPMethod, rec.MCPTool, rec.Verdict, rec.Rule))
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"tools tools/call read_file allow rule=read_file",
		"tools tools/call delete_repo deny rule=!delete_*",
		"tools tools/call search_code allow rule=search_*",
	}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("mcp audit records:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
}
