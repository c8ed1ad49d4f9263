package forward

import (
	"errors"
	"net/netip"
	"testing"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
)

// The changes moat forward asks of a running sandbox, on either runtime:
// which are taken and which refused, every refusal a usage error (moat
// forward exits 2 for ErrSpec).
func TestApplyChange(t *testing.T) {
	cfg := config.Config{}
	cfg.Forwards.Ports = []config.Forward{{Host: 3000, Guest: 3000}}
	cfg.Network.MCP = map[string]config.MCPServer{"ed": {Name: "ed", URL: "http://127.0.0.1:7777/mcp", Host: "127.0.0.1", Port: 7777, Path: "/mcp", Local: true}}
	for _, c := range []struct {
		ch            control.ForwardChange
		ok            bool
		ports, rports int
	}{
		{control.ForwardChange{Op: "add", Spec: "8080:80"}, true, 1, 0},
		{control.ForwardChange{Op: "add", Reverse: true, Spec: "15432:5432"}, true, 0, 1},
		{control.ForwardChange{Op: "add", Spec: "3000"}, true, 0, 0},                        // the configuration's own: nothing to keep
		{control.ForwardChange{Op: "add", Spec: "9000", Address: "not-an-ip"}, false, 0, 0}, // not an address
		{control.ForwardChange{Op: "remove", Spec: "8080"}, false, 0, 0},                    // nothing to remove
		{control.ForwardChange{Op: "frob", Spec: "1"}, false, 0, 0},
		{control.ForwardChange{Op: "add", Spec: "0"}, false, 0, 0},
		{control.ForwardChange{Op: "add", Reverse: true, Spec: "7777:5000"}, false, 0, 0}, // the MCP server's host port
		{control.ForwardChange{Op: "add", Reverse: true, Spec: "7777"}, false, 0, 0},
	} {
		rt := &state.RuntimeForwards{}
		err := ApplyChange(rt, cfg, "api", c.ch)
		if (err == nil) != c.ok {
			t.Errorf("%+v: err = %v, want ok = %v", c.ch, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrSpec) {
			t.Errorf("%+v: %v is not an ErrSpec", c.ch, err)
		}
		if len(rt.Ports) != c.ports || len(rt.Reverse) != c.rports {
			t.Errorf("%+v: kept %+v, want %d ports and %d reverse", c.ch, rt, c.ports, c.rports)
		}
	}
}

// The wire form names where each side listens and where it goes.
func TestWire(t *testing.T) {
	gw := netip.MustParseAddr("10.88.0.1")
	l := Wire(Entry{Forward: state.Forward{Host: 8080, Guest: 80}, Source: SourceRuntime}, "listening", "", gw)
	if l.Direction != control.ToGuest || l.Listen != "127.0.0.1:8080" || l.Target != "guest:80" {
		t.Errorf("local forward: %+v", l)
	}
	r := Wire(Entry{Reverse: true, Forward: state.Forward{Host: 15432, Guest: 5432}}, "open", "", gw)
	if r.Direction != control.ToHost || r.Listen != "10.88.0.1:5432" || r.Target != "127.0.0.1:15432" {
		t.Errorf("reverse forward: %+v", r)
	}
}
