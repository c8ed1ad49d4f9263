package preset

// MCP servers in the agents' own configuration. A sandbox's [mcp.NAME]
// servers reach the guest in the session's environment (MCPEnv, written
// by the CLI: names, URLs and which secret's placeholder goes in which
// header, never a value); the seeding role writes each into the agent's
// MCP configuration with the placeholder the guest holds, which the gate
// swaps for the value on the way to the server's host:
//
//	~/.claude.json        mcpServers.NAME = {type: "http", url, headers}
//	                      (Claude Code's user scope: every project)
//	~/.codex/config.toml  [mcp_servers.NAME] url, http_headers
//
// moat owns the names it declares: an entry of the same name is replaced
// (a sandbox made again has new placeholders), others are left alone.

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"moat.dev/moat/internal/secret"
)

// MCPEnv is the session variable that lists the sandbox's MCP servers.
const MCPEnv = "MOAT_MCP_SERVERS"

// MCPServer is one declared server as the guest learns of it.
type MCPServer struct {
	Name string `json:"name"`
	URL  string `json:"url,omitempty"`
	// Command is a stdio server's program and arguments (no URL then).
	Command []string `json:"command,omitempty"`
	// Secret is the name of the variable whose placeholder is sent in
	// Header ("" with no secret); Bearer says the header's value is
	// "Bearer " and the placeholder (Authorization).
	Secret string `json:"secret,omitempty"`
	Header string `json:"header,omitempty"`
	Bearer bool   `json:"bearer,omitempty"`
}

// EncodeMCP is MCPEnv's value for servers ("" for none).
func EncodeMCP(servers []MCPServer) string {
	if len(servers) == 0 {
		return ""
	}
	b, _ := json.Marshal(servers)
	return string(b)
}

// MCPEntry is a server with its headers resolved, as an agent's
// configuration holds it.
type MCPEntry struct {
	Name    string
	URL     string
	Command []string
	Headers map[string]string
}

// mcpEntries resolves MCPEnv's value with the placeholders in the
// environment (getenv). A server whose secret has no placeholder here is
// written without the header, and said so in notes.
func mcpEntries(v string, getenv func(string) string) (entries []MCPEntry, notes []string, err error) {
	if v == "" {
		return nil, nil, nil
	}
	var servers []MCPServer
	if err := json.Unmarshal([]byte(v), &servers); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", MCPEnv, err)
	}
	for _, s := range servers {
		e := MCPEntry{Name: s.Name, URL: s.URL, Command: s.Command, Headers: map[string]string{}}
		if s.Secret != "" {
			ph := getenv(s.Secret)
			if !strings.HasPrefix(ph, secret.PlaceholderPrefix) {
				notes = append(notes, fmt.Sprintf("MCP server %s: $%s holds no moat placeholder; written without its credential", s.Name, s.Secret))
			} else if s.Bearer {
				e.Headers[s.Header] = "Bearer " + ph
			} else {
				e.Headers[s.Header] = ph
			}
		}
		entries = append(entries, e)
	}
	return entries, notes, nil
}

// checkPlaceholders refuses a header value that is not a placeholder
// (after "Bearer "): seeding never writes a real credential.
func checkPlaceholders(e MCPEntry) error {
	for h, v := range e.Headers {
		if !strings.HasPrefix(strings.TrimPrefix(v, "Bearer "), secret.PlaceholderPrefix) {
			return fmt.Errorf("MCP server %s, header %s: %w", e.Name, h, ErrNotPlaceholder)
		}
	}
	return nil
}

// mergeClaudeMCP writes in.MCP into ~/.claude.json's mcpServers.
func mergeClaudeMCP(m map[string]any, in SeedInput) error {
	if len(in.MCP) == 0 {
		return nil
	}
	servers := object(m, "mcpServers")
	for _, e := range in.MCP {
		if err := checkPlaceholders(e); err != nil {
			return err
		}
		entry := map[string]any{"type": "http", "url": e.URL}
		if len(e.Command) > 0 {
			entry = map[string]any{"type": "stdio", "command": e.Command[0], "args": anyList(e.Command[1:])}
		}
		if len(e.Headers) > 0 {
			h := map[string]any{}
			for k, v := range e.Headers {
				h[k] = v
			}
			entry["headers"] = h
		}
		servers[e.Name] = entry
	}
	return nil
}

// mergeCodexMCP writes in.MCP into config.toml's mcp_servers; it
// reports whether anything changed.
func mergeCodexMCP(m map[string]any, in SeedInput) (bool, error) {
	if len(in.MCP) == 0 {
		return false, nil
	}
	servers := object(m, "mcp_servers")
	changed := false
	for _, e := range in.MCP {
		if err := checkPlaceholders(e); err != nil {
			return false, err
		}
		entry := map[string]any{"url": e.URL}
		if len(e.Command) > 0 {
			entry = map[string]any{"command": e.Command[0], "args": anyList(e.Command[1:])}
		}
		if len(e.Headers) > 0 {
			h := map[string]any{}
			for k, v := range e.Headers {
				h[k] = v
			}
			entry["http_headers"] = h
		}
		if old, ok := servers[e.Name].(map[string]any); ok && sameCodexEntry(old, entry) {
			continue
		}
		servers[e.Name], changed = entry, true
	}
	return changed, nil
}

// anyList is l as decoded JSON or TOML holds a list, so that a merge
// compares what it wrote with what it reads back.
func anyList(l []string) []any {
	out := make([]any, len(l))
	for i, s := range l {
		out[i] = s
	}
	return out
}

func sameCodexEntry(a, b map[string]any) bool {
	if a["url"] != b["url"] || a["command"] != b["command"] || len(a) != len(b) {
		return false
	}
	if aa, ab := a["args"], b["args"]; aa != nil || ab != nil {
		la, _ := aa.([]any)
		lb, _ := ab.([]any)
		if !slices.Equal(la, lb) {
			return false
		}
	}
	ha, _ := a["http_headers"].(map[string]any)
	hb, _ := b["http_headers"].(map[string]any)
	return maps.EqualFunc(ha, hb, func(x, y any) bool { return x == y })
}

// mcpFromEnv reads the session's servers for seeding; problems are
// reported, never fatal (the agent runs without them).
func mcpFromEnv(report func(string)) []MCPEntry {
	entries, notes, err := mcpEntries(os.Getenv(MCPEnv), os.Getenv)
	if err != nil {
		report(err.Error())
		return nil
	}
	for _, n := range notes {
		report(n)
	}
	slices.SortFunc(entries, func(a, b MCPEntry) int { return strings.Compare(a.Name, b.Name) })
	return entries
}
