package e2e

// The daemon's own cgroup: everything moat runs for a sandbox
// on the host lives in a memory-limited group, the daemon in the daemon
// group beside the sandbox's, the shim in the sandbox's; destroy removes
// both; a daemon the kernel kills at its group's limit takes the sandbox
// down with it (its shim stops the guest and removes both groups), and
// status says why.

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// memCgroup is the directory of pid's memory cgroup: the memory
// hierarchy's on cgroup v1 (and hybrids), the unified one's on v2.
func memCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		t.Fatalf("reading the cgroups of pid %d: %v", pid, err)
	}
	unified := ""
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "memory" {
				return filepath.Join("/sys/fs/cgroup/memory", f[2])
			}
		}
		if f[0] == "0" && f[1] == "" {
			unified = filepath.Join("/sys/fs/cgroup", f[2])
		}
	}
	if unified == "" {
		t.Fatalf("pid %d is in no memory cgroup:\n%s", pid, b)
	}
	return unified
}

// memLimit is the group's memory limit: memory.limit_in_bytes on v1,
// memory.max on v2.
func memLimit(t *testing.T, dir string) uint64 {
	t.Helper()
	for _, f := range []string{"memory.limit_in_bytes", "memory.max"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatalf("%s/%s = %q: no limit", dir, f, b)
		}
		return n
	}
	t.Fatalf("%s has no memory limit file", dir)
	return 0
}

// pidOf is the one process whose command line contains pattern.
func pidOf(t *testing.T, what, pattern string) int {
	t.Helper()
	out, err := exec.Command("pgrep", "-f", pattern).Output()
	pid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 0 {
		t.Fatalf("finding the %s (pgrep -f %q): %v %q", what, pattern, err, out)
	}
	return pid
}

// hostPids are a running sandbox's daemon and shim.
func hostPids(t *testing.T, dir, name string) (daemon, shim int) {
	t.Helper()
	state := filepath.Join(moatHome, "state", "sandboxes", name)
	daemon = statusOf(t, dir, name).DaemonPID
	if daemon <= 0 {
		t.Fatalf("status of %s has no daemon pid", name)
	}
	shim = pidOf(t, "shim", "__shim "+filepath.Join(state, "shim.json"))
	return daemon, shim
}

// runscOf are the command lines of the sandbox's runsc processes (its
// sandbox, gofer, and any runsc command): what the guest is on the host.
func runscOf(name string) []string {
	state := filepath.Join(moatHome, "state", "sandboxes", name)
	out, _ := exec.Command("ps", "-eo", "args").Output()
	var left []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "runsc") && strings.Contains(l, state+"/") {
			left = append(left, l)
		}
	}
	return left
}

type daemonStatus struct {
	Resources *struct {
		DaemonUsage uint64 `json:"daemon_memory_usage_bytes"`
		DaemonLimit uint64 `json:"daemon_memory_limit_bytes"`
	} `json:"resources"`
}

