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
	// Hosts are allow entries (policy syntax) the agent needs.
	Hosts []string
	// Secrets are the credentials mapped to secrets by default.
	Secrets []Secret
	// Env is set in every session the preset starts.
	Env map[string]string
	// Install says how to get the program into an image that lacks it.
	Install string
	Summary string
}

// presets are the built-in ones. Host lists are what each agent needs
// to log in and to talk to its model; telemetry and error-reporting hosts
// are left out (both agents work without them, and a denied attempt shows
// in `moat network denials` for a user who wants to allow it).
var presets = map[string]*Preset{
	"claude": {
		Name:    "claude",
		Summary: "Claude Code, permission prompts off",
		Command: []string{"claude", "--dangerously-skip-permissions"},
		Hosts:   []string{"api.anthropic.com", "console.anthropic.com", "claude.ai"},
		Secrets: []Secret{
			{Env: "ANTHROPIC_API_KEY", Hosts: []string{"api.anthropic.com"}},
			{Env: "CLAUDE_CODE_OAUTH_TOKEN", Hosts: []string{"api.anthropic.com"}},
		},
		// Without CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC Claude Code keeps
		// retrying its telemetry and update checks against hosts the gate
		// refuses. IS_SANDBOX tells it that it runs in one, which it asks
		// of a root user before it accepts skipping permissions (the agent
		// is root in a workspace root owns).
		Env:     map[string]string{"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1"},
		Install: "npm install -g @anthropic-ai/claude-code",
	},
	"codex": {
		Name:    "codex",
		Summary: "OpenAI Codex CLI, approvals and its own sandbox off",
		Command: []string{"codex", "--dangerously-bypass-approvals-and-sandbox"},
		Hosts:   []string{"api.openai.com", "auth.openai.com", "chatgpt.com"},
		Secrets: []Secret{
			{Env: "OPENAI_API_KEY", Hosts: []string{"api.openai.com"}},
		},
		Install: "npm install -g @openai/codex",
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
