package gateserve

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"moat.dev/moat/test/inet"
)

// TestBenchServiceNames is bench/gate-service.sh's non-web port: a
// connection to db.test:2222 (an SSH-like server that speaks first) from
// tenant alpha's namespace, through the service's names range against
// straight to the upstream by a second veth, same run, medians of R
// rounds of CONNECTS sequential connections each. Two figures per path:
// connect (the TCP handshake; through the service the host's kernel
// completes it for the transparent listener, before the gate decides)
// and first byte (connect, then the server's banner: through the service
// that adds the gate's decision, its dial of the upstream and the
// splice).
func TestBenchServiceNames(t *testing.T) {
	if os.Getenv("MOAT_BENCH_GATESERVICE") == "" {
		t.Skip("a benchmark: run bench/gate-service.sh (it sets MOAT_BENCH_GATESERVICE=1)")
	}
	rounds, connects := envInt(t, "R", 3), envInt(t, "CONNECTS", 1000)
	f := startNames(t)
	peer := "mgsn" + strconv.FormatInt(int64(os.Getpid()), 36)
	for _, args := range [][]string{
		{"-n", f.c.name, "link", "add", "direct0", "type", "veth", "peer", "name", peer, "netns", f.n.NS},
		{"-n", f.c.name, "addr", "add", "100.78.5.2/24", "dev", "direct0"},
		{"-n", f.c.name, "link", "set", "direct0", "up"},
		{"-n", f.n.NS, "addr", "add", "100.78.5.1/24", "dev", peer},
		{"-n", f.n.NS, "link", "set", peer, "up"},
		{"-n", f.c.name, "route", "add", inet.Prefix.String(), "via", "100.78.5.1"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %q: %v: %s", args, err, out)
		}
	}
	paths := []struct {
		name string
		src  netip.Addr
		dst  netip.AddrPort
	}{
		{"direct", netip.MustParseAddr("100.78.5.2"), netip.MustParseAddrPort("198.51.100.30:2222")},
		{"service", f.c.addr, netip.AddrPortFrom(f.resolveFrom(t, f.c.addr, "db.test"), 2222)},
	}
	conn, first := map[string][]float64{}, map[string][]float64{}
	loadBefore := loadavg()
	for r := range rounds {
		order := slices.Clone(paths)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, p := range order {
			var cs, fs []float64
			err := f.c.in(func() error {
				d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: p.src.AsSlice()}}
				for range connects {
					start := time.Now()
					c, err := d.DialContext(context.Background(), "tcp4", p.dst.String())
					if err != nil {
						return err
					}
					cs = append(cs, float64(time.Since(start).Microseconds()))
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					_, err = c.Read(make([]byte, 64))
					fs = append(fs, float64(time.Since(start).Microseconds()))
					c.Close()
					if err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%s to %s: %v", p.name, p.dst, err)
			}
			conn[p.name] = append(conn[p.name], median(cs))
			first[p.name] = append(first[p.name], median(fs))
		}
	}
	med := median
	t.Logf("non-web port (names range) benchmark: R=%d CONNECTS=%d (medians of rounds of sequential connections to an SSH-like server on 2222); load %s before, %s after (%d CPUs)",
		rounds, connects, loadBefore, loadavg(), runtime.NumCPU())
	t.Logf("non-web port connect p50: direct %.0f µs, service %.0f µs: added %.3f ms; first byte p50 (connect and the server's banner): direct %.0f µs, service %.0f µs: added %.3f ms",
		med(conn["direct"]), med(conn["service"]), (med(conn["service"])-med(conn["direct"]))/1000,
		med(first["direct"]), med(first["service"]), (med(first["service"])-med(first["direct"]))/1000)
}
