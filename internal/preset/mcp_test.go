package preset

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

const testPH = "moat-ph-abcdefghijklmnopqrstuvwxyz234567"

func TestMCPEntries(t *testing.T) {
	v := EncodeMCP([]MCPServer{
		{Name: "gh", URL: "https://mcp.example.com/mcp", Secret: "GH_TOKEN", Header: "Authorization", Bearer: true},
		{Name: "k", URL: "https://k.example.com/", Secret: "K", Header: "x-api-key"},
		{Name: "open", URL: "https://open.example.com/mcp"},
		{Name: "nokey", URL: "https://n.example.com/mcp", Secret: "REAL", Header: "Authorization", Bearer: true},
	})
	env := map[string]string{"GH_TOKEN": testPH, "K": testPH, "REAL": "ghp_a_real_token"}
	got, notes, err := mcpEntries(v, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0].Headers["Authorization"] != "Bearer "+testPH || got[1].Headers["x-api-key"] != testPH ||
		len(got[2].Headers) != 0 || len(got[3].Headers) != 0 {
		t.Errorf("entries %+v", got)
	}
	// A variable that holds no placeholder is never written.
	if len(notes) != 1 || !strings.Contains(notes[0], "nokey") {
		t.Errorf("notes %q", notes)
	}
	if e, _, _ := mcpEntries("", nil); e != nil {
		t.Errorf("no servers: %v", e)
	}
	if _, _, err := mcpEntries("{", nil); err == nil {
		t.Error("a broken list was accepted")
	}
}

func TestMergeClaudeMCP(t *testing.T) {
	in := SeedInput{MCP: []MCPEntry{{Name: "gh", URL: "https://mcp.example.com/mcp", Headers: map[string]string{"Authorization": "Bearer " + testPH}}}}
	old := `{"mcpServers":{"mine":{"type":"stdio","command":"x"},"gh":{"type":"http","url":"https://old"}}}`
	out, changed, err := MergeClaudeConfig([]byte(old), in)
	if err != nil || !changed {
		t.Fatal(err, changed)
	}
	var m struct {
		MCPServers map[string]struct {
			Type, URL, Command string
			Headers            map[string]string
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	gh := m.MCPServers["gh"]
	if gh.Type != "http" || gh.URL != "https://mcp.example.com/mcp" || gh.Headers["Authorization"] != "Bearer "+testPH ||
		m.MCPServers["mine"].Command != "x" {
		t.Errorf("merged %s", out)
	}
	if _, changed, _ := MergeClaudeConfig(out, in); changed {
		t.Error("a second merge changed the file")
	}
	in.MCP[0].Headers["Authorization"] = "Bearer ghp_real"
	if _, _, err := MergeClaudeConfig(nil, in); !errors.Is(err, ErrNotPlaceholder) {
		t.Errorf("a real credential: %v", err)
	}
}

func TestMergeStdioMCP(t *testing.T) {
	in := SeedInput{MCP: []MCPEntry{{Name: "local", Command: []string{"/ws/srv", "serve"}}}}
	out, _, err := MergeClaudeConfig(nil, in)
	if err != nil || !strings.Contains(string(out), `"command": "/ws/srv"`) || !strings.Contains(string(out), `"type": "stdio"`) ||
		!strings.Contains(string(out), `"serve"`) {
		t.Errorf("claude: %v\n%s", err, out)
	}
	out, _, err = MergeCodexConfig(nil, in)
	if err != nil || !strings.Contains(string(out), "command = '/ws/srv'") || !strings.Contains(string(out), "serve") {
		t.Errorf("codex: %v\n%s", err, out)
	}
	if _, changed, _ := MergeCodexConfig(out, in); changed {
		t.Errorf("a second merge changed:\n%s", out)
	}
}

func TestMergeCodexMCP(t *testing.T) {
	in := SeedInput{MCP: []MCPEntry{{Name: "gh", URL: "https://mcp.example.com/mcp", Headers: map[string]string{"Authorization": "Bearer " + testPH}}}}
	out, changed, err := MergeCodexConfig(nil, in)
	if err != nil || !changed {
		t.Fatal(err, changed)
	}
	var m struct {
		MCPServers map[string]struct {
			URL         string            `toml:"url"`
			HTTPHeaders map[string]string `toml:"http_headers"`
		} `toml:"mcp_servers"`
	}
	if err := toml.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	if gh := m.MCPServers["gh"]; gh.URL != "https://mcp.example.com/mcp" || gh.HTTPHeaders["Authorization"] != "Bearer "+testPH {
		t.Errorf("merged:\n%s", out)
	}
	if _, changed, _ := MergeCodexConfig(out, in); changed {
		t.Errorf("a second merge changed the file:\n%s", out)
	}
	in.MCP[0].Headers["Authorization"] = "sk-real"
	if _, _, err := MergeCodexConfig(nil, in); !errors.Is(err, ErrNotPlaceholder) {
		t.Errorf("a real credential: %v", err)
	}
}
