package cli

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/state"
)

// TestRulesOfStoppedSandboxHasPresetLayer: `moat network list` on a
// stopped sandbox shows the rules the daemon would compile, the layer of
// the presets the sandbox used included, as `moat run --help` says.
func TestRulesOfStoppedSandboxHasPresetLayer(t *testing.T) {
	home := t.TempDir()
	e := &env{dirs: state.Dirs{Config: filepath.Join(home, "config"), State: filepath.Join(home, "state"), Cache: filepath.Join(home, "cache")}}
	snap, err := json.Marshal(config.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &state.Record{Name: "p", Presets: []string{"claude"}, Config: snap}
	rules, err := e.rulesOf(e.dirs.Sandbox("p"), rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if r.Layer == policy.LayerPreset.String() && r.Entry == "api.anthropic.com" {
			return
		}
	}
	t.Errorf("no preset-layer rule for api.anthropic.com among %d rules of a stopped sandbox that used the claude preset", len(rules))
}
