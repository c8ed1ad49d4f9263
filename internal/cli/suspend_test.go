package cli

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"moat.dev/moat/internal/session"
	"moat.dev/moat/internal/state"
)

// TestSessionEndedBySuspend: a session that lost its connection, or whose
// command did not start, while its sandbox was being suspended is told so;
// anything else keeps its own error.
func TestSessionEndedBySuspend(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "api")
	if err := state.Create(dir, &state.Record{Name: "api", State: state.StateSuspending}); err != nil {
		t.Fatal(err)
	}
	lost := fmt.Errorf("waiting for command: %w", session.ErrConnectionLost)
	notStarted := fmt.Errorf("%w: %w", session.ErrNotStarted, errors.New("ssh: command sleep 60 failed"))
	other := errors.New("ssh: handshake failed")
	for _, c := range []struct {
		state string
		err   error
		want  string
	}{
		{state.StateSuspending, lost, `the session ended: sandbox "api" was suspended; resume it with: moat resume api`},
		{state.StateSuspended, notStarted, `the command did not start: sandbox "api" was being suspended; resume it with: moat resume api`},
		{state.StateSuspending, other, other.Error()},
		{state.StateRunning, notStarted, "starting command: ssh: command sleep 60 failed"},
		{state.StateStopping, lost, lost.Error()},
	} {
		if err := state.Update(dir, func(r *state.Record) error { r.State = c.state; return nil }); err != nil {
			t.Fatal(err)
		}
		if got := sessionEndedBySuspend(dir, c.err).Error(); !strings.Contains(got, c.want) {
			t.Errorf("%s, %v: %q; want %q", c.state, c.err, got, c.want)
		}
	}
}
