package gateserve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/tlsca"
	"moat.dev/moat/test/inet"
)

// TestBenchService is bench/gate-service.sh: tenant alpha's namespace
// through the service against the same namespace straight to the
// upstream, same run, medians of R rounds. The direct path is a second
// veth from the client namespace into the upstream's namespace, with the
// upstream's DNS server as resolver and its CA in the bundle: one hop and
// no gate. Through the service the client resolves with the service and
// trusts its CA, the service's front end being host sockets (no gVisor).
// Both paths run the same static probes (test/e2e/benchprobe and
// bench/gsprobe) under the same mount namespace recipe as
// TestRealClients; only resolv.conf and the bundle differ. The download
// takes a third path, its floor: the service's DNS answer, then a bare
// TLS-terminating relay (floorRelay) on the service's address, so what
// the service adds above the least any interception costs is measured
// in the same rounds, in MiB/s and in CPU per GiB.
func TestBenchService(t *testing.T) {
	if os.Getenv("MOAT_BENCH_GATESERVICE") == "" {
		t.Skip("a benchmark: run bench/gate-service.sh (it sets MOAT_BENCH_GATESERVICE=1)")
	}
	rounds, sizeMiB := envInt(t, "R", 3), envInt(t, "SIZE_MIB", 256)
	connects, parallelN := envInt(t, "CONNECTS", 1000), envInt(t, "PARALLEL", 1000)
	reqs, conc := envInt(t, "REQS", 2000), envInt(t, "CONC", 8)
	downloadOnly := os.Getenv("DOWNLOAD_ONLY") != ""
	profileDir := os.Getenv("PROFILE")
	if fi, err := os.Stat(profileDir); profileDir != "" && (err != nil || !fi.IsDir() || !filepath.IsAbs(profileDir)) {
		t.Fatalf("PROFILE=%q: want an absolute path to an existing directory for the CPU profiles (bench/gate-service.sh makes a relative one absolute)", profileDir)
	}

	bin := t.TempDir()
	for _, p := range []string{"test/e2e/benchprobe", "bench/gsprobe"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, filepath.Base(p)), "./"+p)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // the pure Go resolver: it reads the mounted resolv.conf
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", p, err, out)
		}
	}

	f := start(t)
	const benchIP = "198.51.100.21"
	f.n.SetA("bench.test", benchIP)
	f.n.HTTPS(t, benchIP, 443, []string{"bench.test"}, inet.Site(""))
	allowAlso(t, f, "bench.test")

	// The direct path: client namespace -> upstream namespace.
	peer := "mgsd" + strconv.FormatInt(int64(os.Getpid()), 36)
	for _, args := range [][]string{
		{"-n", f.a.name, "link", "add", "direct0", "type", "veth", "peer", "name", peer, "netns", f.n.NS},
		{"-n", f.a.name, "addr", "add", "100.78.1.2/24", "dev", "direct0"},
		{"-n", f.a.name, "link", "set", "direct0", "up"},
		{"-n", f.n.NS, "addr", "add", "100.78.1.1/24", "dev", peer},
		{"-n", f.n.NS, "link", "set", peer, "up"},
		{"-n", f.a.name, "route", "add", inet.Prefix.String(), "via", "100.78.1.1"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %q: %v: %s", args, err, out)
		}
	}

	// The floor: a bare TLS-terminating relay on the service's address,
	// port 8443, reached with the service's DNS answer for bench.test.
	upstreamRoots := x509.NewCertPool()
	upstreamRoots.AppendCertsFromPEM(f.n.CA().PEM)
	relay, relayCA := startFloorRelay(t, netip.AddrPortFrom(f.a.gw, 8443), net.JoinHostPort(benchIP, "443"), upstreamRoots)

	dir := t.TempDir()
	caPEM, err := os.ReadFile(f.cfg.CACert)
	must(t, err)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	path := func(name, nameserver string, ca []byte) *realClient {
		resolv := filepath.Join(dir, name+"-resolv.conf")
		must(t, os.WriteFile(resolv, []byte("nameserver "+nameserver+"\n"), 0o644))
		return &realClient{ns: f.a.name, resolv: resolv, bundle: systemBundleWith(t, dir, ca), env: env}
	}
	paths := []struct {
		name string
		c    *realClient
	}{
		{"direct", path("direct", f.n.DNS.Addr().String(), f.n.CA().PEM)},
		{"service", path("service", f.a.gw.String(), caPEM)},
		{"floor", path("floor", f.a.gw.String(), relayCA)},
	}
	probe := func(c *realClient, args ...string) map[string]float64 {
		t.Helper()
		out, err := c.run(t, args...)
		if err != nil {
			t.Fatalf("%q: %v\n%s", args, err, out)
		}
		var m map[string]float64
		if err := json.Unmarshal([]byte(firstLine(out)), &m); err != nil {
			t.Fatalf("%q: %v\n%s", args, err, out)
		}
		return m
	}
	synRetrans := func(c *realClient) int64 {
		t.Helper()
		out, err := c.run(t, "cat", "/proc/net/netstat")
		if err != nil {
			t.Fatalf("reading /proc/net/netstat in the client namespace: %v", err)
		}
		return netstat(out, "TcpExt:", "TCPSynRetrans")
	}

	type figures struct{ mibps, cpuMsPerGiB, clientMsPerGiB, connP50, connP99, parMS, parFailed, syn, rps, p50, p95, reqErrs []float64 }
	got := map[string]*figures{"direct": {}, "service": {}, "floor": {}}
	loadBefore := loadavg()
	for r := range rounds {
		// Rotate which path goes first: the host is shared and noisy.
		order := slices.Clone(paths)
		for range r % len(order) {
			order = append(order[1:], order[0])
		}
		for _, p := range order {
			g := got[p.name]
			url := fmt.Sprintf("https://bench.test/bytes?n=%d", int64(sizeMiB)<<20)
			if p.name == "floor" {
				url = fmt.Sprintf("https://bench.test:8443/bytes?n=%d", int64(sizeMiB)<<20)
			}
			stop := startProfile(t, profileDir, fmt.Sprintf("%s-%d.pprof", p.name, r))
			cpu0 := selfCPU(t)
			m := probe(p.c, filepath.Join(bin, "benchprobe"), "get", url, "1024")
			cpu := selfCPU(t) - cpu0
			stop()
			if int64(m["bytes"]) != int64(sizeMiB)<<20 {
				t.Fatalf("%s: downloaded %v bytes of %d", p.name, m["bytes"], int64(sizeMiB)<<20)
			}
			g.mibps = append(g.mibps, m["bytes"]/(1<<20)/m["seconds"])
			g.cpuMsPerGiB = append(g.cpuMsPerGiB, cpu.Seconds()*1000/(m["bytes"]/(1<<30)))
			g.clientMsPerGiB = append(g.clientMsPerGiB, p.c.cpu.Seconds()*1000/(m["bytes"]/(1<<30)))
			if p.name == "floor" || downloadOnly {
				continue // the floor is for the download alone
			}
			m = probe(p.c, filepath.Join(bin, "benchprobe"), "connect", "bench.test:443", strconv.Itoa(connects))
			g.connP50, g.connP99 = append(g.connP50, m["p50_us"]), append(g.connP99, m["p99_us"])
			before := synRetrans(p.c)
			m = probe(p.c, filepath.Join(bin, "benchprobe"), "parallel", "bench.test:443", strconv.Itoa(parallelN))
			g.parMS, g.parFailed = append(g.parMS, m["ms"]), append(g.parFailed, m["failed"])
			g.syn = append(g.syn, float64(synRetrans(p.c)-before))
			m = probe(p.c, filepath.Join(bin, "gsprobe"), "reqs", "https://bench.test/", strconv.Itoa(reqs), strconv.Itoa(conc))
			g.rps, g.p50, g.p95, g.reqErrs = append(g.rps, m["rps"]), append(g.p50, m["p50_us"]), append(g.p95, m["p95_us"]), append(g.reqErrs, m["errors"])
		}
	}

	loadAfter := loadavg()
	d, s, fl := got["direct"], got["service"], got["floor"]
	med := median
	t.Logf("gate service benchmark: R=%d SIZE_MIB=%d CONNECTS=%d PARALLEL=%d REQS=%d CONC=%d (medians of %d rounds); load %s before, %s after (%d CPUs)",
		rounds, sizeMiB, connects, parallelN, reqs, conc, rounds, loadBefore, loadAfter, runtime.NumCPU())
	t.Logf("rounds: download MiB/s direct %.0f, service %.0f, floor %.0f; small requests req/s direct %.0f, service %.0f",
		d.mibps, s.mibps, fl.mibps, d.rps, s.rps)
	t.Logf("download %d MiB over HTTPS: direct %.0f MiB/s, through the service (intercepted) %.0f MiB/s: %.2fx direct (target >= 0.7x)",
		sizeMiB, med(d.mibps), med(s.mibps), med(s.mibps)/med(d.mibps))
	t.Logf("download floor, a bare TLS-terminating relay (io.Copy; %s): %.0f MiB/s: floor/direct %.2fx, service/floor %.2fx",
		relay.negotiated(), med(fl.mibps), med(fl.mibps)/med(d.mibps), med(s.mibps)/med(fl.mibps))
	t.Logf("download CPU of this process (the upstream, and the service or the relay), ms per GiB: direct %.0f, service %.0f, floor %.0f: the service's own %.0f, the relay's %.0f",
		med(d.cpuMsPerGiB), med(s.cpuMsPerGiB), med(fl.cpuMsPerGiB), med(s.cpuMsPerGiB)-med(d.cpuMsPerGiB), med(fl.cpuMsPerGiB)-med(d.cpuMsPerGiB))
	t.Logf("download CPU of the client, ms per GiB: direct %.0f, service %.0f, floor %.0f",
		med(d.clientMsPerGiB), med(s.clientMsPerGiB), med(fl.clientMsPerGiB))
	// The client, the upstream and the relay share this host's CPUs: a
	// path that costs c CPU-seconds per GiB, all parties together, moves at
	// most NumCPU/c GiB/s however well its stages overlap, so when the
	// CPUs are the limit two paths' rates stand in the inverse ratio of
	// their costs. Process CPU leaves out the kernel's softirq work for the
	// packets: the caps are generous.
	all := func(g *figures) float64 { return med(g.cpuMsPerGiB) + med(g.clientMsPerGiB) }
	capMiBps := func(g *figures) float64 { return float64(runtime.NumCPU()) * 1000 / all(g) * 1024 }
	t.Logf("download CPU of all parties, ms per GiB: direct %.0f, service %.0f, floor %.0f; on %d CPUs at most %.0f, %.0f and %.0f MiB/s: CPU-bound, service/direct %.2fx, floor/direct %.2fx, service/floor %.2fx",
		all(d), all(s), all(fl), runtime.NumCPU(), capMiBps(d), capMiBps(s), capMiBps(fl), all(d)/all(s), all(d)/all(fl), all(fl)/all(s))
	if downloadOnly {
		return
	}
	t.Logf("connect p50: direct %.0f µs, service %.0f µs: added %.3f ms (target <= 0.3 ms); p99 direct %.0f µs, service %.0f µs",
		med(d.connP50), med(s.connP50), (med(s.connP50)-med(d.connP50))/1000, med(d.connP99), med(s.connP99))
	t.Logf("%d parallel connects: direct %.1f ms, service %.1f ms: %.2fx direct (target <= 2x); failed: direct %.0f, service %.0f; SYN retransmits (TcpExt TCPSynRetrans, client namespace, max of rounds): direct %.0f, service %.0f (target 0)",
		parallelN, med(d.parMS), med(s.parMS), med(s.parMS)/med(d.parMS), slices.Max(d.parFailed), slices.Max(s.parFailed), slices.Max(d.syn), slices.Max(s.syn))
	t.Logf("small HTTPS requests (%d over %d kept-alive connections, HTTP/1.1): direct %.0f req/s p50 %.0f µs p95 %.0f µs; service (intercepted) %.0f req/s p50 %.0f µs p95 %.0f µs: %.2fx direct req/s; errors: direct %.0f, service %.0f",
		reqs, conc, med(d.rps), med(d.p50), med(d.p95), med(s.rps), med(s.p50), med(s.p95), med(s.rps)/med(d.rps), slices.Max(d.reqErrs), slices.Max(s.reqErrs))
}

