package gate

import (
	"testing"

	"moat.dev/moat/internal/control"
)

// The hold words the gate writes are the watch API's: the daemon passes
// them on as they are, so a word changed on one side only would reach a
// front end as a word it does not know.
func TestHoldWordsAreTheWatchAPIs(t *testing.T) {
	for _, tt := range []struct{ gate, control string }{
		{string(HoldNew), control.EventHold},
		{string(HoldJoined), control.EventHoldMore},
		{string(HoldResolved), control.EventResolved},
		{AnswerHour, control.AnswerHour},
	} {
		if tt.gate != tt.control {
			t.Errorf("gate %q, control %q", tt.gate, tt.control)
		}
	}
}
