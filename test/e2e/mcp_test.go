package e2e

// End-to-end test of MCP rules (docs/mcp.md; threat model 42): a real MCP server built with the
// official Go SDK, serving streamable HTTP over TLS in the test internet with three tools, and
// a client in the guest built from the same SDK, through the real gate of a real sandbox.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/preset"
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
	auths []bool   // per HTTP request: Authorization was "Bearer " + the real value
	reqs  []string // per HTTP request: its method and the JSON-RPC methods in its body
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
	// create_issue: no pattern of mcpToml names it (a watcher decides it).
	for _, name := range []string{"search_code", "read_file", "delete_repo", "create_issue"} {
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: "test tool " + name},
			func(ctx context.Context, req *mcp.CallToolRequest, args in) (*mcp.CallToolResult, any, error) {
				log.add(name)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran " + name}}}, nil, nil
			})
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		r.Body = io.NopCloser(bytes.NewReader(body))
		methods := regexp.MustCompile(`"method":"([^"]+)"`).FindAllStringSubmatch(string(body), -1)
		desc := r.Method
		for _, m := range methods {
			desc += " " + m[1]
		}
		log.mu.Lock()
		log.auths = append(log.auths, r.Header.Get("Authorization") == "Bearer "+value)
		log.reqs = append(log.reqs, desc)
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

	// Bad input first, by hand (curl): each is refused whole and the gate keeps serving the client
	// that follows.
	post := `curl -s -o out/%s -w '%s=%%{http_code}\n' -X POST -H 'Content-Type: application/json' ` +
		`-H 'Accept: application/json, text/event-stream' -H "Authorization: Bearer $MCP_TOKEN" --data-binary %s https://mcp.test/mcp; `
	batch := `'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file"}},` +
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"delete_repo"}}]'`
	script := fmt.Sprintf(post, "malformed", "MALFORMED", `'{"jsonrpc":"2.0",'`) +
		fmt.Sprintf(post, "twice", "TWICE", `'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","name":"delete_repo"}}'`) +
		fmt.Sprintf(post, "batch", "BATCH", batch) +
		`head -c 5000000 /dev/zero | tr '\0' a > out/big; ` + fmt.Sprintf(post, "large", "LARGE", "@out/big") +
		`echo "PH=$MCP_TOKEN"; echo "SERVERS=$MOAT_MCP_SERVERS"; ./mcpclient https://mcp.test/mcp read_file delete_repo search_code`
	r := moat(t, g.dir, g.env, "run", "--", "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("the guest's client: exit %d\nstdout: %s\nstderr: %s\n%s", r.code, r.stdout, r.stderr, g.daemonLog())
	}
	out := fields(r.stdout)
	t.Logf("guest:\n%s", r.stdout)
	for k, want := range map[string]string{"MALFORMED": "400", "TWICE": "400", "BATCH": "200", "LARGE": "413"} {
		if out[k] != want {
			t.Errorf("%s: HTTP %s, want %s", k, out[k], want)
		}
	}
	if b := readFile(filepath.Join(g.dir, "out", "batch")); strings.Count(b, `"code":-32001`) != 2 || !strings.Contains(b, "batch was refused") {
		t.Errorf("the mixed batch's answer: %s", b)
	}

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
		"tools   deny rule=",
		"tools   deny rule=",
		"tools tools/call read_file deny rule=read_file",
		"tools tools/call delete_repo deny rule=!delete_*",
		"tools   deny rule=",
		"tools tools/call read_file allow rule=read_file",
		"tools tools/call delete_repo deny rule=!delete_*",
		"tools tools/call search_code allow rule=search_*",
	}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("mcp audit records:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
	// What a person reads: the refused call, by tool and rule; the destination is not a denial
	// to allow.
	if a := moat(t, g.dir, g.env, "network", "audit", g.name); !strings.Contains(a.stdout, "mcp.test tools tools/call delete_repo") ||
		!strings.Contains(a.stdout, "!delete_*") {
		t.Errorf("moat network audit:\n%s", a.stdout)
	}
	if d := moat(t, g.dir, g.env, "network", "denials", g.name); strings.Contains(d.stdout, "mcp.test") {
		t.Errorf("moat network denials lists the MCP server:\n%s", d.stdout)
	}

	// A call no pattern decides waits for a watcher: once lets it through, deny refuses it.
	t.Run("watcher", func(t *testing.T) {
		w := attachWatcher(t, g)
		run := startGuest(t, g, "./mcpclient https://mcp.test/mcp create_issue create_issue")
		isHold := func(not string) func(control.Event) bool {
			return func(ev control.Event) bool {
				return ev.Type == control.EventHold && ev.Hold != nil && ev.Hold.Kind == "mcp-tool" &&
					ev.Hold.Name == "tools create_issue" && ev.Hold.ID != not
			}
		}
		first := w.waitFor(t, "hold of create_issue", isHold("")).Hold
		if first.Proto != "mcp" {
			t.Errorf("hold %+v", first)
		}
		answer(t, w, first, control.AnswerOnce, "")
		second := w.waitFor(t, "second hold of create_issue", isHold(first.ID)).Hold
		answer(t, w, second, control.AnswerDeny, "")
		out := fields(run.wait(t))
		if out["OK_create_issue"] != "ran create_issue" || !strings.Contains(out["ERR_create_issue"], "denied by a watcher") {
			t.Errorf("guest: %q", out)
		}
		if ran, _ := log.snapshot(); strings.Count(strings.Join(ran, ","), "create_issue") != 1 {
			t.Errorf("the server ran %q; create_issue once", ran)
		}
	})

	// The cost of a tool call: the same client and calls from the guest through the gate, and
	// from the host straight to the server. Figures for docs/mcp.md; no bound is checked.
	t.Run("bench", func(t *testing.T) {
		const calls = "300"
		r := moat(t, g.dir, g.env, "run", "--", "./mcpclient", "bench", "https://mcp.test/mcp", calls)
		if r.code != 0 {
			t.Fatalf("through the gate: exit %d\n%s", r.code, r.stderr)
		}
		gate := fields(r.stdout)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(g.dir, "mcpclient"), "bench", "https://mcp.test/mcp", calls)
		cmd.Env = append(os.Environ(), "MCP_DIAL="+mcpIP+":443", "SSL_CERT_FILE="+g.ca, "MCP_TOKEN="+value)
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("direct: %v", err)
		}
		direct := fields(string(b))
		t.Logf("tool call x%s   gate p50 %s us p99 %s us %s calls/s   direct p50 %s us p99 %s us %s calls/s",
			calls, gate["P50_US"], gate["P99_US"], gate["PER_S"], direct["P50_US"], direct["P99_US"], direct["PER_S"])
	})
}

