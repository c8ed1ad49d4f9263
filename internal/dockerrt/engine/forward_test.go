package engine

import (
	"testing"

	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/netstack"
)

// A project's forwards mean the same on both runtimes: the workload
// reaches its reverse forwards where a gVisor guest does. (The wire form
// and the changes are internal/forward's, shared with the daemon.)
func TestReverseAddrIsTheGateway(t *testing.T) {
	if dockerrt.ReverseAddr != netstack.Gateway {
		t.Errorf("ReverseAddr = %s, the gVisor gateway is %s: a project's settings would differ by runtime", dockerrt.ReverseAddr, netstack.Gateway)
	}
}

// The workload's side of the reverse link has the gVisor guest's
// address: a program that reads its own address sees the same on both.
func TestReverseLocalIsTheGuest(t *testing.T) {
	if dockerrt.ReverseLocal != netstack.Guest {
		t.Errorf("ReverseLocal = %s, the gVisor guest is %s", dockerrt.ReverseLocal, netstack.Guest)
	}
}
