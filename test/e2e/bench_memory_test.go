package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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

// TestBenchMemory is the gate's memory benchmark (bench/memory.sh), not a
// test: it runs only with MOAT_BENCH_MEMORY=1 and MOAT_BIN_OLD (the binary
// to compare with, built from an earlier commit), and prints, for both
// binaries in the same run and in alternating order, the daemon's resident
// memory per open idle connection and per stalled download (a GET whose
// answer the guest never reads), each in a fresh sandbox, and the gate's
// download throughput and connect time.
func TestBenchMemory(t *testing.T) {
	if os.Getenv("MOAT_BENCH_MEMORY") == "" {
		t.Skip("a benchmark, not a test: run bench/memory.sh")
	}
	oldBin := os.Getenv("MOAT_BIN_OLD")
	if oldBin == "" {
		t.Fatal("MOAT_BIN_OLD: the binary to compare with (bench/memory.sh builds it)")
	}
	rounds := envInt("R", 3)
	idleN := envInt("IDLE", 500)
	stallN := envInt("STALLED", 200)
	sizeMiB := envInt("SIZE_MIB", 1024)
	connects := envInt("CONNECTS", 1000)

	n := inet.Start(t)
	n.HTTP(t, "198.51.100.10", 80, inet.Bytes())
	n.TCP(t, "198.51.100.11", 9000, "")
	n.SetA("dl.bench.test", "198.51.100.10")
	n.SetA("tcp.bench.test", "198.51.100.11")
	oldHome, err := os.MkdirTemp("", "moat-bench-old-home-")
	if err != nil {
		t.Fatal(err)
	}
	bins := []*memBin{
		{label: "previous", path: oldBin, home: oldHome, dns: n.DNS.String()},
		{label: "new", path: moatBin, home: moatHome, dns: n.DNS.String()},
	}
	t.Cleanup(func() { os.RemoveAll(oldHome) })
	toml := "[network]\nuse = [\"none\"]\nallow = [\"*.bench.test\"]\n"
	for _, b := range bins {
		b.dir = project(t, "mem-"+b.label)
		os.WriteFile(filepath.Join(b.dir, "moat.toml"), []byte(toml), 0o644)
		b.probe = benchProbe(t, b.dir)
		b.up(t, "mem-"+b.label)
	}
	bytesArg := strconv.Itoa(sizeMiB << 20)
	for r := 0; r < rounds; r++ {
		order := bins
		if r%2 == 1 {
			order = []*memBin{bins[1], bins[0]}
		}
		for _, b := range order {
			g := b.exec(t, "mem-"+b.label, "get", "http://dl.bench.test/bytes?n="+bytesArg, "1024")
			b.dl = append(b.dl, g["bytes"]/g["seconds"]/(1<<20))
		}
		for _, b := range order {
			g := b.exec(t, "mem-"+b.label, "connect", "tcp.bench.test:9000", strconv.Itoa(connects))
			b.c50 = append(b.c50, g["p50_us"])
		}
		for _, b := range order {
			b.idle = append(b.idle, b.heldRSS(t, fmt.Sprintf("memidle-%s-%d", b.label, r), "idle", "tcp.bench.test:9000", idleN))
		}
		for _, b := range order {
			b.stall = append(b.stall, b.heldRSS(t, fmt.Sprintf("memstall-%s-%d", b.label, r), "get", "http://dl.bench.test/bytes?n=1073741824", stallN))
		}
	}
	for _, b := range bins {
		b.destroy("mem-" + b.label)
	}
	o, nw := bins[0], bins[1]
	m := median
	t.Logf("rounds: %d, medians (each round runs both binaries, alternating which goes first)", rounds)
	t.Logf("download %d MiB    previous %5.0f MiB/s   new %5.0f MiB/s   ratio %.2f, of each round's pair %.2f   (runs: previous %s, new %s)",
		sizeMiB, m(o.dl), m(nw.dl), m(nw.dl)/m(o.dl), m(paired(nw.dl, o.dl)), figs(o.dl, "%.0f"), figs(nw.dl, "%.0f"))
	t.Logf("connect x%d      previous p50 %4.0f us   new p50 %4.0f us   ratio %.2f, of each round's pair %.2f   (runs: previous %s, new %s)",
		connects, m(o.c50), m(nw.c50), m(nw.c50)/m(o.c50), m(paired(nw.c50, o.c50)), figs(o.c50, "%.0f"), figs(nw.c50, "%.0f"))
	t.Logf("idle connection   previous %6.1f KiB   new %6.1f KiB   ratio %.2f   (daemon RSS per connection, %d held; runs: previous %s, new %s)",
		m(o.idle), m(nw.idle), m(nw.idle)/m(o.idle), idleN, figs(o.idle, "%.1f"), figs(nw.idle, "%.1f"))
	t.Logf("stalled download  previous %6.1f KiB   new %6.1f KiB   ratio %.2f   (daemon RSS per download, %d held; runs: previous %s, new %s)",
		m(o.stall), m(nw.stall), m(nw.stall)/m(o.stall), stallN, figs(o.stall, "%.0f"), figs(nw.stall, "%.0f"))
}

