package daemon

import (
	"testing"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/resources"
)

// TestGateLimitsFor: the bounds grow with the daemon's memory limit, what
// they let a guest make the daemon hold stays within the limit, and
// [network]'s settings win.
func TestGateLimitsFor(t *testing.T) {
	prev := gateLimits{}
	for _, memMax := range []uint64{256 << 20, 1 << 30, 4 << 30, 16 << 30} {
		daemon := resources.DaemonLimit(memMax)
		l := gateLimitsFor(config.Network{}, daemon)
		held := daemonOwnBytes + uint64(l.windowBytes) + uint64(l.conns)*stalledConnBytes
		t.Logf("memory_max %5d MiB: daemon limit %4d MiB, %4d connections, %3d DNS queries, %3d MiB of bulk windows; at most %d MiB held",
			memMax>>20, daemon>>20, l.conns, l.dns, l.windowBytes>>20, held>>20)
		if held > daemon {
			t.Errorf("memory_max %d MiB: the bounds let the daemon hold %d MiB, over its limit of %d MiB", memMax>>20, held>>20, daemon>>20)
		}
		if l.conns < prev.conns || l.dns < prev.dns || l.windowBytes < prev.windowBytes {
			t.Errorf("memory_max %d MiB: %+v, less than %+v for a smaller one", memMax>>20, l, prev)
		}
		if l.conns < 64 || l.dns < 16 {
			t.Errorf("memory_max %d MiB: %+v is below the floors", memMax>>20, l)
		}
		prev = l
	}
	got := gateLimitsFor(config.Network{MaxConnections: 5000, MaxDNSQueries: 7, MaxHolds: 3}, 192<<20)
	if got.conns != 5000 || got.dns != 7 || got.holds != 3 {
		t.Errorf("with [network] set: %+v, want 5000 connections, 7 DNS queries, 3 holds", got)
	}
}
