package preset

// Seeding: the settings an agent asks about on its first interactive run,
// answered the way a sandbox answers them, in the agent's own files.
//
// Without them `moat run claude` stops at six onboarding questions, two
// of whose defaults end the run (the API key question defaults to "No",
// the bypass-permissions warning to "No, exit"), and Codex asks whether it
// may trust the folder. The answers are moot in a sandbox: the key is a
// placeholder the gate swaps, the sandbox is the permission boundary, the
// workspace is the user's own. Each merge keeps what the agent (or the
// user) wrote and adds only what is missing; a real credential is never
// written: the only key value a merge writes is a moat placeholder, and a
// value that is not one is refused (ErrNotPlaceholder).
//
// The keys are those the checked versions read (Preset.Checked), found in
// their code and confirmed by test/e2e/agents_test.go:
//
//	~/.claude.json           hasCompletedOnboarding, lastOnboardingVersion,
//	                         customApiKeyResponses.approved (the key's last
//	                         20 characters), bypassPermissionsModeAccepted,
//	                         projects[dir].hasTrustDialogAccepted
//	~/.claude/settings.json  skipDangerousModePermissionPrompt, env (the
//	                         preset's variables, where the user set none)
//	~/.codex/config.toml     projects[dir].trust_level = "trusted",
//	                         analytics.enabled, feedback.enabled = false,
//	                         check_for_update_on_startup = false,
//	                         notice.hide_full_access_warning = true
//	~/.codex/auth.json       OPENAI_API_KEY (what `codex login
//	                         --with-api-key` stores), when absent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"moat.dev/moat/internal/secret"
)

// ErrNotPlaceholder is returned when a key to be seeded is not a moat
// placeholder: seeding never writes a real credential.
var ErrNotPlaceholder = errors.New("not a moat placeholder; seeding writes placeholders only")

// SeedInput is what a merge needs to know about the session.
type SeedInput struct {
	// Dirs are the directories to mark trusted: the workspace and the
	// session's working directory.
	Dirs []string
	// Key is the placeholder of the agent's API key ("": none).
	Key string
	// Version is the installed agent's version ("": unknown).
	Version string
	// Env is the preset's variables, for the agent's settings.
	Env map[string]string
	// MCP are the sandbox's MCP servers, with placeholders (mcp.go).
	MCP []MCPEntry
}

// claudeKeySuffix is how Claude Code remembers an approved key: its last
// 20 characters (customApiKeyResponses).
func claudeKeySuffix(key string) string {
	if len(key) <= 20 {
		return key
	}
	return key[len(key)-20:]
}

// MergeClaudeConfig merges the first-run answers into ~/.claude.json's
// content (nil or empty: none yet). It returns the new content and
// whether anything changed.
func MergeClaudeConfig(old []byte, in SeedInput) ([]byte, bool, error) {
	m, err := jsonObject(old)
	if err != nil {
		return nil, false, fmt.Errorf(".claude.json: %w", err)
	}
	before := mustJSON(m)
	m["hasCompletedOnboarding"] = true
	if _, ok := m["lastOnboardingVersion"]; !ok && in.Version != "" {
		m["lastOnboardingVersion"] = in.Version
	}
	m["bypassPermissionsModeAccepted"] = true
	if in.Key != "" {
		if !strings.HasPrefix(in.Key, secret.PlaceholderPrefix) {
			return nil, false, fmt.Errorf("the API key to approve: %w", ErrNotPlaceholder)
		}
		suffix := claudeKeySuffix(in.Key)
		resp := object(m, "customApiKeyResponses")
		approved := stringList(resp["approved"])
		if !slices.Contains(approved, suffix) {
			approved = append(approved, suffix)
		}
		resp["approved"] = approved
		resp["rejected"] = slices.DeleteFunc(stringList(resp["rejected"]), func(s string) bool { return s == suffix })
	}
	projects := object(m, "projects")
	for _, d := range in.Dirs {
		if d == "" {
			continue
		}
		object(projects, d)["hasTrustDialogAccepted"] = true
	}
	if err := mergeClaudeMCP(m, in); err != nil {
		return nil, false, err
	}
	after := mustJSON(m)
	return after, !bytes.Equal(before, after), nil
}

