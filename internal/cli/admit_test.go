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

// TestHoldsMemory: every state of a live daemon counts in admission,
// a suspend's and a resume's too (their guest runs, or is about to).
func TestHoldsMemory(t *testing.T) {
	for _, tc := range []struct {
		st   string
		want bool
	}{
		{state.StateStarting, true},
		{state.StateRunning, true},
		{state.StateStopping, true},
		{state.StateSuspending, true},
		{state.StateResuming, true},
		{state.StateCreated, false},
		{state.StateStopped, false},
		{state.StateSuspended, false},
		{state.StateCrashed, false},
	} {
		if got := holdsMemory(tc.st); got != tc.want {
			t.Errorf("holdsMemory(%q) = %v, want %v", tc.st, got, tc.want)
		}
	}
}
