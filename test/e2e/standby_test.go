package e2e

// moat suspend --standby: the next daemon set up and waiting, a resume
// through it that brings the guest back as a plain resume does, a standby
// out of date that gives way to a plain resume, and the commands and
// events that end a standby leaving nothing behind.

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSuspendStandby(t *testing.T) {
	name := "standby-e2e"
	g := startSuspendGuest(t, name, 1)
	dir, stateDir, hostPort, counter := g.dir, g.stateDir, g.hostPort, g.counter
	before := counter()
	// standbyProcs are this sandbox's daemon, gate, shim and runsc
	// processes.
	standbyProcs := func() []string {
		ps, _ := exec.Command("ps", "-eo", "pid,args").Output()
		var out []string
		for _, l := range strings.Split(string(ps), "\n") {
			if strings.Contains(l, stateDir) || (strings.Contains(l, "runsc-") && strings.Contains(l, moatHome)) {
				out = append(out, strings.TrimSpace(l))
			}
		}
		return out
	}
	suspendStandby := func() {
		t.Helper()
		r := moat(t, dir, nil, "suspend", name, "--standby", "--json")
		var res struct {
			State   string `json:"state"`
			Standby bool   `json:"standby"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.State != "suspended" || !res.Standby {
			t.Fatalf("suspend --standby: exit %d, stdout %q, stderr %q; want suspended with a standby", r.code, r.stdout, r.stderr)
		}
	}
	suspendStandby()

	t.Run("suspended_with_a_standby_waiting", func(t *testing.T) {
		var list struct {
			Sandboxes []struct {
				Name    string `json:"name"`
				State   string `json:"state"`
				Standby bool   `json:"standby"`
			} `json:"sandboxes"`
		}
		if err := json.Unmarshal([]byte(mustMoat(t, dir, "list", "--json")), &list); err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Sandboxes {
			if s.Name == name && (s.State != "suspended" || !s.Standby) {
				t.Errorf("list --json says %s, standby %v; want suspended with a standby", s.State, s.Standby)
			}
		}
		if out := mustMoat(t, dir, "list"); !strings.Contains(out, "standby)") {
			t.Errorf("list does not show the standby:\n%s", out)
		}
		procs := strings.Join(standbyProcs(), "\n")
		for _, want := range []string{"__daemon", "__gate", "__shim", "runsc-sandbox"} {
			if !strings.Contains(procs, want) {
				t.Errorf("no %s of the standby runs:\n%s", want, procs)
			}
		}
		// The standby serves nothing: no forward before the word.
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", hostPort), time.Second); err == nil {
			c.Close()
			t.Error("the forward's port accepts while the sandbox is suspended")
		}
	})

	r := moat(t, dir, nil, "resume", name)
	if r.code != 0 || strings.Contains(r.stderr, "out of date") || strings.Contains(r.stderr, "did not answer") {
		t.Fatalf("resume through the standby: exit %d, stderr %q", r.code, r.stderr)
	}
	t.Run("resumed_through_the_standby", func(t *testing.T) {
		log, _ := os.ReadFile(filepath.Join(stateDir, "daemon.log"))
		if !strings.Contains(string(log), "standby: go") {
			t.Fatalf("the daemon's log does not show the standby told to go:\n%s", log)
		}
		after := counter()
		if after < before {
			t.Fatalf("the counter reads %d after the resume, %d before the suspend: it started again", after, before)
		}
		if got := serverCount(t, hostPort, 10*time.Second); got != 2 {
			t.Fatalf("the server's second answer is %d: its memory did not survive, or the forward did not come back", got)
		}
		b, _ := os.ReadFile(filepath.Join(dir, ".on-up-marker"))
		if n := strings.Count(string(b), "up\n"); n != 1 {
			t.Fatalf("on_up ran %d times; want once", n)
		}
		if _, err := os.Stat(filepath.Join(stateDir, "standby.pid")); err == nil {
			t.Error("standby.pid is left after the standby became the daemon")
		}
	})

	t.Run("a_changed_rule_makes_it_resume_the_usual_way", func(t *testing.T) {
		suspendStandby()
		mustMoat(t, dir, "network", "allow", name, "example.com")
		r := moat(t, dir, nil, "resume", name)
		if r.code != 0 || !strings.Contains(r.stderr, "out of date") || !strings.Contains(r.stderr, "rules") {
			t.Fatalf("resume after a rule was added: exit %d, stderr %q; want a resume the usual way, saying why", r.code, r.stderr)
		}
		if got := serverCount(t, hostPort, 10*time.Second); got != 3 {
			t.Fatalf("the server's third answer is %d", got)
		}
	})

	t.Run("a_killed_standby_leaves_a_plain_resume", func(t *testing.T) {
		// As a host's reboot would: the standby gone, the image kept.
		suspendStandby()
		b, err := os.ReadFile(filepath.Join(stateDir, "standby.pid"))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			t.Fatalf("standby.pid: %q, %v", b, err)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		assertNothingLeft(t)
		if st := sandboxState(t, dir, name, nil); st != "suspended" {
			t.Fatalf("with its standby killed the sandbox is %q, want suspended", st)
		}
		r := moat(t, dir, nil, "exec", name, "--", "cat", "/tmp/count")
		if r.code != 0 || strings.Contains(r.stderr, "standby") {
			t.Fatalf("exec after the standby was killed: exit %d, stderr %q", r.code, r.stderr)
		}
		if got := serverCount(t, hostPort, 10*time.Second); got != 4 {
			t.Fatalf("the server's fourth answer is %d", got)
		}
	})

	t.Run("a_fork_of_it_sets_the_standby_aside_and_back", func(t *testing.T) {
		suspendStandby()
		child := name + "-child"
		t.Cleanup(func() { moat(t, dir, nil, "destroy", "--yes", child) })
		r := moat(t, dir, nil, "fork", name, child)
		if r.code != 0 || !strings.Contains(r.stderr, "standing by to resume "+name) {
			t.Fatalf("fork of a sandbox with a standby: exit %d, stderr %q; want its standby started again", r.code, r.stderr)
		}
		if out := mustMoat(t, dir, "list"); !strings.Contains(out, "standby)") {
			t.Fatalf("after the fork the parent has no standby:\n%s", out)
		}
		r = moat(t, dir, nil, "resume", name)
		if r.code != 0 || strings.Contains(r.stderr, "out of date") {
			t.Fatalf("resume after the fork: exit %d, stderr %q", r.code, r.stderr)
		}
		if got := serverCount(t, hostPort, 10*time.Second); got != 5 {
			t.Fatalf("the server's fifth answer is %d", got)
		}
		mustMoat(t, dir, "destroy", "--yes", child)
	})

	t.Run("down_ends_the_standby_and_drops_the_image", func(t *testing.T) {
		suspendStandby()
		mustMoat(t, dir, "down", name)
		assertNothingLeft(t)
		if st := sandboxState(t, dir, name, nil); st != "stopped" {
			t.Fatalf("after down the sandbox is %q, want stopped", st)
		}
		if _, err := os.Stat(filepath.Join(stateDir, "suspend")); err == nil {
			t.Fatal("the image is kept after down")
		}
	})

	t.Run("destroy_ends_the_standby", func(t *testing.T) {
		mustMoat(t, dir, "up", name)
		suspendStandby()
		if len(standbyProcs()) == 0 {
			t.Fatal("no standby runs")
		}
		mustMoat(t, dir, "destroy", "--yes", name)
		assertNothingLeft(t)
		if _, err := os.Stat(stateDir); err == nil {
			t.Fatal("the sandbox's state is still there after destroy")
		}
	})
}
