package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/test/inet"
)

// Bounds of TestGateUnderLoad. The gate waits at most 10 s for a request head or a
// ClientHello (gate.Options.PeekTimeout) and closes a DNS-over-TCP connection idle for 10 s;
// the slack is for a loaded 2-core host.
const (
	floodHold    = 20 * time.Second // how long each flood connection waits to be closed
	peekBound    = 14 * time.Second // the gate must have closed a stalled connection by then
	refuseBound  = 5 * time.Second  // an oversized head or ClientHello is refused at once
	bystanderMax = 5 * time.Second  // one fetch by the other sandbox while the flood runs
	daemonRSSMax = 512 << 20        // the flooded sandbox's daemon's peak (VmHWM)
)

// TestGateUnderLoad is threat model 30: from inside one sandbox, thousands of connections that hold
// the gate's resources without giving it what it waits for (nothing sent, a request head
// trickled one byte at a time, a head and a ClientHello far over the gate's bounds, idle
// DNS-over-TCP). The gate closes every one of them within its bounds, dials nothing upstream
// for them, and stays up with bounded memory; another sandbox fetching its own allowed host
// meanwhile is served throughout; afterwards the flooded sandbox works again and its daemon
// has given back what the flood took. (A fork bomb is TestForkBombHitsPidsMax.)
func TestGateUnderLoad(t *testing.T) {
	n := inet.Start(t)
	const otherIP = "198.51.100.12"
	// Above the 2,510 connections of the flood: this test is about the gate closing what
	// stalls within its bounds (the bound on open connections is TestGateBackpressure's).
	a := newGateEnv(t, n, "exhaust-a", "[network]\nuse = [\"none\"]\nallow = [\"allowed.test\"]\nmax_connections = 4000\nmax_dns_queries = 400\n")
	b := newGateEnv(t, n, "exhaust-b", "[network]\nuse = [\"none\"]\nallow = [\"other.test\"]\n")
	web := n.HTTP(t, allowedIP, 80, nil)
	tlsWeb := n.HTTPS(t, allowedIP, 443, []string{"allowed.test"}, nil)
	otherWeb := n.HTTP(t, otherIP, 80, nil)
	n.SetA("allowed.test", allowedIP)
	n.SetA("other.test", otherIP)
	a.up(t)
	b.up(t)

	// The gate process holds the flood's flows.
	pid := gateProcess(t, a.daemonPID(t))
	fdsBefore := countFDs(t, pid)
	const idle, slow, bighead, bighello, dnsidle = 2000, 200, 5, 5, 300

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	flood := exec.CommandContext(ctx, moatBin, "run", "--", a.probe, "flood",
		"-idle", strconv.Itoa(idle), "-slow", strconv.Itoa(slow), "-bighead", strconv.Itoa(bighead),
		"-bighello", strconv.Itoa(bighello), "-dnsidle", strconv.Itoa(dnsidle), "-hold", floodHold.String(),
		"allowed.test:80", "allowed.test:443", gatewayIP+":53")
	flood.Dir, flood.Env = a.dir, moatEnv(a.env)
	var floodOut, floodErr strings.Builder
	flood.Stdout, flood.Stderr = &floodOut, &floodErr
	if err := flood.Start(); err != nil {
		t.Fatal(err)
	}

	// While it runs: the other sandbox fetching its own host.
	time.Sleep(2 * time.Second) // the flood's connections are open by now
	out := b.sh(t, fmt.Sprintf(`for i in $(seq 15); do curl -sS -o /dev/null --max-time %d -w '%%{http_code} %%{time_total}\n' http://other.test/ || echo "000 failed"; sleep 0.3; done`,
		int(bystanderMax/time.Second)))
	fetched := 0
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := append(strings.Fields(l), "", "")
		secs, _ := strconv.ParseFloat(f[1], 64)
		if len(f) != 4 || f[0] != "200" || time.Duration(secs*float64(time.Second)) > bystanderMax {
			t.Errorf("the other sandbox's fetch during the flood: %q (want 200 within %v)", l, bystanderMax)
			continue
		}
		fetched++
	}
	if fetched != 15 || otherWeb.Hits() < 15 {
		t.Errorf("the other sandbox fetched %d of 15 pages during the flood (its server saw %d)", fetched, otherWeb.Hits())
	}

	flood.Wait()
	if !flood.ProcessState.Success() {
		t.Fatalf("the flood's session failed: %v\nstdout: %s\nstderr: %s\n%s", flood.ProcessState, floodOut.String(), floodErr.String(), a.daemonLog())
	}
	var res probeResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(floodOut.String())), &res); err != nil || !res.OK {
		t.Fatalf("the flood probe printed %q (%v)", floodOut.String(), err)
	}
	var kinds map[string]struct {
		Opened   int      `json:"opened"`
		DialErrs int      `json:"dial_errs"`
		Closed   int      `json:"closed"`
		CloseP50 int      `json:"close_p50_ms"`
		CloseMax int      `json:"close_max_ms"`
		DialMax  int      `json:"dial_max_ms"`
		Replies  []string `json:"replies"`
		Sent     int64    `json:"sent"`
		FirstErr string   `json:"first_err"`
	}
	if err := json.Unmarshal([]byte(res.Data), &kinds); err != nil {
		t.Fatalf("the flood's data %q: %v", res.Data, err)
	}
	for kind, want := range map[string]struct {
		n     int
		bound time.Duration
	}{
		"idle": {idle, peekBound}, "slow": {slow, peekBound}, "dnsidle": {dnsidle, peekBound},
		"bighead": {bighead, refuseBound}, "bighello": {bighello, refuseBound},
	} {
		k := kinds[kind]
		t.Logf("%-8s opened %d of %d (slowest dial %d ms), closed by the gate %d, after p50 %d ms max %d ms; %d bytes sent; replies %q %s",
			kind, k.Opened, want.n, k.DialMax, k.Closed, k.CloseP50, k.CloseMax, k.Sent, k.Replies, k.FirstErr)
		if k.Opened != want.n {
			t.Errorf("%s: the guest opened %d of %d connections (first error %q): the flood did not take place as planned", kind, k.Opened, want.n, k.FirstErr)
		}
		if k.Closed != k.Opened {
			t.Errorf("%s: the gate closed %d of %d connections within %v: the rest held their resources", kind, k.Closed, k.Opened, floodHold)
		}
		if time.Duration(k.CloseMax)*time.Millisecond > want.bound {
			t.Errorf("%s: the last connection was closed after %d ms (bound %v)", kind, k.CloseMax, want.bound)
		}
	}
	// Nothing of the flood went upstream: no request head ever completed, no ClientHello
	// was accepted, so the gate had nothing to dial.
	if c := web.Conns(); c != 0 {
		t.Errorf("the flooded sandbox's upstream saw %d connections during the flood (requests %v): the gate dialed for stalled or oversized requests", c, web.Requests())
	}
	if c := tlsWeb.Conns(); c != 0 {
		t.Errorf("the TLS upstream saw %d connections during the flood", c)
	}
	// VmHWM: the daemon's peak over its life, the flood included.
	peak := statusBytes(t, pid, "VmHWM")
	t.Logf("the flooded sandbox's daemon: at most %d MiB resident, %d fds before", peak>>20, fdsBefore)
	if peak > daemonRSSMax {
		t.Errorf("the flooded sandbox's daemon grew to %d MiB resident (bound %d MiB)", peak>>20, daemonRSSMax>>20)
	}

	// Afterwards: the same daemon, serving again, with its fds given back.
	if err := syscall.Kill(pid, 0); err != nil || gateProcess(t, a.daemonPID(t)) != pid {
		t.Fatalf("the flooded sandbox's daemon (pid %d) did not survive: %v\n%s", pid, err, a.daemonLog())
	}
	after := a.sh(t, "curl -sS -o /dev/null --max-time 5 -w '%{http_code}' http://allowed.test/")
	if strings.TrimSpace(after) != "200" || web.Hits() != 1 {
		t.Errorf("after the flood the sandbox's own fetch got %q (server hits %d): the gate did not recover", after, web.Hits())
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		fds := countFDs(t, pid)
		if fds <= fdsBefore+20 {
			t.Logf("the daemon's fds: %d before, %d after", fdsBefore, fds)
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the daemon holds %d fds 10 s after the flood (%d before): the flood's flows were not released", fds, fdsBefore)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func countFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		t.Fatalf("counting the daemon's fds: %v", err)
	}
	return len(ents)
}
