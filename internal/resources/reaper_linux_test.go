package resources

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary play the shim's part, so that Reap runs
// as it does in the shim: in its own process, from inside the sandbox's
// group.
func TestMain(m *testing.M) {
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
	if len(os.Args) == 5 && os.Args[1] == testShimRole {
		// The shim's stand-in: into the sandbox's group, then, once its
		// "daemon" (the test) closes stdin, the shim's work after the
		// daemon's death.
		if err := Enter([]byte(os.Args[2])); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("in\n")
		os.Stdin.Read(make([]byte, 1))
		if err := Reap(os.Args[3], []byte(os.Args[4]), os.Stderr); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const (
	testGuestRole = "__test_guest"
	testShimRole  = "__test_shim"
)

// TestShimReapsGroups: once its daemon is gone, the shim, from inside the
// sandbox's group, removes both groups and their records: it leaves the
// group for the daemon's origin (it could not remove it from inside),
// waits for what is still inside to go, and exits 0.
func TestShimReapsGroups(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: it makes real cgroups")
	}
	dir := t.TempDir()
	// The daemon group holds this whole test process for a while.
	g, err := Create(dir, Limits{CPUs: 1, BaselineBytes: 64 * MiB, CeilingBytes: 256 * MiB, PidsMax: 64, DaemonBytes: 2 << 30})
	if err != nil {
		t.Skipf("no cgroups to test with here: %v", err)
	}
	defer func() {
		// Whatever the outcome, nothing stays on the host.
		g.LeaveDaemon()
		g.cg.Uninstall()
		if g.daemon != nil {
			g.daemon.Uninstall()
		}
		g.Release()
	}()
	if _, err := g.Handover(); err == nil {
		t.Error("Handover before JoinDaemon: the shim would have nowhere to go to remove the groups")
	}
	if err := g.JoinDaemon(); err != nil {
		t.Fatal(err)
	}
	h, err := g.Handover()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if len(h.Files) != 2 || h.Files[1] != g.lock {
		t.Fatalf("the handover's files are %v, want the daemon's pidfd and the group lock", h.Files)
	}
	// The "daemon" goes: out of its group, which the shim must find
	// empty to remove.
	g.LeaveDaemon()
	b, err := g.JSON()
	if err != nil {
		t.Fatal(err)
	}
	start := func(stderr *os.File, args ...string) (*exec.Cmd, *os.File) {
		t.Helper()
		cmd := exec.Command(os.Args[0], args...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if n, _ := out.Read(make([]byte, 3)); n != 3 {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%s did not join the group", args[0])
		}
		return cmd, stdin.(*os.File)
	}
	// A process inside the sandbox's group, as a guest's would be: the
	// shim waits for it to go.
	guest, _ := start(os.Stderr, testGuestRole, string(b))
	defer func() { guest.Process.Kill(); guest.Wait() }()
	logPath := filepath.Join(dir, "daemon.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	shim, word := start(log, testShimRole, string(b), dir, string(h.Plan))
	defer func() { shim.Process.Kill(); shim.Wait() }()
	if n := len(g.procs()); n != 2 {
		t.Fatalf("%d processes in the sandbox's group, want the guest's and the shim's stand-ins", n)
	}
	word.Close() // the daemon's death, as far as the stand-in is concerned
	time.Sleep(200 * time.Millisecond)
	guest.Process.Kill()
	guest.Wait()
	done := make(chan error, 1)
	go func() { done <- shim.Wait() }()
	select {
	case err = <-done:
	case <-time.After(lockWait):
		t.Fatalf("the shim did not finish within %s", lockWait)
	}
	logged, _ := os.ReadFile(logPath)
	if err != nil {
		t.Fatalf("the shim ended with %v; its log:\n%s", err, logged)
	}
	if !strings.Contains(string(logged), "removed its sandbox's cgroup") {
		t.Errorf("the shim's log does not say it removed the group:\n%s", logged)
	}
	for _, f := range []string{GroupFile, DaemonGroupFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there (%v); the shim's log:\n%s", f, err, logged)
		}
	}
	for _, c := range []string{"memory", "pids", "cpu"} {
		if _, err := os.Stat(g.cg.MakePath(c)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the sandbox's %s group is still there (%v); the shim's log:\n%s", c, err, logged)
		}
	}
	if _, err := os.Stat(g.daemon.MakePath("memory")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the daemon's group is still there (%v); the shim's log:\n%s", err, logged)
	}
}

// TestStaleGroupsRemoved: the groups of a sandbox whose daemon and shim
// both died (nothing removed them) go with the next moat destroy
// (RemoveStaleWait) or the next start (Create, which makes them afresh);
// while the group lock is held, a shim is at work, and RemoveStale
// leaves them to it.
func TestStaleGroupsRemoved(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: it makes real cgroups")
	}
	l := Limits{CPUs: 1, BaselineBytes: 64 * MiB, CeilingBytes: 256 * MiB, PidsMax: 64, DaemonBytes: 128 * MiB}
	// left makes the groups and lets go of them as a killed daemon does;
	// it returns the directories that must go.
	left := func(t *testing.T, dir string) []string {
		t.Helper()
		g, err := Create(dir, l)
		if err != nil {
			t.Skipf("no cgroups to test with here: %v", err)
		}
		t.Cleanup(func() { g.cg.Uninstall(); g.daemon.Uninstall() })
		g.Release()
		return []string{g.cg.MakePath("memory"), g.cg.MakePath("pids"), g.daemon.MakePath("memory")}
	}
	exist := func(dirs []string) (n int) {
		for _, d := range dirs {
			if _, err := os.Stat(d); err == nil {
				n++
			}
		}
		return n
	}
	t.Run("destroy", func(t *testing.T) {
		dir := t.TempDir()
		dirs := left(t, dir)
		lock, ok, err := lockGroup(dir, 0)
		if err != nil || !ok {
			t.Fatalf("taking the lock as a shim holds it: %v %v", ok, err)
		}
		if err := RemoveStale(dir); err != nil || exist(dirs) != len(dirs) {
			t.Errorf("RemoveStale with the lock held: %v, %d of %d groups left; want them all left to the shim", err, exist(dirs), len(dirs))
		}
		lock.Close()
		if err := RemoveStaleWait(dir); err != nil || exist(dirs) != 0 {
			t.Errorf("RemoveStaleWait: %v, %d groups left; want none", err, exist(dirs))
		}
		for _, f := range []string{GroupFile, DaemonGroupFile} {
			if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s is still there (%v)", f, err)
			}
		}
	})
	t.Run("next start", func(t *testing.T) {
		dir := t.TempDir()
		dirs := left(t, dir)
		// A setting the new start does not make: only a group made
		// afresh has lost it.
		stale := filepath.Join(dirs[0], "memory.swappiness")
		if err := os.WriteFile(stale, []byte("7"), 0); err != nil {
			t.Skipf("no memory.swappiness to mark the old group with: %v", err)
		}
		g, err := Create(dir, l)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { g.Remove(dir); g.RemoveDaemon(dir); g.Release() }()
		if b, _ := os.ReadFile(stale); strings.TrimSpace(string(b)) == "7" {
			t.Error("the next start kept the killed daemon's group instead of removing it")
		}
	})
}
