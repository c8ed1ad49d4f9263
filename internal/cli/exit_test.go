package cli

import (
	"errors"
	"io"
	"testing"

	"moat.dev/moat/internal/control"
)

// TestFromDaemon: the daemon refusing a request (4xx) is bad usage, exit
// 2; the daemon failing (5xx) or not answering is exit 1, never 2.
func TestFromDaemon(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{&control.HTTPError{What: "daemon /v1/network/rules", Status: 400, Msg: "bad entry"}, ExitUsage},
		{&control.HTTPError{What: "daemon /v1/network/rules", Status: 409, Msg: "conflict"}, ExitUsage},
		{&control.HTTPError{What: "daemon /v1/network/rules", Status: 500, Msg: "writing the record: no space"}, ExitError},
		{&control.HTTPError{What: "daemon refused the session", Status: 503, Msg: control.ErrStopping}, ExitError},
		{errors.New("calling daemon /v1/network/rules: connection refused"), ExitError},
	}
	for _, tt := range tests {
		if got := exitCode(fromDaemon(tt.err)); got != tt.want {
			t.Errorf("fromDaemon(%v) exits %d, want %d", tt.err, got, tt.want)
		}
	}
	if !control.IsStopping(&control.HTTPError{Status: 503, Msg: control.ErrStopping}) {
		t.Error("IsStopping does not recognise the daemon's 503")
	}
}

// TestUsageExitCodes: bad flags, a wrong number of arguments and unknown
// commands exit 2, in process, before any command runs (no root needed).
func TestUsageExitCodes(t *testing.T) {
	for _, args := range [][]string{
		{"up", "--no-such-flag"},
		{"logs"},
		{"network", "allow", "api"},
		{"exec"},
		{"no-such-command"},
		{"network", "no-such-verb"},
		{"image", "rm"},
		{"run", "claude", "codex", "--", "x"},
	} {
		root := newRoot()
		root.SetArgs(args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		if got := exitCode(root.Execute()); got != ExitUsage {
			t.Errorf("moat %v exits %d, want %d", args, got, ExitUsage)
		}
	}
}
