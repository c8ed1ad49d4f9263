package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"moat.dev/moat/internal/termtest"
)

// startPTY starts cmd on a new terminal of the given size and collects
// what the terminal shows.
func startPTY(t *testing.T, cmd *exec.Cmd, rows, cols uint16) (*os.File, *termtest.Screen) {
	t.Helper()
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	return f, termtest.Read(f)
}

func TestShellThroughPTY(t *testing.T) {
	dir := project(t, "ptyshell")
	mustMoat(t, dir, "up")
	cmd := exec.Command(moatBin, "shell")
	cmd.Dir, cmd.Env = dir, moatEnv([]string{"TERM=xterm"})
	f, out := startPTY(t, cmd, 24, 80)
	defer f.Close()
	defer cmd.Process.Kill()
	f.Write([]byte("tty | sed 's/^/TTY=/'\n"))
	out.WaitFor(t, "TTY=/dev/pts/", 30*time.Second)
	if err := pty.Setsize(f, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	out.SendUntil(t, f, []byte("stty size | sed 's/^/SIZE=/'\n"), "SIZE=40 100", 10*time.Second)
	// Ctrl-C interrupts sleep in the guest, not the session. Had it not,
	// the echo typed after it would run when sleep ends, 30 s later, past
	// SendUntil's bound.
	f.Write([]byte("sleep 30\n"))
	time.Sleep(500 * time.Millisecond)
	out.SendUntil(t, f, []byte("\x03echo ALIVE-$((40+2))\n"), "ALIVE-42", 15*time.Second)
	f.Write([]byte("exit 3\n"))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Fatalf("shell exit: %v, want status 3", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("shell did not exit")
	}
}

// TestClientGoneKillsGroup: killing the CLI mid-command kills the guest
// session's whole process group, and orphans leave no zombies.
func TestClientGoneKillsGroup(t *testing.T) {
	dir := project(t, "killgroup")
	mustMoat(t, dir, "up")
	cmd := exec.Command(moatBin, "run", "--", "sh", "-c", "sleep 301 & sleep 302 & echo started; wait")
	cmd.Dir, cmd.Env = dir, moatEnv(nil)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 7)
	if _, err := stdout.Read(b); err != nil || string(b) != "started" {
		t.Fatalf("read %q, %v", b, err)
	}
	cmd.Process.Signal(os.Kill)
	cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := mustMoat(t, dir, "run", "--", "ps", "-eo", "stat,args")
		if !strings.Contains(out, "sleep 30") && !strings.Contains(out, "\nZ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session processes or zombies left:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A program that orphans children: they are reaped by init, no zombies.
	mustMoat(t, dir, "run", "--", "sh", "-c", "for i in 1 2 3 4 5; do (sleep 0.1 &) ; done; sleep 0.5")
	time.Sleep(500 * time.Millisecond)
	if out := mustMoat(t, dir, "run", "--", "ps", "-eo", "stat"); strings.Contains(out, "Z") {
		t.Fatalf("zombies:\n%s", out)
	}
}
