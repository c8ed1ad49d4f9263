package docker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const mcpPolicy = `[sandbox]
name = "NAME"
image = "IMAGE"
runtime = "docker"

[network]
trust = ["WS/upstream-ca.pem"]

[secrets.MCP_TOKEN]
from = "env:MOAT_DOCKER_MCP_TOKEN"
hosts = ["mcp.test"]

[mcp.docs]
url = "https://mcp.test/mcp"
secret = "MCP_TOKEN"
tools = ["search"]

[env]
PATH = "WS/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
`

// claudeMCP stands in for Claude Code: it shows the MCP servers the
// seeding role wrote, and calls the declared one as the configuration
// says, with the header it names.
const claudeMCP = `#!/bin/sh
echo "--- claude.json"; cat "$HOME/.claude.json"; echo
auth=$(sed -n 's/.*"Authorization": *"\([^"]*\)".*/\1/p' "$HOME/.claude.json" | head -1)
echo "auth=$auth"
curl -sS -m 10 -H "Authorization: $auth" -H "Content-Type: application/json" -H "Accept: application/json, text/event-stream" \
  --data-binary '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{}}}' https://mcp.test/mcp
`

// TestDockerMCP: an [mcp.NAME] declaration on a Docker sandbox reaches its
// gate, which decides each call by the tool's name as in a gVisor
// sandbox: an allowed tool reaches the server, another is refused with
// the gate's JSON-RPC error and never leaves; the session names the
// server for the agents.
func TestDockerMCP(t *testing.T) {
	caPEM, leaf := leafFor(t, "mcp.test")
	s := newSandbox(t, mcpPolicy, map[string][]byte{"upstream-ca.pem": caPEM})
	const dnsPort = 5353
	token := fmt.Sprintf("mcp-docker-canary-%d", time.Now().UnixNano())
	s.env = append(s.env, fmt.Sprintf("MOAT_UPSTREAM_DNS=%s:%d", hostEnd, dnsPort), "MOAT_DOCKER_MCP_TOKEN="+token)
	if err := os.MkdirAll(filepath.Join(s.ws, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.ws, "bin", "claude"), []byte(claudeMCP), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := startStandin(t, dnsPort, leaf, "mcp.test")
	call := func(tool string) string {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":%q,"arguments":{}}}`, tool)
		if err := os.WriteFile(filepath.Join(s.ws, "call.json"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		out, errs, _ := s.run(t, time.Minute, "curl", "-sS", "-m", "10", "-H", "Content-Type: application/json",
			"-H", "Accept: application/json, text/event-stream", "--data-binary", "@"+filepath.Join(s.ws, "call.json"), "https://mcp.test/mcp")
		return out + errs
	}
	if out := call("search"); !strings.Contains(out, "standin-answer") {
		t.Errorf("tools/call search: %q; want the server's answer", out)
	}
	out := call("delete_everything")
	if !strings.Contains(out, "-32001") || !strings.Contains(out, "moat") {
		t.Errorf("tools/call delete_everything: %q; want the gate's JSON-RPC refusal (-32001)", out)
	}
	_, paths := srv.seen()
	srv.mu.Lock()
	bodies := append([]string(nil), srv.bodies...)
	srv.mu.Unlock()
	for i, b := range bodies {
		if strings.Contains(b, "delete_everything") {
			t.Errorf("the server got the refused call on %s: %s", paths[i], b)
		}
	}
	if len(bodies) == 0 {
		t.Error("the server saw no call")
	}
	if env := s.must(t, "sh", "-c", "echo $MOAT_MCP_SERVERS"); !strings.Contains(env, "docs") || !strings.Contains(env, "mcp.test") {
		t.Errorf("MOAT_MCP_SERVERS in the session: %q; want the docs server", env)
	}

	// The preset writes the server into the agent's settings with the
	// secret's placeholder, which the gate swaps for the server only.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, "run", "--trust-project", "claude", "--", "-p", "hi")
	cmd.Dir, cmd.Env = s.ws, s.env
	got, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("moat run claude: %v\n%s", err, got)
	}
	t.Logf("the fake claude's output:\n%s", got)
	if !strings.Contains(string(got), `"mcpServers"`) || !strings.Contains(string(got), "https://mcp.test/mcp") {
		t.Errorf("~/.claude.json has no docs server:\n%s", got)
	}
	if !strings.Contains(string(got), "auth=Bearer moat-ph-") {
		t.Errorf("the docs server's header in ~/.claude.json is not the placeholder:\n%s", got)
	}
	if strings.Contains(string(got), token) {
		t.Error("the real MCP token reached the guest")
	}
	srv.mu.Lock()
	auths := append([]string(nil), srv.auths...)
	srv.mu.Unlock()
	if len(auths) == 0 {
		t.Fatal("the server saw no request")
	}
	if last := auths[len(auths)-1]; last != "Bearer "+token {
		t.Errorf("the server got Authorization %q; want the real token, swapped in by the gate", last)
	}
}