// The daemon is in the daemon group, limited as
// documented (128 MiB + memory_max/16 unless daemon_memory_max says);
// the shim is in the sandbox's group beside it; status shows the group;
// destroy removes both groups.
func TestDaemonGroup(t *testing.T) {
	dir := project(t, "hostgroup")
	writeToml(t, dir, "[sandbox]\nmemory = \"512MiB\"\nmemory_max = \"1GiB\"\n")
	mustMoat(t, dir, "up")

	check := func(step string, wantLimit uint64) (daemonGroup, sandboxGroup string) {
		t.Helper()
		daemon, shim := hostPids(t, dir, "hostgroup")
		daemonGroup = memCgroup(t, daemon)
		base := filepath.Base(daemonGroup)
		if filepath.Base(filepath.Dir(daemonGroup)) != "moat" || !strings.HasPrefix(base, "hostgroup-") || !strings.HasSuffix(base, ".daemon") {
			t.Fatalf("%s: the daemon (pid %d) is in %s, want moat/hostgroup-<hash>.daemon", step, daemon, daemonGroup)
		}
		sandboxGroup = strings.TrimSuffix(daemonGroup, ".daemon")
		if got := memCgroup(t, shim); got != sandboxGroup {
			t.Errorf("%s: the shim (pid %d) is in %s, want the sandbox's group %s", step, shim, got, sandboxGroup)
		}
		if got := memLimit(t, daemonGroup); got != wantLimit {
			t.Errorf("%s: the daemon group's memory limit is %d MiB, want %d MiB", step, got>>20, wantLimit>>20)
		}
		var s daemonStatus
		if err := json.Unmarshal([]byte(mustMoat(t, dir, "status", "--json", "hostgroup")), &s); err != nil {
			t.Fatal(err)
		}
		if s.Resources == nil || s.Resources.DaemonLimit != wantLimit || s.Resources.DaemonUsage == 0 {
			t.Errorf("%s: status resources %+v, want the daemon's limit %d MiB and some usage", step, s.Resources, wantLimit>>20)
		}
		if out := mustMoat(t, dir, "status", "hostgroup"); !strings.Contains(out, "daemon:") || !strings.Contains(out, strconv.FormatUint(wantLimit>>20, 10)+"MiB (its own cgroup") {
			t.Errorf("%s: moat status does not show the daemon's group:\n%s", step, out)
		}
		return daemonGroup, sandboxGroup
	}
	check("derived", 128<<20+(1<<30)/16)

	writeToml(t, dir, "[sandbox]\nmemory = \"512MiB\"\nmemory_max = \"1GiB\"\ndaemon_memory_max = \"96MiB\"\n")
	mustMoat(t, dir, "up", "--reconfigure")
	daemonGroup, sandboxGroup := check("daemon_memory_max", 96<<20)

	mustMoat(t, dir, "destroy", "--yes")
	for _, g := range []string{daemonGroup, sandboxGroup} {
		if _, err := os.Stat(g); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after destroy, %s: %v; want it removed", g, err)
		}
	}
	assertNothingLeft(t)
}

// A daemon the kernel's OOM killer takes at its group's limit stops the
// sandbox (its shim kills the guest at once, then removes both groups),
// and status says why; the next up starts it again.
//
// What fills the group is a ballast process the test puts into it, not
// the daemon: a guest can no longer make the daemon grow without bound
// (that is the point of the gate's backpressure), and the kernel's
// choice is made to fall on the daemon by its oom_score_adj. What is
// shown is everything after the kill: the kernel acting at the group's
// limit, the fate-sharing, the reason, the clean-up.
func TestDaemonOOMStopsSandbox(t *testing.T) {
	dir := project(t, "daemon-oom")
	writeToml(t, dir, "[sandbox]\nmemory = \"512MiB\"\nmemory_max = \"1GiB\"\ndaemon_memory_max = \"128MiB\"\n")
	mustMoat(t, dir, "up")
	daemon, shim := hostPids(t, dir, "daemon-oom")
	if len(runscOf("daemon-oom")) == 0 {
		t.Fatal("no runsc process of the running sandbox found: the check that the guest stops would prove nothing")
	}
	group := memCgroup(t, daemon)
	if err := os.WriteFile(filepath.Join("/proc", strconv.Itoa(daemon), "oom_score_adj"), []byte("1000"), 0); err != nil {
		t.Fatal(err)
	}
	// Bounded: timeout ends it, and the test kills it once the daemon is gone.
	ballast := exec.Command("sh", "-c", "echo $$ > "+filepath.Join(group, "cgroup.procs")+" && exec timeout 60 tail /dev/zero")
	if err := ballast.Start(); err != nil {
		t.Fatal(err)
	}
	defer ballast.Process.Kill()
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(daemon, 0) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon (pid %d) outlived 30 s of its group at the limit", daemon)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); len(runscOf("daemon-oom")) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the guest outlived its daemon by 10 s, running without its gate: %q", runscOf("daemon-oom"))
		}
	}
	// The shim removes the daemon's group once the ballast is gone too.
	ballast.Process.Kill()
	ballast.Wait()
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(shim, 0) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the shim (pid %d) outlived its daemon by 30 s, the time a new start waits for its cgroup lock", shim)
		}
	}
	assertNothingLeft(t)
	s := statusOf(t, dir, "daemon-oom")
	if s.State != "crashed" || !strings.Contains(s.Error, "daemon_memory_max 128 MiB") || !strings.Contains(s.Error, "OOM killer") {
		t.Errorf("after the daemon's OOM kill: state %q, error %q; want crashed, saying the daemon hit daemon_memory_max", s.State, s.Error)
	}
	if out := mustMoat(t, dir, "status", "daemon-oom"); !strings.Contains(out, "last error: out of memory: the sandbox's daemon") {
		t.Errorf("moat status does not say why the sandbox stopped:\n%s", out)
	}
	if out := mustMoat(t, dir, "list"); !strings.Contains(out, "crashed") {
		t.Errorf("moat list after the daemon's OOM kill:\n%s", out)
	}
	if out := mustMoat(t, dir, "run", "--", "echo", "back"); strings.TrimSpace(out) != "back" {
		t.Fatalf("after the daemon's OOM kill, a new start: %q", out)
	}
	if s := statusOf(t, dir, "daemon-oom"); s.State != "running" || s.Error != "" {
		t.Errorf("after the new start: state %q, error %q; want running and no error", s.State, s.Error)
	}
}

