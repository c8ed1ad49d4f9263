package resources

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets the test binary play moat's hidden reaper role, so that
// StartReaper can start it as the daemon does.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == ReaperCommand {
		pid, _ := strconv.Atoi(os.Args[3])
		os.Exit(Reap(os.Args[2], pid))
	}
	if len(os.Args) == 3 && os.Args[1] == testGuestRole {
		// A guest's stand-in: into the group, as the shim goes, then idle.
		if err := Enter([]byte(os.Args[2])); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("in\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const testGuestRole = "__test_guest"

// TestReaperFinishesDespiteSIGTERM: once its daemon is gone, the reaper
// gets the parent-death signal again each time it is re-parented (a
// killed daemon's threads exit one by one), often after it started its
// work. It must finish that work: the groups removed, exit 0.
func TestReaperFinishesDespiteSIGTERM(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: it makes real cgroups")
	}
	dir := t.TempDir()
	g, err := Create(dir, Limits{CPUs: 1, BaselineBytes: 64 * MiB, CeilingBytes: 256 * MiB, PidsMax: 64})
	if err != nil {
		t.Skipf("no cgroups to test with here: %v", err)
	}
	defer func() {
		// Whatever the outcome, nothing stays on the host.
		g.cg.Uninstall()
		if g.daemon != nil {
			g.daemon.Uninstall()
		}
	}()
	// A process inside the sandbox's group, as the guest would be: the
	// reaper waits for it to go.
	b, err := g.JSON()
	if err != nil {
		t.Fatal(err)
	}
	guest := exec.Command(os.Args[0], testGuestRole, string(b))
	out, err := guest.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	guest.Stderr = os.Stderr
	if err := guest.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { guest.Process.Kill(); guest.Wait() }()
	if n, _ := out.Read(make([]byte, 3)); n != 3 || len(g.procs()) != 1 {
		t.Fatalf("the guest's stand-in did not join the group (%d bytes said, %d processes in it)", n, len(g.procs()))
	}
	logPath := filepath.Join(dir, "daemon.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	rp, err := g.StartReaper(os.Args[0], dir, log)
	if err != nil {
		t.Fatal(err)
	}
	// The daemon's end: its pipe closes without the word.
	rp.w.Close()
	waitLog(t, logPath, "process(es) left in its sandbox's cgroup")
	if err := unix.Kill(rp.pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	guest.Process.Kill()
	guest.Wait()
	select {
	case <-rp.done:
	case <-time.After(lockWait):
		t.Fatalf("the reaper did not finish within %s", lockWait)
	}
	b, _ = os.ReadFile(logPath)
	if rp.err != nil {
		t.Fatalf("the reaper ended with %v; its log:\n%s", rp.err, b)
	}
	if _, err := os.Stat(filepath.Join(dir, GroupFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the group's record is still there (%v); the reaper's log:\n%s", err, b)
	}
	for _, c := range []string{"memory", "pids", "cpu"} {
		if _, err := os.Stat(g.cg.MakePath(c)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the sandbox's %s group is still there (%v); the reaper's log:\n%s", c, err, b)
		}
	}
}

// waitLog waits (bounded) until the file at path holds want.
func waitLog(t *testing.T, path, want string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q not in the reaper's log after 30 s:\n%s", want, b)
		}
	}
}
