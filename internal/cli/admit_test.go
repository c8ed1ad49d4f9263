package cli

import (
	"testing"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/state"
)

// TestLimitsOfDamagedSnapshot: a record whose snapshot cannot be read
// counts in admission with the default ceiling, not as a sandbox that
// takes no memory.
func TestLimitsOfDamagedSnapshot(t *testing.T) {
	got := limitsOf(&state.Record{Name: "x", Config: []byte("{not json")})
	want := resources.FromConfig(config.Defaults().Sandbox)
	if got.CeilingBytes != want.CeilingBytes || got.CeilingBytes == 0 {
		t.Errorf("limitsOf(damaged) ceiling = %d, want the default %d", got.CeilingBytes, want.CeilingBytes)
	}
}
