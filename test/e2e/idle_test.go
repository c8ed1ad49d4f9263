package e2e

// Idle stop through the real daemon, with short knobs: samples every 200 ms,
// stop after 1.2 s idle.

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/test/inet"
)

const (
	idleIP      = "198.51.100.80"
	idleTimeout = 1200 * time.Millisecond
)

var idleKnobs = []string{"MOAT_IDLE_INTERVAL=200ms", "MOAT_IDLE_TIMEOUT=" + idleTimeout.String()}

const idleToml = `[sandbox]
idle_action = "stop" # suspend_test.go parks with suspend

[network]
use = ["none"]
allow = ["stream-idle.test"]

[hooks]
on_up = ["echo up >> .on-up-marker"]
`

// streamBody sends zeros at about rate bytes/s for up to d: a guest download that keeps the
// network busy for as long as the test needs.
func streamBody(rate int, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, rate/10)
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			if _, err := w.Write(buf); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// listState is the sandbox's state as `moat list` shows it.
func listState(t *testing.T, g *gateEnv) string {
	t.Helper()
	r := moat(t, g.dir, nil, "list", "--json")
	var v struct {
		Sandboxes []struct {
			Name       string `json:"name"`
			State      string `json:"state"`
			StopReason string `json:"stop_reason"`
		} `json:"sandboxes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("moat list --json: %v: %q", err, r.stdout)
	}
	for _, s := range v.Sandboxes {
		if s.Name == g.name {
			if s.StopReason != "" {
				return s.State + " (" + s.StopReason + ")"
			}
			return s.State
		}
	}
	return "absent"
}

// The guest's background work below is started with setsid, and the session then waits a
// moment: the agent kills a session's process group when its command ends, and a process
// that has not called setsid yet is still in it.

// stillRunningFor checks the sandbox stays running for d.
func stillRunningFor(t *testing.T, g *gateEnv, d time.Duration, while string) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if st := listState(t, g); st != "running" {
			t.Fatalf("stopped (%s) while %s", st, while)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitIdleStop waits (bounded) for the idle stop.
func waitIdleStop(t *testing.T, g *gateEnv) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < 20*time.Second {
		if st := listState(t, g); st == "stopped (idle)" {
			return time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("not stopped for idleness within 20 s: %s\n%s", listState(t, g), g.daemonLog())
	return 0
}

func TestIdleStop(t *testing.T) {
	n := inet.Start(t)
	n.SetA("stream-idle.test", idleIP)
	n.HTTP(t, idleIP, 80, streamBody(400<<10, 30*time.Second))
	g := newGateEnv(t, n, "idle-e2e", idleToml)
	os.Chmod(g.dir, 0o777) // on_up writes its marker as the agent user
	g.env = append(g.env, idleKnobs...)
	g.up(t)
	t.Cleanup(func() { moat(t, g.dir, g.env, "destroy", "--yes", g.name) })
	marker := func() int {
		b, _ := os.ReadFile(filepath.Join(g.dir, ".on-up-marker"))
		return strings.Count(string(b), "\n")
	}

	t.Run("stops_when_idle", func(t *testing.T) {
		if st := moat(t, g.dir, nil, "status", "--json").stdout; !strings.Contains(st, `"idle_timeout_ns":1200000000`) {
			t.Errorf("status does not show the idle timeout: %s", st)
		}
		took := waitIdleStop(t, g)
		t.Logf("stopped %v after up", took.Round(time.Millisecond))
		b, _ := os.ReadFile(filepath.Join(g.state, "record.json"))
		if !strings.Contains(string(b), `"stop_reason": "idle"`) && !strings.Contains(string(b), `"stop_reason":"idle"`) {
			t.Errorf("record has no stop_reason idle:\n%s", b)
		}
	})

	t.Run("next_run_starts_it_and_reruns_on_up", func(t *testing.T) {
		before := marker()
		if out := g.sh(t, "echo back"); out != "back\n" {
			t.Fatalf("run after the idle stop: %q", out)
		}
		if after := marker(); after != before+1 {
			t.Errorf("on_up ran %d times on the restart, want 1", after-before)
		}
	})

	t.Run("not_while_a_session_is_attached", func(t *testing.T) {
		r := moat(t, g.dir, g.env, "run", "--", "sleep", "3")
		if r.code != 0 {
			t.Fatalf("sleep 3: exit %d %s", r.code, r.stderr)
		}
		// The session held it up for 3 s, more than twice the timeout.
		if st := listState(t, g); st != "running" {
			t.Fatalf("after a 3 s session: %s, want running", st)
		}
		waitIdleStop(t, g)
	})

	t.Run("not_while_the_guest_burns_cpu", func(t *testing.T) {
		g.sh(t, "setsid sh -c 'end=$(($(date +%s)+4)); while [ $(date +%s) -lt $end ]; do :; done' >/dev/null 2>&1 < /dev/null & sleep 0.5")
		stillRunningFor(t, g, 3*time.Second, "the guest burned CPU")
		waitIdleStop(t, g)
	})

	t.Run("not_while_traffic_streams", func(t *testing.T) {
		g.sh(t, "setsid curl -s --max-time 4 -o /dev/null http://stream-idle.test/ >/dev/null 2>&1 < /dev/null & sleep 0.5")
		stillRunningFor(t, g, 3*time.Second, "the guest streamed a download")
		waitIdleStop(t, g)
	})
}