// loadavg is /proc/loadavg's three averages: how busy the shared host
// was, for reading the figures.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive whole number", name, s)
	}
	return n
}

// netstat reads one counter of /proc/net/netstat's text: a header line
// and a value line per prefix.
func netstat(text, prefix, field string) int64 {
	var head []string
	for _, line := range strings.Split(text, "\n") {
		fs := strings.Fields(line)
		if len(fs) == 0 || fs[0] != prefix {
			continue
		}
		if head == nil {
			head = fs
			continue
		}
		if i := slices.Index(head, field); i >= 0 && i < len(fs) {
			v, _ := strconv.ParseInt(fs[i], 10, 64)
			return v
		}
	}
	return -1
}

// floorRelay is the least any intercepting relay does, for the download
// figure's floor: terminate the client's TLS with a leaf from a CA of the
// service's kind (tlsca, ECDSA), open TLS to the upstream, and copy bytes
// both ways with io.Copy. No HTTP, no policy, no audit, no scrubbing. Its
// TLS configs are the gate's own defaults (MinVersion 1.2, Go's cipher
// suite order, ALPN h2 and http/1.1 to the client), so both negotiate the
// same version and suite as the gate does; the protocol the client picked
// is asked of the upstream, so HTTP/2 runs end to end through it. It lives
// in this test only: the product never copies intercepted bytes blind.
type floorRelay struct {
	ln       net.Listener
	upstream string // host:port dialed for every connection
	client   *tls.Config
	server   *tls.Config
	wg       sync.WaitGroup
	mu       sync.Mutex // guards state
	state    string     // the first connection's negotiated TLS, both legs
}

