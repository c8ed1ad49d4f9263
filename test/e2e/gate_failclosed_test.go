package e2e

// The gate fails closed (threat model 28): a daemon killed in
// the middle of a transfer takes the guest's network, and the guest, with it; a policy that
// does not parse, or names a policy that does not exist, starts no sandbox at all.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/test/inet"
)

// TestGateFailClosed kills the daemon with SIGKILL while the guest downloads through the gate:
// the transfer stops, the upstream sees its connection closed, and the sandbox is crashed,
// with nothing of it left running.
func TestGateFailClosed(t *testing.T) {
	n := inet.Start(t)
	const bigIP = "198.51.100.70"
	var written atomic.Int64
	ended := make(chan error, 1)
	n.HTTP(t, bigIP, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		buf := make([]byte, 256<<10)
		for written.Load() < 64<<30 {
			if _, err := w.Write(buf); err != nil {
				select {
				case ended <- err:
				default:
				}
				return
			}
			written.Add(int64(len(buf)))
		}
		ended <- errors.New("the whole 64 GiB was sent: the transfer never stopped")
	}))
	n.SetA("big.test", bigIP)

	g := newGateEnv(t, n, "gate-e2e-crash", "[network]\nuse = [\"none\"]\nallow = [\"big.test\"]\n")
	g.up(t)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, moatBin, "run", "--", "curl", "-sS", "-o", "/dev/null", "http://big.test/")
	cmd.Dir, cmd.Env = g.dir, moatEnv(g.env)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// Mid-transfer: tens of MiB through, far from the end.
	deadline := time.Now().Add(20 * time.Second)
	for written.Load() < 64<<20 {
		select {
		case err := <-exited:
			t.Fatalf("the download ended before the daemon was killed: %v\n%s\n%s", err, stderr.String(), g.daemonLog())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the download did not get going: %d bytes in 20 s\n%s", written.Load(), g.daemonLog())
		}
		time.Sleep(20 * time.Millisecond)
	}
	pid := g.daemonPID(t)
	killedAt := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the daemon (pid %d): %v", pid, err)
	}
	t.Logf("killed the daemon after %d MiB", written.Load()>>20)

	select {
	case err := <-ended:
		t.Logf("the upstream saw its connection end %v after the kill: %v", time.Since(killedAt).Round(time.Millisecond), err)
	case <-time.After(5 * time.Second):
		t.Errorf("5 s after the daemon died, the upstream is still sending (%d MiB): the transfer did not stop", written.Load()>>20)
	}
	at := written.Load()
	time.Sleep(500 * time.Millisecond)
	if now := written.Load(); now != at {
		t.Errorf("bytes still flow after the daemon died: %d → %d", at, now)
	}
	select {
	case err := <-exited:
		if err == nil {
			t.Errorf("the guest's download reported success after its daemon was killed")
		}
	case <-time.After(10 * time.Second):
		t.Errorf("moat run still running 10 s after the daemon died: the session did not end with the sandbox")
	}

	// The sandbox died with its daemon: crashed, and nothing of it left running.
	deadline = time.Now().Add(10 * time.Second)
	for {
		left := sandboxProcesses(g.state)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the daemon was killed, the sandbox's processes still run: %q", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var st struct {
		State string `json:"state"`
	}
	out := mustMoatEnv(t, g.dir, g.env, "status", g.name, "--json")
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.State != "crashed" {
		t.Errorf("moat status after the kill: want state crashed, got %s (%v)", out, err)
	}
}

// sandboxProcesses lists the processes (runsc, the shim, the daemon) whose command line names
// the sandbox's state directory.
func sandboxProcesses(stateDir string) []string {
	out, _ := exec.Command("ps", "-eo", "pid,args").Output()
	var left []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, stateDir) {
			left = append(left, strings.TrimSpace(l))
		}
	}
	return left
}

// TestGateRefusesBadPolicy: a network entry that does not parse, or a named policy that does
// not exist, refuses to start the sandbox, with the file and line of the culprit; a sandbox
// whose policy is not what the user wrote must not start with some other policy.
func TestGateRefusesBadPolicy(t *testing.T) {
	for _, c := range []struct {
		name, toml string
		want       []string
	}{
		{"gate-e2e-badentry", "[network]\nuse = [\"none\"]\nallow = [\"http://x.test/\"]\n", []string{"moat.toml:3", "http://x.test/"}},
		{"gate-e2e-badblock", "[network]\nuse = [\"none\"]\nallow = [\"ok.test\"]\nblock = [\"*\"]\n", []string{"moat.toml:4", `"*"`}},
		{"gate-e2e-baduse", "[network]\nuse = [\"nope\"]\n", []string{"nope"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := project(t, c.name)
			if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(c.toml), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"up"}, {"run", "--", "true"}} {
				start := time.Now()
				r := moat(t, dir, nil, args...)
				if r.code == 0 {
					t.Fatalf("moat %v with %q: started (exit 0); want a refusal\nstderr: %s", args, c.toml, r.stderr)
				}
				for _, w := range c.want {
					if !strings.Contains(r.stderr, w) {
						t.Errorf("moat %v: the error does not name %q:\n%s", args, w, r.stderr)
					}
				}
				if took := time.Since(start); took > 10*time.Second {
					t.Errorf("moat %v took %v to refuse", args, took)
				}
			}
			state := filepath.Join(moatHome, "state", "sandboxes", c.name)
			if left := sandboxProcesses(state); len(left) != 0 {
				t.Errorf("a refused sandbox left processes running: %q", left)
			}
			if r := moat(t, dir, nil, "status", c.name, "--json"); strings.Contains(r.stdout, `"running"`) {
				t.Errorf("a refused sandbox is running:\n%s", r.stdout)
			}
		})
	}
}
