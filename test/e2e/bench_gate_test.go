package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"

	"moat.dev/moat/test/inet"
)

// TestBenchGate is the gate's benchmark (bench/gate.sh), not a test: it
// runs only with MOAT_BENCH_GATE=1 and prints figures, each next to its
// direct baseline measured in the same run by the same probe program.
func TestBenchGate(t *testing.T) {
	if os.Getenv("MOAT_BENCH_GATE") == "" {
		t.Skip("a benchmark, not a test: run bench/gate.sh")
	}
	rounds := envInt("R", 3)
	sizeMiB := envInt("SIZE_MIB", 1024)
	connects := envInt("CONNECTS", 1000)
	par := envInt("PARALLEL", 1000)

	n := inet.Start(t)
	n.HTTP(t, "198.51.100.10", 80, inet.Bytes())
	n.TCP(t, "198.51.100.11", 9000, "")
	n.SetA("dl.bench.test", "198.51.100.10")
	n.SetA("tcp.bench.test", "198.51.100.11")
	for r := 0; r < rounds; r++ {
		for i := 0; i <= 100; i++ {
			n.SetA(fmt.Sprintf("u%d-%d.bench.test", r, i), "198.51.100.10")
		}
	}
	dir := project(t, "benchgate")
	os.WriteFile(filepath.Join(dir, "moat.toml"), []byte("[network]\nuse = [\"none\"]\nallow = [\"*.bench.test\"]\n"), 0o644)
	probe := benchProbe(t, dir)
	env := []string{"MOAT_UPSTREAM_DNS=" + n.DNS.String()}
	if r := moat(t, dir, env, "up", "--name", "benchgate"); r.code != 0 {
		t.Fatalf("moat up: %s", r.stderr)
	}
	t.Cleanup(func() { moat(t, dir, nil, "destroy", "--yes", "benchgate") })

	direct := func(args ...string) map[string]float64 {
		out, err := exec.Command(probe, args...).Output()
		if err != nil {
			t.Fatalf("direct %v: %v", args, err)
		}
		return decode(t, out)
	}
	gated := func(args ...string) map[string]float64 {
		r := moat(t, dir, nil, append([]string{"exec", "benchgate", "--", probe}, args...)...)
		if r.code != 0 {
			t.Fatalf("gated %v: %s", args, r.stderr)
		}
		return decode(t, []byte(r.stdout))
	}
	bytes := strconv.Itoa(sizeMiB << 20)
	var dlD, dlG, cD50, cG50, cD99, cG99, pD, pG, pRe, dnsC50, dnsC99, dnsD50, dnsU50, dnsUD50 []float64
	for r := 0; r < rounds; r++ {
		d := direct("get", "http://198.51.100.10/bytes?n="+bytes)
		g := gated("get", "http://dl.bench.test/bytes?n="+bytes)
		dlD = append(dlD, d["bytes"]/d["seconds"]/(1<<20))
		dlG = append(dlG, g["bytes"]/g["seconds"]/(1<<20))

		d = direct("connect", "198.51.100.11:9000", strconv.Itoa(connects))
		g = gated("connect", "tcp.bench.test:9000", strconv.Itoa(connects))
		cD50, cD99 = append(cD50, d["p50_us"]), append(cD99, d["p99_us"])
		cG50, cG99 = append(cG50, g["p50_us"]), append(cG99, g["p99_us"])

		d = direct("parallel", "198.51.100.11:9000", strconv.Itoa(par))
		g = gated("parallel", "tcp.bench.test:9000", strconv.Itoa(par))
		if d["failed"]+g["failed"] > 0 {
			t.Errorf("parallel connects failed: direct %v, gated %v", d["failed"], g["failed"])
		}
		pD, pG, pRe = append(pD, d["ms"]), append(pG, g["ms"]), append(pRe, g["retrans"])

		g = gated("dns", "10.88.0.1:53", "dl.bench.test", "1000")
		dnsC50, dnsC99 = append(dnsC50, g["p50_us"]), append(dnsC99, g["p99_us"])
		d = direct("dns", n.DNS.String(), "u0-%d.bench.test", "100")
		dnsD50 = append(dnsD50, d["p50_us"])
		g = gated("dns", "10.88.0.1:53", fmt.Sprintf("u%d-%%d.bench.test", r), "100")
		dnsU50 = append(dnsU50, g["p50_us"])
		dnsUD50 = append(dnsUD50, d["p50_us"])
	}
	m := median
	t.Logf("rounds: %d, medians", rounds)
	t.Logf("download %d MiB   gate %7.0f MiB/s   direct %7.0f MiB/s   ratio %.2f (target >= 0.5)", sizeMiB, m(dlG), m(dlD), m(dlG)/m(dlD))
	t.Logf("connect x%d       gate p50 %5.0f us p99 %5.0f us   direct p50 %5.0f us p99 %5.0f us   added p50 %.2f ms (target <= 1 ms)",
		connects, m(cG50), m(cG99), m(cD50), m(cD99), (m(cG50)-m(cD50))/1000)
	t.Logf("parallel x%d      gate %6.1f ms   direct %6.1f ms   ratio %.2f (target <= 2)   guest TCP retransmits %.0f (target 0)",
		par, m(pG), m(pD), m(pG)/m(pD), m(pRe))
	t.Logf("dns cached        gate p50 %4.0f us p99 %4.0f us (target p50 <= 300 us)", m(dnsC50), m(dnsC99))
	t.Logf("dns uncached      gate p50 %4.0f us   one upstream round trip (direct) p50 %4.0f us   added %4.0f us", m(dnsU50), m(dnsUD50), m(dnsU50)-m(dnsD50))
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func decode(t *testing.T, b []byte) map[string]float64 {
	t.Helper()
	var m map[string]float64
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("probe output %q: %v", b, err)
	}
	return m
}

// benchProbe builds the benchmark probe static into the project directory,
// which the guest sees at the same path.
func benchProbe(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "benchprobe")
	cmd := exec.Command("go", "build", "-o", out, "./benchprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building benchprobe: %v\n%s", err, b)
	}
	return out
}