// memBin is one binary under comparison, with its own MOAT_HOME.
type memBin struct {
	label, path, home, dir, probe, dns string
	dl, c50, idle, stall               []float64
}

// paired is each round's new/previous: on a shared host the load moves
// between rounds more than between the two runs of one round.
func paired(nw, old []float64) []float64 {
	r := make([]float64, len(nw))
	for i := range nw {
		r[i] = nw[i] / old[i]
	}
	return r
}

func figs(v []float64, f string) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf(f, x)
	}
	return strings.Join(s, " ")
}

func (b *memBin) cmd(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, b.path, trusting(args)...)
	c.Dir = b.dir
	c.Env = moatEnv([]string{"MOAT_HOME=" + b.home, "MOAT_UPSTREAM_DNS=" + b.dns})
	return c
}

func (b *memBin) run(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var so, se bytes.Buffer
	c := b.cmd(ctx, args...)
	c.Stdout, c.Stderr = &so, &se
	if err := c.Run(); err != nil {
		t.Fatalf("%s moat %v: %v\nstdout: %s\nstderr: %s", b.label, args, err, so.String(), se.String())
	}
	return so.String()
}

func (b *memBin) up(t *testing.T, name string) {
	t.Helper()
	b.run(t, "up", "--name", name)
	t.Cleanup(func() { b.destroy(name) })
}

func (b *memBin) destroy(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b.cmd(ctx, "destroy", "--yes", name).Run()
}

func (b *memBin) exec(t *testing.T, name string, args ...string) map[string]float64 {
	t.Helper()
	return decode(t, []byte(b.run(t, append([]string{"exec", name, "--", b.probe}, args...)...)))
}

func (b *memBin) daemonPID(t *testing.T, name string) int {
	t.Helper()
	p, err := os.ReadFile(filepath.Join(b.home, "state", "sandboxes", name, "daemon.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(p)))
	if err != nil {
		t.Fatalf("daemon.pid: %v", err)
	}
	return pid
}

// heldRSS brings up a fresh sandbox, has its guest hold n connections of
// the kind ("idle" or "get"), and returns the daemon's resident memory
// that they added, in KiB per connection.
func (b *memBin) heldRSS(t *testing.T, name, kind, target string, n int) float64 {
	t.Helper()
	b.up(t, name)
	defer b.destroy(name)
	pid := gateProcess(t, b.daemonPID(t, name))
	time.Sleep(time.Second)
	base := statusBytes(t, pid, "VmRSS")
	h := startHold(t, b.cmd, name, b.probe, kind, target, n, 180)
	defer h.stop()
	rss := settledRSS(t, pid, 60*time.Second)
	t.Logf("%s %s: %d held (%d refused), daemon RSS %d -> %d MiB", b.label, kind, h.opened, h.failed, base>>20, rss>>20)
	if h.opened == 0 {
		t.Fatalf("%s: no connection held", name)
	}
	return float64(rss-base) / 1024 / float64(h.opened)
}

// held is a running `benchprobe hold`.
type held struct {
	opened, failed int
	stop           func()
}

// startHold runs `benchprobe hold` in the sandbox and waits until all its
// connections are open (or refused).
func startHold(t *testing.T, cmd func(context.Context, ...string) *exec.Cmd, name, probe, kind, target string, n, secs int) held {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+60)*time.Second)
	c := cmd(ctx, "exec", name, "--", probe, "hold", kind, target, strconv.Itoa(n), strconv.Itoa(secs))
	var se bytes.Buffer
	c.Stderr = &se
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() { cancel(); c.Wait() }
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- l
	}()
	var l string
	select {
	case l = <-line:
	case <-time.After(3 * time.Minute):
		stop()
		t.Fatalf("benchprobe hold in %s did not report within 3 minutes; stderr: %s", name, se.String())
	}
	var res struct{ Opened, Failed int }
	if err := json.Unmarshal([]byte(l), &res); err != nil {
		stop()
		t.Fatalf("benchprobe hold in %s printed %q (%v); stderr: %s", name, l, err, se.String())
	}
	return held{res.Opened, res.Failed, stop}
}

// settledRSS waits until pid's resident memory stops growing (under 1%
// over 3 s) and returns it; past the deadline it returns what it read.
func settledRSS(t *testing.T, pid int, within time.Duration) int64 {
	t.Helper()
	deadline := time.Now().Add(within)
	var last []int64
	for {
		rss := statusBytes(t, pid, "VmRSS")
		last = append(last, rss)
		if len(last) > 6 {
			last = last[1:]
			if float64(rss-last[0]) < 0.01*float64(last[0]) {
				return rss
			}
		}
		if time.Now().After(deadline) {
			return rss
		}
		time.Sleep(500 * time.Millisecond)
	}
}
