package cli

import (
	"testing"

	"moat.dev/moat/internal/state"
)

// A session of a sandbox that has used a preset gets the preset's quiet
// variables and key aliases whether or not it was started through the
// preset; what the session or a secret of the alias's own name says wins.
func TestWithPresetEnv(t *testing.T) {
	rec := &state.Record{Presets: []string{"claude", "codex", "gone"}, Placeholders: map[string]string{"OPENAI_API_KEY": "moat-ph-O"}}
	got := withPresetEnv(rec, map[string]string{"DISABLE_TELEMETRY": "0"})
	for k, want := range map[string]string{
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
		"DISABLE_TELEMETRY":                        "0",
		"CODEX_API_KEY":                            "moat-ph-O",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	rec.Placeholders["CODEX_API_KEY"] = "moat-ph-C"
	if got := withPresetEnv(rec, nil); got["CODEX_API_KEY"] != "" {
		t.Errorf("CODEX_API_KEY = %q in the session: the sandbox's own secret must stay", got["CODEX_API_KEY"])
	}
	if got := withPresetEnv(&state.Record{}, nil); got != nil {
		t.Errorf("no preset: %v, want nothing", got)
	}
}