func startFloorRelay(t *testing.T, addr netip.AddrPort, upstream string, upstreamRoots *x509.CertPool) (*floorRelay, []byte) {
	t.Helper()
	ca, err := tlsca.LoadOrCreate(t.TempDir())
	must(t, err)
	ln, err := net.Listen("tcp", addr.String())
	must(t, err)
	r := &floorRelay{
		ln:       ln,
		upstream: upstream,
		server: &tls.Config{
			GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) },
			NextProtos:     []string{"h2", "http/1.1"},
			MinVersion:     tls.VersionTLS12,
		},
		client: &tls.Config{RootCAs: upstreamRoots, MinVersion: tls.VersionTLS12},
	}
	r.wg.Add(1)
	go pprof.Do(context.Background(), pprof.Labels("moat", "floor"), func(context.Context) { r.serve() })
	t.Cleanup(func() { ln.Close(); r.wg.Wait() })
	return r, ca.CertPEM()
}

func (r *floorRelay) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.relay(c)
		}()
	}
}

func (r *floorRelay) relay(c net.Conn) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	down := tls.Server(c, r.server)
	if err := down.HandshakeContext(ctx); err != nil {
		return
	}
	ds := down.ConnectionState()
	cfg := r.client.Clone()
	cfg.ServerName = ds.ServerName
	if ds.NegotiatedProtocol != "" {
		cfg.NextProtos = []string{ds.NegotiatedProtocol}
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	uc, err := d.DialContext(ctx, "tcp", r.upstream)
	if err != nil {
		return
	}
	up := tls.Client(uc, cfg)
	defer up.Close()
	if err := up.HandshakeContext(ctx); err != nil {
		return
	}
	us := up.ConnectionState()
	r.mu.Lock()
	if r.state == "" {
		r.state = fmt.Sprintf("client leg %s %s %s, upstream leg %s %s %s",
			tls.VersionName(ds.Version), tls.CipherSuiteName(ds.CipherSuite), ds.NegotiatedProtocol,
			tls.VersionName(us.Version), tls.CipherSuiteName(us.CipherSuite), us.NegotiatedProtocol)
	}
	r.mu.Unlock()
	done := make(chan struct{})
	go func() {
		io.Copy(up, down)
		up.CloseWrite()
		close(done)
	}()
	io.Copy(down, up)
	down.CloseWrite()
	// The client ends its side once it has read the answer; one that
	// does not is cut after 5 s, and the copy toward the upstream ends
	// with the closed connections.
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	c.Close()
	up.Close()
	<-done
}

func (r *floorRelay) negotiated() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// startProfile writes a CPU profile of the test process (the service and
// the upstream, not the client) to dir/name until stop is called; nothing
// when dir is empty.
func startProfile(t *testing.T, dir, name string) (stop func()) {
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, name))
	must(t, err)
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		t.Fatalf("profiling: %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		must(t, f.Close())
	}
}

// selfCPU is the user and system CPU time this process has used: the
// upstream's and the service's (or the relay's), never the client's.
func selfCPU(t *testing.T) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
