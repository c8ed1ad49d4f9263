package daemon

import "moat.dev/moat/internal/config"

// gateLimits bound what the gate holds for one sandbox at once: open
// connections, DNS queries being answered, destinations held for a
// watcher, and the bytes of bulk windows (netstack's budget).
type gateLimits struct {
	conns, dns, holds int
	windowBytes       int64
}

// What the derivation assumes, from the memory benchmark
// (bench/memory.sh): the daemon's own share of its limit before any
// traffic (start, policy, CA, an idle gate, with room), and what one
// connection whose guest stopped reading holds in the daemon (its small
// window, a copy buffer, two goroutines and the endpoint).
const (
	daemonOwnBytes   = 64 << 20
	stalledConnBytes = 320 << 10
)

// gateLimits is the daemon's: derived from its memory limit when it has
// one, else the gate's and the netstack's defaults, and [network]'s.
func (d *daemon) gateLimits() gateLimits {
	if d.o.Limits == nil {
		return gateLimits{conns: d.o.Network.Config.MaxConnections, dns: d.o.Network.Config.MaxDNSQueries,
			holds: d.o.Network.Config.MaxHolds}
	}
	return gateLimitsFor(d.o.Network.Config, d.o.Limits.DaemonBytes)
}

// gateLimitsFor derives the bounds from the memory the daemon may use
// (daemonBytes: daemon_memory_max, or what memory_max gives it), keeping
// what [network] sets. The gate's share is three quarters of what the
// daemon's own use leaves (the rest is slack for the Go collector, which
// the daemon's GOMEMLIMIT keeps at three quarters of its limit); a quarter
// of the share goes to bulk windows, the rest to stalled connections; DNS
// queries get one per 1 MiB of it (each holds a goroutine, a buffer and
// an upstream socket). So a guest that opens connections up to the bound
// and reads none of them stays within the daemon's limit.
func gateLimitsFor(n config.Network, daemonBytes uint64) gateLimits {
	share := int64(32 << 20)
	if daemonBytes > daemonOwnBytes+uint64(share) {
		share = int64(daemonBytes-daemonOwnBytes) / 4 * 3
	}
	l := gateLimits{
		windowBytes: share / 4,
		conns:       int(min(max(share*3/4/stalledConnBytes, 64), 8192)),
		dns:         int(min(max(share>>20, 16), 256)),
		holds:       n.MaxHolds,
	}
	if n.MaxConnections > 0 {
		l.conns = n.MaxConnections
	}
	if n.MaxDNSQueries > 0 {
		l.dns = n.MaxDNSQueries
	}
	return l
}
