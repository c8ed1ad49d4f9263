// Package preset knows the coding agents moat runs by name: `moat run
// claude` instead of `moat run -- claude --dangerously-skip-permissions`
// plus the rules and credentials that make it work.
//
// A preset is data, not code: the program and the flags that turn its
// permission prompts off (the sandbox is the boundary now, so prompts only
// slow the agent down), the hosts it must reach, added to the policy as
// their own layer ("preset", between named policies and the user's file, so
// a user or a project can still block any of them), and the credentials it
// reads from its environment, which become secrets: the agent sees a
// placeholder and the gate puts the real value on the wire, only towards
// the agent's API host.
package preset

import (
	"fmt"
	"sort"
	"strings"
)

// Secret maps a credential the agent reads from its environment to the
// hosts it belongs to. The value is read from the host's variable of the
// same name; a variable that is not set on the host is skipped (an agent
// usually takes one of several: an API key or an OAuth token).
type Secret struct {
	Env   string
	Hosts []string
}

// Preset is one agent.
type Preset struct {
	Name string
	// Command is the program and its no-prompt flags; empty runs the
	// sandbox's shell. The user's extra arguments go after it.
	Command []string
	// Hosts are allow entries (policy syntax) the agent needs to start,
	// onboard, authenticate with an API key and work.
	Hosts []string
	// Block are block entries (policy syntax, usually request rules) for
	// the agent's telemetry on hosts it needs: the preset layer refuses
	// them, a user's or project's allow of the same request overrides.
	Block []string
	// Secrets are the credentials mapped to secrets by default.
	Secrets []Secret
	// Aliases are guest variables that carry another secret's
	// placeholder (variable -> secret): an agent that reads its key from
	// a name of its own gets the placeholder of the key the user exports.
	Aliases map[string]string
	// Env is set in every session of a sandbox that has used the preset,
	// started through it or not (`moat shell`, then the agent): it turns
	// the agent's non-essential traffic off.
	Env map[string]string
	// Install says how to get the program into an image that lacks it.
	Install string
	// Package is the npm package Install installs; the seeding role reads
	// the installed version from its package.json.
	Package string
	// Checked is the agent's version the preset (hosts, blocks, seeded
	// settings) was last checked with, by test/e2e/agents_test.go against
	// the installed package. A newer installed version gets a note on
	// the preset's run: it may need a host the preset does not know.
	Checked string
	Summary string
}

// presets are the built-in ones. Host lists are what each agent needs to
// start, pass its first-run checks, log in and talk to its model;
// telemetry, error-reporting and updater hosts are left out (both agents
// work without them, and a denied attempt shows in `moat network
// denials` for a user who wants to allow it). Where telemetry goes to a
// host the agent needs, Block refuses it by method and path.
var presets = map[string]*Preset{
	"claude": {
		Name:    "claude",
		Summary: "Claude Code, permission prompts off",
		Command: []string{"claude", "--dangerously-skip-permissions"},
		// platform.claude.com: the interactive first run's connectivity
		// check (GET /v1/oauth/hello, beside api.anthropic.com's
		// /api/hello) and OAuth; without it Claude Code says "Unable to
		// connect to Anthropic services" and exits. console.anthropic.com
		// is its name before 2.x.
		Hosts: []string{"api.anthropic.com", "platform.claude.com", "console.anthropic.com", "claude.ai"},
		// Event logs, metrics and feature-flag evaluation: posted to the
		// API host, so an allow of the host alone would let them out with
		// the real key swapped in.
		Block: []string{
			"POST api.anthropic.com/api/event_logging/*",
			"POST api.anthropic.com/api/claude_code/metrics",
			"POST api.anthropic.com/api/eval/*",
		},
		Secrets: []Secret{
			{Env: "ANTHROPIC_API_KEY", Hosts: []string{"api.anthropic.com"}},
			{Env: "CLAUDE_CODE_OAUTH_TOKEN", Hosts: []string{"api.anthropic.com"}},
		},
		// Without CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC Claude Code keeps
		// retrying its telemetry and update checks against hosts the gate
		// refuses. IS_SANDBOX tells it that it runs in one, which it asks
		// of a root user before it accepts skipping permissions (the agent
		// is root in a workspace root owns).
		Env: map[string]string{
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
			"DISABLE_TELEMETRY":                        "1",
			"DISABLE_ERROR_REPORTING":                  "1",
			"DISABLE_AUTOUPDATER":                      "1",
			// The interactive start otherwise fetches the official plugin
			// marketplace from a download host the preset does not allow.
			"CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
			"IS_SANDBOX": "1",
		},
		Install: "npm install -g @anthropic-ai/claude-code",
		Package: "@anthropic-ai/claude-code",
		Checked: "2.1.197",
	},
	"codex": {
		Name:    "codex",
		Summary: "OpenAI Codex CLI, approvals and its own sandbox off",
		Command: []string{"codex", "--dangerously-bypass-approvals-and-sandbox"},
		Hosts:   []string{"api.openai.com", "auth.openai.com", "chatgpt.com"},
		Secrets: []Secret{
			{Env: "OPENAI_API_KEY", Hosts: []string{"api.openai.com"}},
			{Env: "CODEX_API_KEY", Hosts: []string{"api.openai.com"}},
		},
		// Codex (0.171) reads CODEX_API_KEY, not OPENAI_API_KEY, which is
		// what users export: the guest gets OPENAI_API_KEY's placeholder
		// under both names, and the gate swaps it either way.
		Aliases: map[string]string{"CODEX_API_KEY": "OPENAI_API_KEY"},
		// Codex's analytics and update check are turned off in its
		// config.toml (seed.go): it has no variables for them.
		Install: "npm install -g @openai/codex",
		Package: "@openai/codex",
		Checked: "0.171.0",
	},
	"shell": {
		Name:    "shell",
		Summary: "an interactive shell",
	},
}

// Lookup returns the preset called name.
func Lookup(name string) (*Preset, error) {
	if p, ok := presets[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("unknown preset %q (presets: %s); to run a program of that name write: moat run -- %s",
		name, strings.Join(Names(), ", "), name)
}

// Names lists the presets, sorted.
func Names() []string {
	out := make([]string, 0, len(presets))
	for n := range presets {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Argv is the command line for a session: the preset's command followed
// by the user's arguments. A preset without a command (shell) with no
// arguments gives nil, the sandbox's interactive shell.
func (p *Preset) Argv(extra []string) []string {
	if len(p.Command) == 0 && len(extra) == 0 {
		return nil
	}
	out := append([]string(nil), p.Command...)
	return append(out, extra...)
}

// MissingHint is what to tell the user when the preset's program is not in
// the sandbox.
func (p *Preset) MissingHint(sandbox string) string {
	if p.Install == "" || len(p.Command) == 0 {
		return ""
	}
	return fmt.Sprintf("%s is not installed in the sandbox %q. Install it once with:\n\n"+
		"    moat exec %s -- sudo %s\n",
		p.Command[0], sandbox, sandbox, p.Install)
}
