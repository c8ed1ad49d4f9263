package engine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"moat.dev/moat/internal/dockerrt"
)

// What moat-docker refuses before it asks the engine anything, so these
// need no Docker.
func TestRunRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		op    string
		args  []string
		stdin string
		want  string
	}{
		{"unknown op", "pull", nil, "", "bad arguments"},
		{"missing args", "prepare", []string{"/d", "n"}, "", "bad arguments"},
		{"extra args", "down", []string{"/d", "x"}, "", "bad arguments"},
		{"not json", "up", nil, "{", "reading the start's options"},
		{"newer schema", "up", nil, `{"schema":99,"dir":"/d","moat":"/m","gate":"/g","guest":{}}`, "newer than this moat-docker's"},
		{"no gate", "up", nil, `{"schema":1,"dir":"/d","moat":"/m","guest":{}}`, "lack dir, moat, gate or guest"},
	} {
		_, err := run(context.Background(), tc.op, tc.args, strings.NewReader(tc.stdin))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one saying %q", tc.name, err, tc.want)
		}
		if errors.Is(err, dockerrt.ErrUnreachable) || dockerrt.ExitCode(err) != dockerrt.ExitError {
			t.Errorf("%s: exit code %d, want %d", tc.name, dockerrt.ExitCode(err), dockerrt.ExitError)
		}
	}
}
