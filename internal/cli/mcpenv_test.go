package cli

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/preset"
)

// A project's MCP server needs consent through the whole chain a user
// types: the file parsed, merged, and asked about.
func TestProjectAsksForMCP(t *testing.T) {
	const user, proj = "/root/.config/moat/config.toml", "/src/repo/moat.toml"
	u, err := config.Parse(user, []byte("[mcp.mine]\nurl = \"https://mine.example.com/mcp\"\ntools = [\"*\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := config.Parse(proj, []byte("[mcp.gh]\nurl = \"https://mcp.example.com/mcp\"\ntools = [\"search_*\"]\n"+
		"[mcp.ed]\nurl = \"http://127.0.0.1:7777/mcp\"\ntools = [\"*\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(projectAsks(config.Merge(u, p), user), "\n")
	for _, want := range []string{
		proj + ": network.allow lets the sandbox reach mcp.example.com:443/mcp",
		proj + ": mcp.gh lets the agent use MCP server https://mcp.example.com/mcp, the tools search_*",
		proj + ": mcp.ed lets the agent use the MCP server on this host's http://127.0.0.1:7777/mcp, any tool",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("projectAsks:\n%s\nlacks %q", got, want)
		}
	}
	if strings.Contains(got, "mine") {
		t.Errorf("the user's own server needs no consent:\n%s", got)
	}
}

func TestWithMCPEnv(t *testing.T) {
	cfg := config.Config{
		Secrets: map[string]config.Secret{"K": {Name: "K", Header: "x-api-key"}, "T": {Name: "T"}},
		Network: config.Network{MCP: map[string]config.MCPServer{
			"a": {Name: "a", URL: "https://a.example.com/mcp", Secret: "T"},
			"b": {Name: "b", URL: "https://b.example.com/mcp", Secret: "K"},
			"c": {Name: "c", URL: "https://c.example.com/mcp"},
			"d": {Name: "d", URL: "http://127.0.0.1:7777/mcp", Host: "127.0.0.1", Port: 7777, Path: "/mcp", Local: true},
		}},
	}
	env := withMCPEnv(cfg, nil)
	var got []preset.MCPServer
	if err := json.Unmarshal([]byte(env[preset.MCPEnv]), &got); err != nil {
		t.Fatal(err)
	}
	want := []preset.MCPServer{
		{Name: "a", URL: "https://a.example.com/mcp", Secret: "T", Header: "Authorization", Bearer: true},
		{Name: "b", URL: "https://b.example.com/mcp", Secret: "K", Header: "x-api-key"},
		{Name: "c", URL: "https://c.example.com/mcp"},
		// A host-local server, at the gateway in the guest.
		{Name: "d", URL: "http://10.88.0.1:7777/mcp"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v", got)
	}
	if env := withMCPEnv(config.Config{}, nil); env != nil {
		t.Errorf("no servers: %v", env)
	}
}
