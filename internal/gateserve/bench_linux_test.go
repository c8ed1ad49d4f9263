package gateserve

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

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
// TestRealClients; only resolv.conf and the bundle differ.
func TestBenchService(t *testing.T) {
	if os.Getenv("MOAT_BENCH_GATESERVICE") == "" {
		t.Skip("a benchmark: run bench/gate-service.sh (it sets MOAT_BENCH_GATESERVICE=1)")
	}
	rounds, sizeMiB := envInt(t, "R", 3), envInt(t, "SIZE_MIB", 256)
	connects, parallelN := envInt(t, "CONNECTS", 1000), envInt(t, "PARALLEL", 1000)
	reqs, conc := envInt(t, "REQS", 2000), envInt(t, "CONC", 8)

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

	type figures struct{ mibps, connP50, connP99, parMS, parFailed, syn, rps, p50, p95, reqErrs []float64 }
	got := map[string]*figures{"direct": {}, "service": {}}
	loadBefore := loadavg()
	url := fmt.Sprintf("https://bench.test/bytes?n=%d", int64(sizeMiB)<<20)
	for r := range rounds {
		// Alternate which path goes first: the host is shared and noisy.
		order := slices.Clone(paths)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, p := range order {
			g := got[p.name]
			m := probe(p.c, filepath.Join(bin, "benchprobe"), "get", url, "1024")
			if int64(m["bytes"]) != int64(sizeMiB)<<20 {
				t.Fatalf("%s: downloaded %v bytes of %d", p.name, m["bytes"], int64(sizeMiB)<<20)
			}
			g.mibps = append(g.mibps, m["bytes"]/(1<<20)/m["seconds"])
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
	d, s := got["direct"], got["service"]
	med := median
	t.Logf("gate service benchmark: R=%d SIZE_MIB=%d CONNECTS=%d PARALLEL=%d REQS=%d CONC=%d (medians of %d rounds); load %s before, %s after (%d CPUs)",
		rounds, sizeMiB, connects, parallelN, reqs, conc, rounds, loadBefore, loadAfter, runtime.NumCPU())
	t.Logf("rounds: download MiB/s direct %.0f, service %.0f; small requests req/s direct %.0f, service %.0f",
		d.mibps, s.mibps, d.rps, s.rps)
	t.Logf("download %d MiB over HTTPS: direct %.0f MiB/s, through the service (intercepted) %.0f MiB/s: %.2fx direct (target >= 0.7x)",
		sizeMiB, med(d.mibps), med(s.mibps), med(s.mibps)/med(d.mibps))
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