// MergeClaudeSettings merges into ~/.claude/settings.json: the
// bypass-permissions warning accepted, and the preset's variables in the
// settings' env (so a session started without them, a script that clears
// its environment, still runs quiet), each only where the user set none.
func MergeClaudeSettings(old []byte, in SeedInput) ([]byte, bool, error) {
	m, err := jsonObject(old)
	if err != nil {
		return nil, false, fmt.Errorf("settings.json: %w", err)
	}
	before := mustJSON(m)
	m["skipDangerousModePermissionPrompt"] = true
	if len(in.Env) > 0 {
		env := object(m, "env")
		for k, v := range in.Env {
			if _, ok := env[k]; !ok {
				env[k] = v
			}
		}
	}
	after := mustJSON(m)
	return after, !bytes.Equal(before, after), nil
}

// MergeCodexConfig merges into ~/.codex/config.toml. The user's values
// stay; comments and key order do not survive a rewrite (TOML has no
// round-trip editor here), so the file is rewritten only when a key is
// missing.
func MergeCodexConfig(old []byte, in SeedInput) ([]byte, bool, error) {
	m := map[string]any{}
	if len(bytes.TrimSpace(old)) > 0 {
		if err := toml.Unmarshal(old, &m); err != nil {
			return nil, false, fmt.Errorf("config.toml: %w", err)
		}
	}
	changed := false
	set := func(t map[string]any, k string, v any) {
		if _, ok := t[k]; !ok {
			t[k] = v
			changed = true
		}
	}
	set(m, "check_for_update_on_startup", false)
	set(object(m, "analytics"), "enabled", false)
	set(object(m, "feedback"), "enabled", false)
	set(object(m, "notice"), "hide_full_access_warning", true)
	projects := object(m, "projects")
	for _, d := range in.Dirs {
		if d == "" {
			continue
		}
		set(object(projects, d), "trust_level", "trusted")
	}
	mcpChanged, err := mergeCodexMCP(m, in)
	if err != nil {
		return nil, false, err
	}
	changed = changed || mcpChanged
	if !changed {
		return old, false, nil
	}
	out, err := toml.Marshal(m)
	if err != nil {
		return nil, false, fmt.Errorf("config.toml: %w", err)
	}
	return out, true, nil
}

// MergeCodexAuth writes ~/.codex/auth.json as `codex login
// --with-api-key` does, with the placeholder, when there is no login yet.
// A login the user made (a ChatGPT one, another key) is left alone.
func MergeCodexAuth(old []byte, in SeedInput) ([]byte, bool, error) {
	if in.Key == "" {
		return old, false, nil
	}
	if !strings.HasPrefix(in.Key, secret.PlaceholderPrefix) {
		return nil, false, fmt.Errorf("the API key to store: %w", ErrNotPlaceholder)
	}
	m, err := jsonObject(old)
	if err != nil {
		return nil, false, fmt.Errorf("auth.json: %w", err)
	}
	if len(m) > 0 {
		return old, false, nil
	}
	m["auth_mode"] = "apikey"
	m["OPENAI_API_KEY"] = in.Key
	return mustJSON(m), true, nil
}

// NewerThan says whether version a is newer than b, comparing dotted
// numbers ("2.1.10" > "2.1.9"); anything after a '-' or '+' is ignored,
// and a part that is not a number compares as 0.
func NewerThan(a, b string) bool {
	pa, pb := versionParts(a), versionParts(b)
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x = pa[i]
		}
		if i < len(pb) {
			y = pb[i]
		}
		if x != y {
			return x > y
		}
	}
	return false
}

func versionParts(v string) []int {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(v, "-+ "); i >= 0 {
		v = v[:i]
	}
	var out []int
	for _, f := range strings.Split(v, ".") {
		n, _ := strconv.Atoi(f)
		out = append(out, n)
	}
	return out
}

func jsonObject(b []byte) (map[string]any, error) {
	m := map[string]any{}
	if len(bytes.TrimSpace(b)) == 0 {
		return m, nil
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("not a JSON object (%v); fix or remove the file", err)
	}
	if m == nil {
		m = map[string]any{}
	}
	return m, nil
}

// object returns m[k] as an object, making it (or replacing a value of
// another type, which the agent would not read either) when need be.
func object(m map[string]any, k string) map[string]any {
	o, ok := m[k].(map[string]any)
	if !ok {
		o = map[string]any{}
		m[k] = o
	}
	return o
}

func stringList(v any) []string {
	out := []string{}
	switch l := v.(type) {
	case []any:
		for _, e := range l {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
	case []string:
		out = append(out, l...)
	}
	return out
}

func mustJSON(m map[string]any) []byte {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		panic(err) // decoded JSON and strings only
	}
	return append(b, '\n')
}
