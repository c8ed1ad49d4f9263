package cli

import (
	"context"
	"time"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/state"
)

// A Docker sandbox's port forwards are held by its forwarder
// (dockerrt/forward.go), which answers the control API's forward
// endpoints as a gVisor daemon does, on a socket of its own.

// changeForwards is sandbox.change for the forward commands: through a
// Docker sandbox's forwarder while it runs, else the record's (both
// runtimes' stopped sandboxes), else the daemon's.
func changeForwards(dir string, rec *state.Record, timeout time.Duration, live func(context.Context, *control.Client) error, record func(*state.Record) error) error {
	if rec.Runtime != runtimeDocker {
		return sandboxAt(dir).change(timeout, live, record)
	}
	if dockerrt.ForwarderAlive(dir) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return fromDaemon(live(ctx, control.New(dockerrt.ForwardSocket(dir))))
	}
	return state.Update(dir, record)
}

// dockerForwards asks a Docker sandbox's forwarder for its forwards;
// false when it does not run (the sandbox is stopped).
func dockerForwards(dir string) ([]control.Forward, bool) {
	if !dockerrt.ForwarderAlive(dir) {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := control.New(dockerrt.ForwardSocket(dir)).Forwards(ctx)
	if err != nil {
		return nil, false
	}
	return f.Forwards, true
}
