package cli

import (
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/preset"
)

// withMCPEnv tells a session the sandbox's MCP servers (preset.MCPEnv),
// which `moat run claude` and `moat run codex` write into the agent's own
// configuration. It carries names, URLs and which secret's placeholder
// goes in which header; a secret without a header of its own is sent as
// a bearer token.
func withMCPEnv(cfg config.Config, sessEnv map[string]string) map[string]string {
	var servers []preset.MCPServer
	for _, s := range config.SortedMCP(cfg.Network.MCP) {
		// A host-local server is at the gateway's port in the guest.
		ps := preset.MCPServer{Name: s.Name, URL: s.GuestURL(netstack.Gateway.String()), Command: s.Command, Secret: s.Secret}
		if s.Secret != "" {
			ps.Header, ps.Bearer = "Authorization", true
			if h := cfg.Secrets[s.Secret].Header; h != "" {
				ps.Header, ps.Bearer = h, false
			}
		}
		servers = append(servers, ps)
	}
	if len(servers) == 0 {
		return sessEnv
	}
	if sessEnv == nil {
		sessEnv = map[string]string{}
	}
	sessEnv[preset.MCPEnv] = preset.EncodeMCP(servers)
	return sessEnv
}
