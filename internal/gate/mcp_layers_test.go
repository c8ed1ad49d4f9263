package gate

import (
	"testing"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/policy"
)

// What declaring a server allows (docs/mcp.md): its URL, and, as an
// allow with a path restricts its name in its layer, nothing else of the
// host, even where a lower layer allows the whole host; a bare allow in
// the same layer, with the port, gives the rest back.
func TestMCPDeclarationAllowsItsURL(t *testing.T) {
	decl := config.MCPServer{Host: "api.example.com", Port: 443, Path: "/mcp"}.AllowEntries()
	rules := func(entries []string, l policy.Layer) []policy.Rule {
		r, err := policy.FromEntries(entries, policy.Allow, l, "f")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		name  string
		rules []policy.Rule
		path  string
		want  policy.Verdict
	}{
		{"the URL", rules(decl, policy.LayerUser), "/mcp", policy.Allow},
		{"below it", rules(decl, policy.LayerUser), "/mcp/sse", policy.Allow},
		{"another path", rules(decl, policy.LayerUser), "/repos", policy.Deny},
		{"another path, the host allowed below", append(rules([]string{"api.example.com"}, policy.LayerPreset), rules(decl, policy.LayerUser)...), "/repos", policy.Deny},
		{"another path, the host without its port beside", rules(append(decl, "api.example.com"), policy.LayerUser), "/repos", policy.Deny},
		{"another path, the host and port allowed beside", rules(append(decl, "api.example.com:443"), policy.LayerUser), "/repos", policy.Allow},
	} {
		if got := policy.Compile(tc.rules).Request("api.example.com", 443, "POST", tc.path).Verdict; got != tc.want {
			t.Errorf("%s: %s = %v, want %v", tc.name, tc.path, got, tc.want)
		}
	}
}
