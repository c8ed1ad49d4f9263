package cli

import (
	"slices"
	"strings"
	"testing"
)

func TestPresetArgs(t *testing.T) {
	tests := []struct {
		args    []string
		dash    int
		preset  string
		argv    []string
		errWant string
	}{
		{args: nil, dash: -1},
		{args: []string{"make", "test"}, dash: 0, argv: []string{"make", "test"}},
		{args: []string{"claude"}, dash: -1, preset: "claude", argv: []string{"claude", "--dangerously-skip-permissions"}},
		{args: []string{"claude", "--version"}, dash: 1, preset: "claude", argv: []string{"claude", "--dangerously-skip-permissions", "--version"}},
		{args: []string{"shell"}, dash: -1, preset: "shell"},
		{args: []string{"make"}, dash: -1, errWant: "moat run -- make"},
		{args: []string{"claude", "x"}, dash: -1, errWant: "moat run claude -- x"},
	}
	for _, tt := range tests {
		p, argv, err := presetArgs(tt.args, tt.dash)
		if tt.errWant != "" {
			if err == nil || !strings.Contains(err.Error(), tt.errWant) {
				t.Errorf("presetArgs(%q, %d) error = %v, want one containing %q", tt.args, tt.dash, err, tt.errWant)
			}
			continue
		}
		if err != nil {
			t.Errorf("presetArgs(%q, %d): %v", tt.args, tt.dash, err)
			continue
		}
		name := ""
		if p != nil {
			name = p.Name
		}
		if name != tt.preset || !slices.Equal(argv, tt.argv) {
			t.Errorf("presetArgs(%q, %d) = %q, %q; want %q, %q", tt.args, tt.dash, name, argv, tt.preset, tt.argv)
		}
	}
}
