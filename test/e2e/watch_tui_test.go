package e2e

// `moat network watch` as a person uses it: the real TUI in a real terminal (a pty), the real
// daemon and a real guest. The screen is read as the bytes the TUI draws.

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/termtest"
	"moat.dev/moat/test/inet"
)

func TestWatchTUI(t *testing.T) {
	n := inet.Start(t)
	for _, name := range []string{"tui-once.test", "tui-deny.test", "tui-always.test"} {
		n.SetA(name, watchIP)
	}
	n.HTTP(t, watchIP, 80, inet.Echo())
	g := newGateEnv(t, n, "tui-e2e", "[network]\nuse = [\"none\"]\n")
	g.env = append(g.env, "MOAT_HOLD_TIMEOUT=25s")
	g.up(t)
	t.Cleanup(func() { moat(t, g.dir, g.env, "destroy", "--yes", g.name) })

	t.Run("needs_a_terminal_or_json", func(t *testing.T) {
		r := moat(t, g.dir, nil, "network", "watch", g.name)
		if r.code != 2 || !strings.Contains(r.stderr, "--json") {
			t.Errorf("without a terminal: exit %d, %q", r.code, r.stderr)
		}
	})

	t.Run("json_stream", func(t *testing.T) {
		cmd := exec.Command(moatBin, "network", "watch", g.name, "--json")
		cmd.Env = moatEnv(g.env)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
		line := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(out)
			if sc.Scan() {
				line <- sc.Text()
			}
		}()
		select {
		case l := <-line:
			var ev control.Event
			if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.Type != control.EventHello || ev.Sandbox != g.name {
				t.Errorf("first line %q (%v): want the hello event of %s", l, err, g.name)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no event from --json within 20 s")
		}
	})

	cmd := exec.Command(moatBin, "network", "watch", g.name)
	cmd.Env = append(moatEnv(g.env), "TERM=xterm-256color")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 140})
	if err != nil {
		t.Fatal(err)
	}
	var scr termtest.Screen
	copied := make(chan struct{})
	go func() { defer close(copied); bufio.NewReader(tty).WriteTo(&scr) }()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); tty.Close() })
	scr.WaitAfter(t, 0, "1 sandbox(es) watched (tui-e2e)", 30*time.Second)

	answer := func(t *testing.T, name, key, want string) {
		t.Helper()
		mark := scr.Len()
		r := startGuest(t, g, curlCode(name))
		scr.WaitAfter(t, mark, name+":80", 30*time.Second)
		// The hold names the process once the daemon has asked the guest.
		scr.WaitAfter(t, mark, "curl", 30*time.Second)
		if _, err := tty.Write([]byte(key)); err != nil {
			t.Fatal(err)
		}
		if out := strings.TrimSpace(r.wait(t)); out != want {
			t.Fatalf("after pressing %q: curl got %q, want %s", key, out, want)
		}
	}

	t.Run("allow_once_with_o", func(t *testing.T) { answer(t, "tui-once.test", "o", "200") })

	t.Run("reconnects_after_a_daemon_restart", func(t *testing.T) {
		mark := scr.Len()
		if r := moat(t, g.dir, g.env, "down"); r.code != 0 {
			t.Fatalf("down: %s", r.stderr)
		}
		scr.WaitAfter(t, mark, "reconnecting to tui-e2e", 30*time.Second)
		mark = scr.Len()
		g.up(t)
		scr.WaitAfter(t, mark, "1 sandbox(es) watched (tui-e2e)", 30*time.Second)
	})

	t.Run("deny_with_d_after_the_restart", func(t *testing.T) { answer(t, "tui-deny.test", "d", "403") })

	// The rule of an "always" answer is written by the watch process itself (the daemon
	// writes no file), then taken live by the sandbox.
	t.Run("always_with_a_then_p_writes_moat_toml", func(t *testing.T) {
		mark := scr.Len()
		r := startGuest(t, g, curlCode("tui-always.test"))
		scr.WaitAfter(t, mark, "tui-always.test:80", 30*time.Second)
		scr.WaitAfter(t, mark, "curl", 30*time.Second)
		tty.Write([]byte("a"))
		scr.WaitAfter(t, mark, "p = the project's moat.toml", 30*time.Second)
		tty.Write([]byte("p"))
		if out := strings.TrimSpace(r.wait(t)); out != "200" {
			t.Fatalf("after a, p: curl got %q, want 200", out)
		}
		scr.WaitAfter(t, mark, "wrote tui-always.test to ", 30*time.Second)
		proj := filepath.Join(g.dir, "moat.toml")
		if b, _ := os.ReadFile(proj); !strings.Contains(string(b), `allow = ["tui-always.test"]`) {
			t.Errorf("after always in the project, %s holds:\n%s", proj, b)
		}
	})

	t.Run("quits_with_q", func(t *testing.T) {
		tty.Write([]byte("q"))
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("watch exited with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("watch did not quit on q")
		}
	})
}
