package e2e

// moat fork through the real CLI, daemon and gVisor's checkpoint and
// restore: the child has the parent's files and processes as they were at
// the fork, then the two diverge; the child has its own keys, CA and
// placeholders, and no secret's value; either lives without the other.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// forkToml starts a counter whose count lives in the shell's memory, and
// names a secret read from a file on the host.
const forkToml = `[hooks]
on_up = [
  "setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1",
]

[secrets.MOAT_FORKKEY]
from = "file:%s"
hosts = ["fork.test"]
`

func TestFork(t *testing.T) {
	parent, child := "fork-e2e", "fork-e2e-child"
	dir := project(t, parent)
	os.Chmod(dir, 0o777)
	secretValue := "mk" + randHex(t, 20)
	keyFile := filepath.Join(t.TempDir(), "forkkey")
	if err := os.WriteFile(keyFile, []byte(secretValue+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(strings.Replace(forkToml, "%s", keyFile, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { moat(t, dir, nil, "destroy", "--yes", child) })
	mustMoat(t, dir, "up")
	sh := func(name, script string) string {
		t.Helper()
		return strings.TrimSpace(mustMoat(t, dir, "exec", name, "--", "sh", "-c", script))
	}
	count := func(name string) int {
		t.Helper()
		n, err := strconv.Atoi(sh(name, "cat /tmp/count"))
		if err != nil {
			t.Fatalf("%s's counter: %v", name, err)
		}
		return n
	}
	// The counter has counted a little, and a file is written.
	deadline := time.Now().Add(20 * time.Second)
	started := func() int { n, _ := strconv.Atoi(sh(parent, "cat /tmp/count 2>/dev/null; true")); return n }
	for started() < 5 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	sh(parent, "echo before > /tmp/before-fork")
	parentPH := sh(parent, "echo $MOAT_FORKKEY")
	if parentPH == "" || parentPH == secretValue {
		t.Fatalf("the parent's session has MOAT_FORKKEY=%q; want a placeholder", parentPH)
	}
	parentCA := sh(parent, "cat /.moat/ca.pem")
	mustMoat(t, dir, "network", "allow", parent, "fork-rule.test")
	before := count(parent)

	r := moat(t, dir, nil, "fork", parent, child)
	if r.code != 0 {
		t.Fatalf("moat fork: exit %d\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "the moment of the fork") {
		t.Errorf("moat fork's output does not say the child has the state of the moment of the fork:\n%s", r.stderr)
	}
	if got := strings.TrimSpace(r.stdout); got != child {
		t.Errorf("moat fork printed %q, want the child's name", got)
	}
	if st := sandboxState(t, dir, parent, nil); st != "running" {
		t.Errorf("the parent is %s after the fork, want running", st)
	}

	t.Run("child_has_the_parent's_files_and_processes", func(t *testing.T) {
		if got := sh(child, "cat /tmp/before-fork"); got != "before" {
			t.Errorf("the child's /tmp/before-fork holds %q, want the parent's", got)
		}
		c1 := count(child)
		if c1 < before {
			t.Errorf("the child's counter is at %d, below the parent's %d before the fork: it did not come from the parent's memory", c1, before)
		}
		deadline := time.Now().Add(10 * time.Second)
		for count(child) <= c1 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if c2 := count(child); c2 <= c1 {
			t.Errorf("the child's counter stays at %d: the restored process does not run", c2)
		}
	})

	t.Run("files_and_memory_diverge", func(t *testing.T) {
		sh(parent, "echo p > /tmp/only-parent")
		sh(child, "echo c > /tmp/only-child")
		if got := sh(child, "ls /tmp/only-parent 2>/dev/null; true"); got != "" {
			t.Errorf("a file written in the parent after the fork is in the child")
		}
		if got := sh(parent, "ls /tmp/only-child 2>/dev/null; true"); got != "" {
			t.Errorf("a file written in the child is in the parent")
		}
		// The child's counter stops; the parent's counts on.
		sh(child, "pkill -f 'tmp/coun[t]'; true") // [t]: not this shell's own command line
		time.Sleep(300 * time.Millisecond)
		c, p := count(child), count(parent)
		time.Sleep(500 * time.Millisecond)
		if count(child) != c {
			t.Errorf("the child's counter still counts after it was killed")
		}
		if count(parent) <= p {
			t.Errorf("killing the child's counter stopped the parent's")
		}
	})

	t.Run("own_placeholders_no_secret", func(t *testing.T) {
		childPH := sh(child, "echo $MOAT_FORKKEY")
		if childPH == "" || childPH == parentPH || childPH == secretValue {
			t.Errorf("a session of the child has MOAT_FORKKEY=%q (the parent's: %q); want its own placeholder", childPH, parentPH)
		}
		// New sessions' environments and the guest's own files hold
		// neither the parent's placeholder nor the value. (Processes
		// from before the fork keep the parent's placeholders: they are
		// its memory; the child's gate does not know them.)
		for _, v := range []string{parentPH, secretValue} {
			if out := sh(child, "cat /proc/self/environ | tr '\\0' '\\n' | grep -F -- '"+v+"'; true"); out != "" {
				t.Errorf("a session of the child holds %q in its environment", v)
			}
			if out := sh(child, "grep -rlF -- '"+v+"' /etc /tmp /root /home /var /.moat 2>/dev/null; true"); out != "" {
				t.Errorf("the child's files hold %q: %s", v, out)
			}
		}
		for _, p := range moatProcesses(t) {
			if strings.Contains(string(p.environ), secretValue) || strings.Contains(string(p.cmdline), secretValue) {
				t.Errorf("pid %d holds the secret's value in its environment or argv", p.pid)
			}
		}
	})

	t.Run("own_CA", func(t *testing.T) {
		childCA := sh(child, "cat /.moat/ca.pem")
		if childCA == "" || childCA == parentCA {
			t.Fatalf("the child's /.moat/ca.pem is the parent's")
		}
		// The trust bundle on the child's disk, which the parent's init
		// wrote with the parent's CA, now has the child's.
		bundle := "/etc/ssl/certs/ca-certificates.crt"
		if sh(child, "test -f "+bundle+" && echo yes; true") != "yes" {
			t.Skipf("the image has no %s to check", bundle)
		}
		line := func(pem string) string { return strings.Split(pem, "\n")[1] }
		if sh(child, "grep -cF -- '"+line(childCA)+"' "+bundle+"; true") == "0" {
			t.Errorf("the child's %s lacks the child's CA", bundle)
		}
		if sh(child, "grep -cF -- '"+line(parentCA)+"' "+bundle+"; true") != "0" {
			t.Errorf("the child's %s still has the parent's CA", bundle)
		}
	})

	t.Run("runtime_rules_copied", func(t *testing.T) {
		if out := mustMoat(t, dir, "network", "list", child); !strings.Contains(out, "fork-rule.test") {
			t.Errorf("the parent's runtime rule is not in the child's network list:\n%s", out)
		}
	})

	t.Run("fork_of_a_suspended_sandbox", func(t *testing.T) {
		grandchild := "fork-e2e-grandchild"
		t.Cleanup(func() { moat(t, dir, nil, "destroy", "--yes", grandchild) })
		mustMoat(t, dir, "suspend", child)
		mustMoat(t, dir, "fork", child, grandchild)
		if st := sandboxState(t, dir, child, nil); st != "suspended" {
			t.Errorf("the suspended parent is %s after the fork, want suspended", st)
		}
		if got := sh(grandchild, "cat /tmp/only-child"); got != "c" {
			t.Errorf("the fork of the suspended sandbox reads %q", got)
		}
		mustMoat(t, dir, "destroy", "--yes", grandchild)
	})

	t.Run("child_outlives_the_parent_and_goes_whole", func(t *testing.T) {
		mustMoat(t, dir, "destroy", "--yes", parent)
		if got := sh(child, "cat /tmp/only-child"); got != "c" {
			t.Errorf("after the parent's destroy the child reads %q", got)
		}
		mustMoat(t, dir, "destroy", "--yes", child)
		if _, err := os.Stat(filepath.Join(moatHome, "state", "sandboxes", child)); !os.IsNotExist(err) {
			t.Errorf("the child's state directory is left after its destroy: %v", err)
		}
	})
}
