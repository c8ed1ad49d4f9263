package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/internal/testfs"
	"moat.dev/moat/test/inet"
)

// TestGateFullDisk is threat model 28's full disk on the real data path: a
// sandbox whose state (its audit log among it) lives on a small filesystem.
// Filled up, the gate lets nothing through that it could not record: the
// guest's request to an allowed host is refused promptly and never reaches
// it, and the daemon's log says why. With room again, the same request
// goes through.
func TestGateFullDisk(t *testing.T) {
	home := testfs.Small(t, "64m") // unmounted after the clean-up below
	n := inet.Start(t)
	n.SetA("allowed.test", allowedIP)
	web := n.HTTP(t, allowedIP, 80, nil)
	// disk = "unlimited": the writable layer in the state directory, not
	// an image the small filesystem has no room for.
	g := newGateEnv(t, n, "fulldisk", "[sandbox]\ndisk = \"unlimited\"\n[network]\nuse = [\"none\"]\nallow = [\"allowed.test\"]\n")
	g.env = append(g.env, "MOAT_HOME="+home)
	g.state = filepath.Join(home, "state", "sandboxes", "fulldisk")
	var filler string
	t.Cleanup(func() {
		// Room first, whatever state the test stopped in; then nothing of
		// the sandbox may outlive the filesystem its state is on.
		if filler != "" {
			os.Remove(filler)
		}
		c := exec.Command(moatBin, "destroy", "--yes", "fulldisk")
		c.Env = moatEnv(g.env)
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("destroy: %v\n%s", err, out)
			if b, err := os.ReadFile(filepath.Join(g.state, "daemon.pid")); err == nil {
				if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	g.up(t)
	fetch := func() string {
		t.Helper()
		return strings.TrimSpace(g.sh(t, "curl -sS -o /dev/null --max-time 5 -w '%{http_code}' http://allowed.test/ 2>/dev/null; true"))
	}
	if got := fetch(); got != "200" || web.Hits() != 1 {
		t.Fatalf("with room on the disk: got %q, upstream hits %d", got, web.Hits())
	}

	filler = testfs.Fill(t, home)
	time.Sleep(300 * time.Millisecond) // the gate looks at the free space at most every 100 ms
	start := time.Now()
	if got := fetch(); got == "200" || web.Hits() != 1 {
		t.Fatalf("with the disk full: got %q, upstream hits %d (want refused, 1): something went through unrecorded", got, web.Hits())
	}
	t.Logf("refused with the disk full in %v", time.Since(start).Round(time.Millisecond))
	if log := g.daemonLog(); !strings.Contains(log, "the audit log cannot be written") {
		t.Errorf("the daemon's log does not say why:\n%s", log)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var got string
	for i := 0; i < 10; i++ {
		// The first attempt's refusal, written now, is what shows the
		// gate the log works again.
		if got = fetch(); got == "200" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got != "200" || web.Hits() != 2 {
		t.Fatalf("with room again: got %q, upstream hits %d (want 200, 2)\n%s", got, web.Hits(), g.daemonLog())
	}

	// A full disk does not keep a sandbox running: down stops it although
	// its record cannot be written.
	filler = testfs.Fill(t, home)
	if r := moat(t, g.dir, g.env, "down", "fulldisk"); r.code != 0 {
		t.Fatalf("moat down with the disk full: exit %d\n%s", r.code, r.stderr)
	}
	pid := g.daemonPID(t)
	// Gone, or a zombie its new parent has not reaped yet.
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon (pid %d) still runs 10 s after moat down with the disk full", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
