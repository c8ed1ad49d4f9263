package dockerrt

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"moat.dev/moat/internal/config"
)

// The presets' layer is a policy file moat's parser takes, with the
// credentials moat has values for and the user's files do not define.
func TestPresetFile(t *testing.T) {
	tests := []struct {
		name       string
		presets    []string
		defined    []string
		has        []string
		wantPushed []string
		wantAllow  string
	}{
		{"no preset", nil, nil, nil, nil, ""},
		{"claude with its key", []string{"claude"}, nil, []string{"ANTHROPIC_API_KEY"}, []string{"ANTHROPIC_API_KEY"}, "api.anthropic.com"},
		{"claude without a key on the host", []string{"claude"}, nil, nil, nil, "api.anthropic.com"},
		{"the user's secret of that name wins", []string{"claude"}, []string{"ANTHROPIC_API_KEY"}, []string{"ANTHROPIC_API_KEY"}, nil, "api.anthropic.com"},
		{"an unknown preset is skipped", []string{"gone", "codex"}, nil, []string{"OPENAI_API_KEY"}, []string{"OPENAI_API_KEY"}, "api.openai.com"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, pushed, err := PresetFile(tt.presets, tt.defined, func(n string) bool { return slices.Contains(tt.has, n) })
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pushed, tt.wantPushed) {
				t.Errorf("pushed = %v, want %v", pushed, tt.wantPushed)
			}
			p := filepath.Join(t.TempDir(), "preset.toml")
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := config.ParseFile(p)
			if err != nil {
				t.Fatalf("%v\n%s", err, b)
			}
			cfg := config.Merge(f)
			for _, n := range tt.wantPushed {
				if s, ok := cfg.Secrets[n]; !ok || s.From != "env:"+n || len(s.Hosts) == 0 {
					t.Errorf("secret %s = %+v, want env:%s bound to the preset's hosts", n, s, n)
				}
			}
			if len(cfg.Secrets) != len(tt.wantPushed) {
				t.Errorf("secrets = %v, want only %v", cfg.Secrets, tt.wantPushed)
			}
			var allow []string
			for _, l := range cfg.Network.Layers {
				allow = append(allow, l.Allow...)
			}
			if tt.wantAllow != "" && !slices.Contains(allow, tt.wantAllow) {
				t.Errorf("allow = %v, want %s in it", allow, tt.wantAllow)
			}
		})
	}
}
