package engine

import (
	"errors"
	"testing"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/forward"
	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/state"
)

// The forwarder answers moat forward as a gVisor daemon does: the same
// wire form of each forward and the same changes, which moat-docker
// spells out because it does not link the daemon. Checked against the
// daemon's own, so the two cannot drift apart.
func TestForwarderMatchesDaemon(t *testing.T) {
	if dockerrt.ReverseAddr != netstack.Gateway {
		t.Errorf("ReverseAddr = %s, the gVisor gateway is %s: a project's settings would differ by runtime", dockerrt.ReverseAddr, netstack.Gateway)
	}
	for _, e := range []forward.Entry{
		{Forward: state.Forward{Host: 3000, Guest: 3000}, Source: forward.SourceConfig},
		{Forward: state.Forward{Host: 8080, Guest: 80, Address: "0.0.0.0"}, Source: forward.SourceRuntime},
		{Reverse: true, Forward: state.Forward{Host: 15432, Guest: 5432}, Source: forward.SourceRuntime},
	} {
		if got, want := wireForward(e, "open", "why"), daemon.ForwardOf(e, "open", "why"); got != want {
			t.Errorf("%+v: forwarder %+v, daemon %+v", e, got, want)
		}
	}
	cfg := config.Config{}
	cfg.Forwards.Ports = []config.Forward{{Host: 3000, Guest: 3000}}
	cfg.Network.MCP = map[string]config.MCPServer{"ed": {Name: "ed", URL: "http://127.0.0.1:7777/mcp", Host: "127.0.0.1", Port: 7777, Path: "/mcp", Local: true}}
	for _, ch := range []control.ForwardChange{
		{Op: "add", Spec: "8080:80"},
		{Op: "add", Spec: "8080:81"},
		{Op: "add", Spec: "3000"},
		{Op: "add", Reverse: true, Spec: "5432", Address: "0.0.0.0"},
		{Op: "add", Spec: "9000", Address: "not-an-ip"},
		{Op: "remove", Spec: "3000"},
		{Op: "remove", Spec: "8080"},
		{Op: "frob", Spec: "1"},
		{Op: "add", Spec: "0"},
		{Op: "add", Reverse: true, Spec: "7777:5000"},
		{Op: "add", Reverse: true, Spec: "7777"},
	} {
		a, b := &state.RuntimeForwards{}, &state.RuntimeForwards{}
		errA := applyChange(a, cfg, "api", ch)
		errB := daemon.ApplyForwardChange(b, cfg, "api", ch)
		if (errA == nil) != (errB == nil) || (errA != nil && errA.Error() != errB.Error()) {
			t.Errorf("%+v: forwarder %v, daemon %v", ch, errA, errB)
		}
		if errA != nil && !errors.Is(errA, forward.ErrSpec) {
			t.Errorf("%+v: %v is not a forward.ErrSpec (moat forward exits 2 for those)", ch, errA)
		}
		if len(a.Ports) != len(b.Ports) || len(a.Reverse) != len(b.Reverse) {
			t.Errorf("%+v: forwarder %+v, daemon %+v", ch, a, b)
		}
	}
}
