package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/internal/resources"
	"moat.dev/moat/test/inet"
)

// stalledDownloads is how many downloads TestGateBackpressure's guest
// opens and never reads: far more than its sandbox's connection bound.
const stalledDownloads = 1000

// holdFor is how long the guest holds them: longer than the daemon's
// memory takes to settle (at most a minute, settledRSS) and the other
// sandbox's fetches.
const holdFor = 100 * time.Second

// TestGateBackpressure is threat model 35, the host memory attack: a guest in a
// sandbox with memory_max = 1GiB opens 1,000 downloads of 1 GiB each and
// reads none of them. Before backpressure the daemon buffered about 4 MiB
// of each (2.7 GiB for 600). Now each connection's windows are small, the
// gate stops reading upstream when the guest does, and connections beyond
// the sandbox's bound are refused and audited, so the daemon stays within
// the memory limit memory_max gives it (resources.DaemonLimit: 192 MiB
// for 1 GiB; the daemon's cgroup would kill it past that, and the test
// then sees it gone). Another sandbox fetches its own host throughout.
func TestGateBackpressure(t *testing.T) {
	n := inet.Start(t)
	const dlIP, otherIP = "198.51.100.31", "198.51.100.32"
	n.HTTP(t, dlIP, 80, inet.Bytes())
	otherWeb := n.HTTP(t, otherIP, 80, nil)
	n.SetA("dl.test", dlIP)
	n.SetA("other.test", otherIP)
	const memoryMax = 1 << 30
	a := newGateEnv(t, n, "bp-a", "[sandbox]\nmemory = \"512MiB\"\nmemory_max = \"1GiB\"\n[network]\nuse = [\"none\"]\nallow = [\"dl.test\"]\n")
	b := newGateEnv(t, n, "bp-b", "[network]\nuse = [\"none\"]\nallow = [\"other.test\"]\n")
	probe := benchProbe(t, a.dir)
	a.up(t)
	b.up(t)
	bound := int64(resources.DaemonLimit(memoryMax))

	// The gate process holds the connections and their buffers.
	pid := gateProcess(t, a.daemonPID(t))
	base := statusBytes(t, pid, "VmRSS")
	cmd := func(ctx context.Context, args ...string) *exec.Cmd {
		c := exec.CommandContext(ctx, moatBin, args...)
		c.Dir, c.Env = a.dir, moatEnv(a.env)
		return c
	}
	h := startHold(t, cmd, a.name, probe, "get", "http://dl.test/bytes?n=1073741824", stalledDownloads, int(holdFor/time.Second))
	defer h.stop()
	held := time.Now()
	t.Logf("the guest holds %d downloads unread, %d were refused", h.opened, h.failed)
	if h.opened+h.failed != stalledDownloads || h.opened == 0 {
		t.Fatalf("the guest opened %d and was refused %d of %d downloads", h.opened, h.failed, stalledDownloads)
	}

	// While they are held: the other sandbox's fetches.
	fetches := make(chan string, 1)
	go func() {
		c := exec.Command(moatBin, trusting([]string{"run", "--", "sh", "-c",
			`for i in $(seq 10); do curl -sS -o /dev/null --max-time 5 -w '%{http_code}\n' http://other.test/ || echo failed; sleep 0.5; done`})...)
		c.Dir, c.Env = b.dir, moatEnv(b.env)
		out, err := c.CombinedOutput()
		if err != nil {
			out = append(out, []byte(err.Error())...)
		}
		fetches <- string(out)
	}()
	rss := settledRSS(t, pid, 60*time.Second)
	peak := statusBytes(t, pid, "VmHWM")
	t.Logf("the daemon's resident memory: %d MiB before, %d MiB held, %d MiB at its peak (bound %d MiB)", base>>20, rss>>20, peak>>20, bound>>20)
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the daemon (pid %d) is gone: %v\n%s", pid, err, a.daemonLog())
	}
	if peak > bound {
		t.Errorf("the daemon grew to %d MiB resident holding %d unread downloads (bound %d MiB: the limit memory_max = 1GiB gives it)",
			peak>>20, h.opened, bound>>20)
	}
	var out string
	select {
	case out = <-fetches:
	case <-time.After(2 * time.Minute):
		t.Fatal("the other sandbox's fetches did not finish within 2 minutes")
	}
	if got := strings.Count(out, "200\n"); got != 10 || otherWeb.Hits() < 10 {
		t.Errorf("the other sandbox fetched %d of 10 pages while the downloads were held (its server saw %d):\n%s", got, otherWeb.Hits(), out)
	}

	// What was refused is on the record, and the daemon said so once, not
	// once a connection.
	if h.failed > 0 {
		var refused int
		for _, r := range a.audit(t) {
			if r.Verdict == "deny" && strings.Contains(r.Reason, "max_connections") {
				refused++
			}
		}
		if refused == 0 {
			t.Errorf("%d connections were refused, but no audit record names max_connections", h.failed)
		}
		log, _ := os.ReadFile(filepath.Join(a.state, "daemon.log"))
		if lines := strings.Count(string(log), "max_connections="); lines == 0 || lines > 20 {
			t.Errorf("the daemon log has %d lines about the connection bound, want a few (rate-limited)", lines)
		}
	}

	// Released (the probe's hold ends; stopping `moat exec` need not end
	// it in the guest), the sandbox works again.
	h.stop()
	deadline := held.Add(holdFor + 30*time.Second)
	for {
		got := strings.TrimSpace(a.sh(t, "curl -sS -o /dev/null --max-time 10 -w '%{http_code}' 'http://dl.test/bytes?n="+strconv.Itoa(1<<20)+"' || true"))
		if got == "200" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the downloads were released, a fetch got %q\n%s", got, a.daemonLog())
		}
		time.Sleep(time.Second)
	}
}
