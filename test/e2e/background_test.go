package e2e

// A session's background processes, through the real CLI, daemon and guest:
// they outlive a command that ends by itself (a hook may start a service),
// and a hang-up (the client went away) ends them the way a terminal's would,
// sparing what nohup started.

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const backgroundToml = `[hooks]
on_up = ["nohup sh -c 'echo $$ > .svc.pid; exec sleep 600' >/dev/null 2>&1 &"]
`

func TestBackgroundProcesses(t *testing.T) {
	dir := project(t, "bg-e2e")
	os.Chmod(dir, 0o777)
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(backgroundToml), 0o644); err != nil {
		t.Fatal(err)
	}
	mustMoat(t, dir, "up")
	// alive prints which of the pids in the named files still run.
	alive := func(files ...string) string {
		t.Helper()
		script := ""
		for _, f := range files {
			script += "if kill -0 $(cat " + f + ") 2>/dev/null; then echo " + f + "=up; else echo " + f + "=gone; fi; "
		}
		return strings.TrimSpace(mustMoat(t, dir, "run", "--", "sh", "-c", script))
	}

	t.Run("hook_service_keeps_running", func(t *testing.T) {
		if got := alive(".svc.pid"); got != ".svc.pid=up" {
			t.Fatalf("the service on_up started with nohup: %q, want it running after the hook", got)
		}
	})

	t.Run("command_leaves_background_running", func(t *testing.T) {
		start := time.Now()
		mustMoat(t, dir, "run", "--", "sh", "-c", "(sh -c 'echo $$ > .sub.pid; exec sleep 600' >/dev/null 2>&1 &); sh -c 'echo $$ > .amp.pid; exec sleep 600' >/dev/null 2>&1 &")
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("the command took %v: its background processes held the session", d)
		}
		// Both write their pid once they run; give them a moment.
		deadline := time.Now().Add(5 * time.Second)
		got := ""
		for time.Now().Before(deadline) {
			if got = alive(".sub.pid", ".amp.pid"); got == ".sub.pid=up\n.amp.pid=up" {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("after the command ended: %q, want both running", got)
	})

	t.Run("hangup_spares_nohup", func(t *testing.T) {
		for _, f := range []string{".kept.pid", ".plain.pid"} {
			os.Remove(filepath.Join(dir, f))
		}
		cmd := exec.Command(moatBin, "run", "--", "sh", "-c",
			"nohup sh -c 'echo $$ > .kept.pid; exec sleep 600' >/dev/null 2>&1 & "+
				"sh -c 'echo $$ > .plain.pid; exec sleep 600' >/dev/null 2>&1 & "+
				"while [ ! -s .kept.pid ] || [ ! -s .plain.pid ]; do sleep 0.05; done; echo ready; sleep 600")
		cmd.Dir = dir
		cmd.Env = moatEnv(nil)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if sc.Text() == "ready" {
					ready <- true
					return
				}
			}
			ready <- false
		}()
		ok := false
		select {
		case ok = <-ready:
		case <-time.After(60 * time.Second):
		}
		// The client goes away as a closed terminal or a dropped
		// connection would take it.
		cmd.Process.Kill()
		cmd.Wait()
		if !ok {
			t.Fatal("the command never printed ready")
		}
		deadline := time.Now().Add(10 * time.Second)
		got := ""
		for time.Now().Before(deadline) {
			if got = alive(".kept.pid", ".plain.pid"); got == ".kept.pid=up\n.plain.pid=gone" {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("after the client went away: %q, want the nohup process up and the other gone", got)
	})
}
