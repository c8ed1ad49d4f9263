package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/test/inet"
)

// TestBenchTLS is the TLS benchmark (bench/tls.sh), not a test: it runs only with
// MOAT_BENCH_TLS=1 and prints figures. The same probe program downloads and shakes hands from
// the host straight into the test internet (direct), and from two sandboxes: one that
// intercepts every allowed HTTPS host (inspect = true) and one that splices them (inspect =
// false). Rounds alternate the three, so load on the shared machine falls on all alike.
func TestBenchTLS(t *testing.T) {
	if os.Getenv("MOAT_BENCH_TLS") == "" {
		t.Skip("a benchmark, not a test: run bench/tls.sh")
	}
	rounds := envInt("R", 3)
	sizeMiB := envInt("SIZE_MIB", 1024)
	hs := envInt("HANDSHAKES", 200)

	n := inet.Start(t)
	dl := n.HTTPS(t, "198.51.100.10", 443, []string{"*.bench.test"}, inet.Bytes())
	n.HTTPS(t, "198.51.100.11", 443, []string{"*.bench.test"}, nil)
	n.SetA("dl.bench.test", "198.51.100.10")
	n.SetA("hs.bench.test", "198.51.100.11")
	for r := 0; r < rounds; r++ {
		for i := 0; i < hs; i++ {
			n.SetA(fmt.Sprintf("i%d-%d.bench.test", r, i), "198.51.100.11")
			n.SetA(fmt.Sprintf("s%d-%d.bench.test", r, i), "198.51.100.11")
		}
	}
	probeBytes := buildTLSProbe(t)
	type box struct{ name, dir, probe, ca string }
	env := []string{"MOAT_UPSTREAM_DNS=" + n.DNS.String()}
	start := func(name string, inspect bool) box {
		dir := project(t, name)
		b := box{name: name, dir: dir, probe: filepath.Join(dir, "tlsprobe"), ca: filepath.Join(dir, "ca.pem")}
		os.WriteFile(b.probe, probeBytes, 0o755)
		os.WriteFile(b.ca, n.CA().PEM, 0o644)
		toml := fmt.Sprintf("[network]\nuse = [\"none\"]\nallow = [\"*.bench.test\"]\ninspect = %v\ntrust = [%q]\n", inspect, b.ca)
		os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644)
		if r := moat(t, dir, env, "up", "--trust-project", "--name", name); r.code != 0 {
			t.Fatalf("moat up %s: %s", name, r.stderr)
		}
		return b
	}
	icpt, splc := start("benchtls-i", true), start("benchtls-s", false)
	caHost := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caHost, n.CA().PEM, 0o644)

	direct := func(args ...string) map[string]float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(icpt.dir, "tlsprobe"), args...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("direct %v: %v", args, err)
		}
		return decode(t, out)
	}
	bare := startBare(t, n)
	bared := func(args ...string) map[string]float64 {
		return decode(t, bare.run(t, append([]string{filepath.Join(icpt.dir, "tlsprobe")}, args...)...))
	}
	gated := func(b box, args ...string) map[string]float64 {
		r := moat(t, b.dir, nil, append([]string{"exec", b.name, "--", b.probe}, args...)...)
		if r.code != 0 {
			t.Fatalf("%s %v: exit %d: %s %s", b.name, args, r.code, r.stdout, r.stderr)
		}
		return decode(t, []byte(r.stdout))
	}
	size := strconv.Itoa(sizeMiB << 20)
	url := "https://dl.bench.test/bytes?n=" + size
	rate := func(m map[string]float64) float64 { return m["bytes"] / m["seconds"] / (1 << 20) }
	var dD, dI, dS, dB []float64
	var hB50, hB99, hD50, hD99, hIN50, hIN99, hIC50, hIC99, hSN50, hSN99, hSC50, hSC99 []float64
	load := func() string {
		b, _ := os.ReadFile("/proc/loadavg")
		return strings.Join(strings.Fields(string(b))[:3], " ")
	}
	loadBefore := load()
	for r := 0; r < rounds; r++ {
		d := direct("-ca", caHost, "-connect", dl.Addr.String(), "get", url)
		i := gated(icpt, "get", url)
		s := gated(splc, "-ca", splc.ca, "get", url)
		b := bared("-ca", caHost, "-connect", dl.Addr.String(), "get", url)
		for _, m := range []map[string]float64{d, i, s, b} {
			if m["bytes"] != float64(sizeMiB<<20) {
				t.Errorf("a download got %.0f bytes, want %d", m["bytes"], sizeMiB<<20)
			}
		}
		dD, dI, dS, dB = append(dD, rate(d)), append(dI, rate(i)), append(dS, rate(s)), append(dB, rate(b))

		cnt := strconv.Itoa(hs)
		d = direct("-ca", caHost, "-connect", "198.51.100.11:443", "handshakes", "hs.bench.test", cnt, "443")
		in := gated(icpt, "handshakes", fmt.Sprintf("i%d-%%d.bench.test", r), cnt, "443")
		ic := gated(icpt, "handshakes", "hs.bench.test", cnt, "443")
		sn := gated(splc, "-ca", splc.ca, "handshakes", fmt.Sprintf("s%d-%%d.bench.test", r), cnt, "443")
		sc := gated(splc, "-ca", splc.ca, "handshakes", "hs.bench.test", cnt, "443")
		b = bared("-ca", caHost, "-connect", "198.51.100.11:443", "handshakes", "hs.bench.test", cnt, "443")
		hD50, hD99 = append(hD50, d["p50_us"]), append(hD99, d["p99_us"])
		hB50, hB99 = append(hB50, b["p50_us"]), append(hB99, b["p99_us"])
		hIN50, hIN99 = append(hIN50, in["p50_us"]), append(hIN99, in["p99_us"])
		hIC50, hIC99 = append(hIC50, ic["p50_us"]), append(hIC99, ic["p99_us"])
		hSN50, hSN99 = append(hSN50, sn["p50_us"]), append(hSN99, sn["p99_us"])
		hSC50, hSC99 = append(hSC50, sc["p50_us"]), append(hSC99, sc["p99_us"])
	}
	m := median
	t.Logf("rounds: %d, medians; load %s before, %s after (2 CPUs)", rounds, loadBefore, load())
	t.Logf("download %d MiB over HTTPS   MiB/s    ratio to direct   target", sizeMiB)
	t.Logf("  direct (host netns)       %6.0f", m(dD))
	t.Logf("  intercepted               %6.0f    %.2f              >= 0.3", m(dI), m(dI)/m(dD))
	t.Logf("  spliced                   %6.0f    %.2f              >= 0.5", m(dS), m(dS)/m(dD))
	t.Logf("  bare runsc, no gate       %6.0f    %.2f              (gVisor's own network, TLS end to end)", m(dB), m(dB)/m(dD))
	t.Logf("TLS handshake x%d (connect + full handshake, as the client sees it)   p50 ms   p99 ms", hs)
	t.Logf("  direct (host netns)                   %7.2f  %7.2f", m(hD50)/1000, m(hD99)/1000)
	t.Logf("  bare runsc, no gate                   %7.2f  %7.2f", m(hB50)/1000, m(hB99)/1000)
	t.Logf("  intercepted, new name (leaf minted)   %7.2f  %7.2f", m(hIN50)/1000, m(hIN99)/1000)
	t.Logf("  intercepted, cached name              %7.2f  %7.2f", m(hIC50)/1000, m(hIC99)/1000)
	t.Logf("  spliced, new name                     %7.2f  %7.2f", m(hSN50)/1000, m(hSN99)/1000)
	t.Logf("  spliced, same name                    %7.2f  %7.2f", m(hSC50)/1000, m(hSC99)/1000)
	if m(dI)/m(dD) < 0.3 || m(dS)/m(dD) < 0.5 {
		t.Logf("below target: intercepted %.2f (>= 0.3), spliced %.2f (>= 0.5) of direct", m(dI)/m(dD), m(dS)/m(dD))
	}
	if r := m(dB) / m(dD); r < 0.5 {
		t.Logf("floor: bare runsc, with no gate, downloads at %.2f of direct, below the spliced target (>= 0.5)", r)
	}
}

// buildTLSProbe builds tlsprobe static and returns it.
func buildTLSProbe(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "tlsprobe")
	cmd := exec.Command(goTool(), "build", "-trimpath", "-o", out, "./tlsprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building tlsprobe: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