// TestMCPAgents: the real Claude Code and Codex, installed from their npm packages. Claude Code,
// started by `moat run claude` against the stand-in model API, gets the declared servers in its
// own configuration with the placeholder, connects to the remote one through the gate (the server
// sees the real value) and starts the stdio one in the guest, and offers the model only the tools
// the rules allow. Codex reads the configuration `moat run codex` wrote.
func TestMCPAgents(t *testing.T) {
	reg := npmRegistry(t)
	name := "mcp-claude-e2e"
	dir := project(t, name)
	state := filepath.Join(moatHome, "state", "sandboxes", name)
	u, _ := url.Parse(reg)
	toml := fmt.Sprintf("[network]\nallow = [%q]\n", u.Hostname())
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	// The install first, with the host's DNS, before the test internet exists (as TestAgents).
	start := time.Now()
	r := moatWithin(t, dir, 15*time.Minute, "run", "--", "sudo", "-n", "npm", "install", "-g", "--no-fund", "--no-audit", "--registry", reg, claudePackage, codexPackage)
	if r.code != 0 {
		t.Fatalf("npm install -g %s %s through the gate: exit %d\nstdout: %s\nstderr: %s", claudePackage, codexPackage, r.code, tail(r.stdout, 30), tail(r.stderr, 30))
	}
	t.Logf("npm install -g %s %s through the gate: %v", claudePackage, codexPackage, time.Since(start).Round(time.Second))
	if r := moat(t, dir, nil, "down"); r.code != 0 {
		t.Fatalf("moat down: exit %d\n%s", r.code, r.stderr)
	}

	n := inet.Start(t)
	p, _ := preset.Lookup("claude")
	var bodies modelBodies
	n.HTTPS(t, standinIP, 443, p.Hosts, bodies.wrap(inet.ModelAPI("standin-answer")))
	for _, h := range p.Hosts {
		n.SetA(h, standinIP)
	}
	value := "mv" + randHex(t, 20)
	log := &mcpServerLog{}
	n.HTTPS(t, mcpIP, 443, []string{"mcp.test"}, newMCPServer(value, log))
	n.SetA("mcp.test", mcpIP)
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, n.CA().PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	toml += fmt.Sprintf("trust = [%q]\n", ca) + mcpToml[strings.Index(mcpToml, "[secrets."):] +
		// A one-turn -p run asks the model before a server still connecting is ready (the
		// default), and with tool search the model is offered a search tool, not the MCP tools:
		// both off, so the first request lists the tools Claude Code got.
		"\n[env]\nMCP_CONNECTION_NONBLOCKING = \"false\"\nENABLE_TOOL_SEARCH = \"false\"\n" +
		// A stdio server the agent runs in the sandbox.
		fmt.Sprintf("\n[mcp.local]\ncommand = [%q, \"serve\"]\n", filepath.Join(dir, "mcpclient"))
	installMCPClient(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"MOAT_UPSTREAM_DNS=" + upstreamDNS, "MOAT_TEST_MCP=" + value, "ANTHROPIC_API_KEY=sk-ant-canary-" + randHex(t, 20)}
	if r := moat(t, dir, env, "up", "--reconfigure", "--trust-project"); r.code != 0 {
		t.Fatalf("moat up --reconfigure: exit %d\n%s", r.code, r.stderr)
	}
	r = moat(t, dir, env, "run", "claude", "--", "-p", "say hello")
	if r.code != 0 || !strings.Contains(r.stdout, "standin-answer") {
		t.Fatalf("moat run claude -- -p: exit %d\nstdout: %s\nstderr: %s\n%s", r.code, tail(r.stdout, 20), tail(r.stderr, 20),
			tail(readFile(filepath.Join(state, "daemon.log")), 20))
	}
	cfg := moat(t, dir, env, "run", "--", "sh", "-c", "cat ~/.claude.json")
	if !strings.Contains(cfg.stdout, `"url": "https://mcp.test/mcp"`) || !strings.Contains(cfg.stdout, `"Authorization": "Bearer moat-ph-`) ||
		strings.Contains(cfg.stdout, value) {
		t.Errorf("~/.claude.json in the guest:\n%s", cfg.stdout)
	}
	_, auths := log.snapshot()
	if len(auths) == 0 {
		t.Error("Claude Code never reached the MCP server")
	}
	for i, ok := range auths {
		if !ok {
			t.Errorf("request %d reached the MCP server without the real credential", i)
		}
	}
	// Codex reads what moat run codex wrote: both servers, the header by name only.
	if r := moat(t, dir, env, "run", "codex", "--", "--version"); r.code != 0 {
		t.Errorf("moat run codex -- --version: exit %d\n%s", r.code, tail(r.stderr, 20))
	}
	cl := moat(t, dir, env, "run", "--", "codex", "mcp", "list")
	if cl.code != 0 || !strings.Contains(cl.stdout, "https://mcp.test/mcp") || !strings.Contains(cl.stdout, "local") ||
		strings.Contains(cl.stdout+cl.stderr, value) {
		t.Errorf("codex mcp list: exit %d\nstdout: %s\nstderr: %s", cl.code, cl.stdout, tail(cl.stderr, 20))
	}
	t.Logf("codex mcp list:\n%s", cl.stdout)
	offered := bodies.all()
	if !strings.Contains(offered, "mcp__tools__read_file") || !strings.Contains(offered, "mcp__tools__search_code") ||
		!strings.Contains(offered, "mcp__local__local_echo") || strings.Contains(offered, "delete_repo") {
		log.mu.Lock()
		reqs := log.reqs
		log.mu.Unlock()
		t.Errorf("the tools Claude Code offered the model are not the allowed ones (read_file and search_code, and the stdio server's local_echo): %q\n"+
			"requests to the MCP server: %q\nclaude's MCP lines: %s", regexp.MustCompile(`mcp__[A-Za-z0-9_]+|delete_repo`).FindAllString(offered, -1), reqs, mcpLines(r.stdout+r.stderr))
	}
}

// modelBodies keeps the bodies of the requests to the stand-in model API: the tools an agent
// offers the model are in them.
type modelBodies struct {
	mu sync.Mutex
	b  []string
}

func (m *modelBodies) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		m.mu.Lock()
		m.b = append(m.b, string(b))
		m.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		h.ServeHTTP(w, r)
	})
}

func (m *modelBodies) all() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.b, "\n")
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// mcpLines are the lines of an agent's debug output about MCP, for a failure's message.
func mcpLines(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(strings.ToLower(l), "mcp") {
			out = append(out, gateClip(l, 400))
		}
	}
	return tail(strings.Join(out, "\n"), 40)
}
