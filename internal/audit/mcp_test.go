package audit

import (
	"encoding/json"
	"testing"
	"time"
)

// TestMCPFieldsFrozen pins the names added with MCP rules, and their
// reasons' words.
func TestMCPFieldsFrozen(t *testing.T) {
	when := time.Date(2026, 3, 1, 12, 30, 45, 0, time.UTC)
	got, err := json.Marshal(Record{Schema: Schema, Time: when, Sandbox: "api", Proto: "mcp", Dst: "192.0.2.1:443",
		Verdict: Deny, Rule: "!delete_*", Reason: ReasonMCPBlocked, MCPServer: "gh", MCPMethod: "tools/call",
		MCPTool: "delete_repo", MCPURI: "repo://x", MCPArguments: `{"q":1}`})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"schema":1,"time":"2026-03-01T12:30:45Z","sandbox":"api","proto":"mcp","dst":"192.0.2.1:443",` +
		`"verdict":"deny","rule":"!delete_*","reason":"blocked by MCP rule","bytes_up":0,"bytes_down":0,"duration_ms":0,` +
		`"mcp_server":"gh","mcp_method":"tools/call","mcp_tool":"delete_repo","mcp_uri":"repo://x","mcp_arguments":"{\"q\":1}"}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	for r, w := range map[Reason]string{
		ReasonMCPNoRule: "no MCP rule allows it", ReasonMCPBlocked: "blocked by MCP rule",
		ReasonMCPMethod: "MCP method not let through", ReasonMCPBatch: "refused with its batch",
		ReasonMCPMalformed: "malformed MCP message", ReasonMCPTooLarge: "MCP message too large",
	} {
		if string(r) != w {
			t.Errorf("reason %q changed from %q", r, w)
		}
	}
}