// A daemon killed while its shim writes the guest's checkpoint (a window
// the shim covers): the guest and the checkpoint's runsc stop at once,
// no image is left that could be taken for a whole one, the groups are
// removed, and the next start boots the sandbox afresh.
func TestDaemonKilledWhileSuspending(t *testing.T) {
	const name = "suspkill"
	dir := project(t, name)
	mustMoat(t, dir, "up")
	state := filepath.Join(moatHome, "state", "sandboxes", name)
	// Memory that does not compress, so the checkpoint takes long enough
	// to be caught writing it.
	mustMoat(t, dir, "run", "--", "sh", "-c", "head -c 200000000 /dev/urandom > /dev/shm/ballast")
	daemon := statusOf(t, dir, name).DaemonPID
	suspend := exec.Command(moatBin, "suspend", name)
	suspend.Dir, suspend.Env = dir, moatEnv(nil)
	if err := suspend.Start(); err != nil {
		t.Fatal(err)
	}
	suspended := make(chan error, 1)
	go func() { suspended <- suspend.Wait() }()
	t.Cleanup(func() { suspend.Process.Kill() })
	checkpointing := func() bool {
		out, _ := exec.Command("ps", "-eo", "args").Output()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "runsc") && strings.Contains(l, " checkpoint ") && strings.Contains(l, state+"/") {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(60 * time.Second); !checkpointing(); time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-suspended:
			t.Skipf("the suspend ended (%v) before the test saw runsc checkpoint running: a faster disk than this test's guest needs; nothing was killed", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no runsc checkpoint within 60 s of moat suspend")
		}
	}
	killedAt := time.Now()
	if err := syscall.Kill(daemon, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(runscOf(name)) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the guest and its checkpoint outlived their daemon by 10 s: %q", runscOf(name))
		}
	}
	select {
	case err := <-suspended:
		if err == nil {
			t.Error("moat suspend succeeded although its daemon was killed while saving")
		}
	case <-time.After(30 * time.Second):
		t.Error("moat suspend did not end within 30 s of its daemon's death")
	}
	assertNothingLeft(t)
	// The image is renamed into place once whole: a rename after the
	// daemon's death is the shim working on for a dead daemon. One
	// before it (the checkpoint ended between ps and the kill) proves
	// nothing either way.
	if fi, err := os.Stat(filepath.Join(state, "suspend")); err == nil {
		st := fi.Sys().(*syscall.Stat_t)
		if renamed := time.Unix(st.Ctim.Sec, st.Ctim.Nsec); renamed.Before(killedAt) {
			t.Skipf("the checkpoint was whole %v before the daemon's kill: the test missed its window", killedAt.Sub(renamed))
		}
		t.Errorf("a checkpoint image was put in place after the daemon was killed: the shim saved the guest for a dead daemon")
	}
	if out := mustMoat(t, dir, "run", "--", "sh", "-c", "echo back; ls /dev/shm"); strings.TrimSpace(out) != "back" {
		t.Errorf("the next start, want it booted afresh (no ballast in /dev/shm): %q", out)
	}
}
