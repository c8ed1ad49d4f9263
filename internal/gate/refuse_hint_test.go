package gate

import (
	"strings"
	"testing"

	"moat.dev/moat/internal/audit"
)

// A refusal tells how to allow what was refused: for a moat sandbox the
// command; for a gate whose rules live elsewhere (a gate service tenant's
// file, a cluster template's ConfigMap) the entry and where it goes, never
// a command that does not exist there.
func TestRefusalHint(t *testing.T) {
	deny := audit.Record{Reason: audit.ReasonNoRule, Method: "POST", Path: "/echo"}
	for _, c := range []struct {
		rulesAt string
		request bool
		want    string
		not     string
	}{
		{"", false, "moat network allow sb rules.test\n", ""},
		{"", true, "moat network allow sb 'POST rules.test/echo'\n", ""},
		{"/etc/moat-gate/agents.toml", false, "add to the [network] allow list in /etc/moat-gate/agents.toml:\n\n    \"rules.test\"\n", "moat network allow"},
		{"ConfigMap agents/agent-policy", true, "add to the [network] allow list in ConfigMap agents/agent-policy:\n\n    \"POST rules.test/echo\"\n", "moat network allow"},
	} {
		g := New(Options{Sandbox: "sb", RulesAt: c.rulesAt})
		body := g.refusalFor("rules.test", 443, deny, c.request).body
		if !strings.Contains(body, c.want) || (c.not != "" && strings.Contains(body, c.not)) {
			t.Errorf("RulesAt %q, request %v: page\n%s\nwant it to hold %q and not %q", c.rulesAt, c.request, body, c.want, c.not)
		}
	}
}
