package docker

import (
	"fmt"
	"os"
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

[mcp.docs]
url = "https://mcp.test/mcp"
tools = ["search"]
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
	s.env = append(s.env, fmt.Sprintf("MOAT_UPSTREAM_DNS=%s:%d", hostEnd, dnsPort))
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
}
