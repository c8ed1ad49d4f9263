package e2e

// Memory and CPU: limits, the ceiling's OOM kill, pids_max and
// admission, through the real CLI, daemon, cgroups and gVisor.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func writeToml(t *testing.T, dir, toml string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
}

type statusJSON struct {
	State     string `json:"state"`
	Error     string `json:"error"`
	DaemonPID int    `json:"daemon_pid"`
	Resources *struct {
		CPUs               int    `json:"cpus"`
		MemoryCeilingBytes uint64 `json:"memory_ceiling_bytes"`
		MemoryLimitBytes   uint64 `json:"memory_limit_bytes"`
		OOMKills           uint64 `json:"oom_kills"`
		PidsMax            int    `json:"pids_max"`
		GuestOOMKills      int    `json:"guest_oom_kills"`
		LastGuestOOMKill   string `json:"last_guest_oom_kill"`
	} `json:"resources"`
}

func statusOf(t *testing.T, dir, name string) statusJSON {
	t.Helper()
	var s statusJSON
	if err := json.Unmarshal([]byte(mustMoat(t, dir, "status", "--json", name)), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// The guest sees its limits; a guest process that allocates past the
// ceiling is OOM-killed inside the sandbox, which keeps running (same
// daemon, a second command works), and status shows the kill.
func TestMemoryCeilingOOM(t *testing.T) {
	dir := project(t, "oomy")
	writeToml(t, dir, "[sandbox]\ncpus = 1\nmemory = \"512MiB\"\nmemory_max = \"640MiB\"\npids_max = 512\n")
	out := mustMoat(t, dir, "run", "--", "sh", "-c", "nproc; grep MemTotal /proc/meminfo")
	if !strings.Contains(out, "655360 kB") {
		t.Errorf("guest's /proc/meminfo does not show the 640 MiB ceiling:\n%s", out)
	}
	if f := strings.Fields(out); len(f) == 0 || f[0] != "2" {
		t.Errorf("guest's nproc: %q, want 2 (cpus = 1, and gVisor never shows fewer than 2)", out)
	}
	before := statusOf(t, dir, "oomy")
	if before.Resources == nil || before.Resources.MemoryCeilingBytes != 640<<20 || before.Resources.PidsMax != 512 || before.Resources.CPUs != 1 {
		t.Fatalf("status resources = %+v", before.Resources)
	}
	// Twice: tail of an endless line keeps it all in memory (bounded in
	// time), then many smaller allocations from a loop of shell processes
	// next to a big one.
	for i, script := range []string{
		"timeout 60 tail /dev/zero",
		"for i in 1 2 3; do (head -c 100000000 /dev/zero | tail > /dev/null &) ; done; timeout 60 tail /dev/zero",
	} {
		r := moat(t, dir, nil, "run", "--", "sh", "-c", script)
		if r.code != 137 {
			t.Errorf("allocation %d past the ceiling: exit %d, want 137 (SIGKILL); stderr %s", i+1, r.code, r.stderr)
		}
		s := statusOf(t, dir, "oomy")
		if s.State != "running" || s.DaemonPID != before.DaemonPID || s.Error != "" {
			t.Fatalf("after allocation %d: state %s, daemon %d (was %d), error %q; want the same sandbox running", i+1, s.State, s.DaemonPID, before.DaemonPID, s.Error)
		}
		if s.Resources.GuestOOMKills != i+1 || !strings.Contains(s.Resources.LastGuestOOMKill, `comm="tail"`) || s.Resources.OOMKills != 0 {
			t.Fatalf("after allocation %d: guest OOM kills %d, last %q, kernel OOM kills %d; want %d, tail, 0",
				i+1, s.Resources.GuestOOMKills, s.Resources.LastGuestOOMKill, s.Resources.OOMKills, i+1)
		}
		if out := mustMoat(t, dir, "run", "--", "echo", "back"); strings.TrimSpace(out) != "back" {
			t.Fatalf("a second command after the OOM kill: %q", out)
		}
	}
	if out := mustMoat(t, dir, "status", "oomy"); !strings.Contains(out, "2 in the guest") || !strings.Contains(out, `comm="tail"`) {
		t.Errorf("moat status does not show the kills:\n%s", out)
	}
}

// A fork bomb meets pids_max; the host and another sandbox keep working.
func TestForkBombHitsPidsMax(t *testing.T) {
	dir, other := project(t, "forky"), project(t, "forky-other")
	writeToml(t, dir, "[sandbox]\npids_max = 200\nmemory = \"1GiB\"\n")
	writeToml(t, other, "[sandbox]\nmemory = \"1GiB\"\n")
	mustMoat(t, other, "up")
	if out := mustMoat(t, dir, "run", "--", "sh", "-c", "ulimit -a"); !strings.Contains(out, "process              200") {
		t.Errorf("the guest's process limit is not pids_max:\n%s", out)
	}
	// 400 sleepers under pids_max = 200, bounded in count and time: the
	// shell dies when fork fails (dash: "Cannot fork"), the sandbox lives.
	r := moat(t, dir, nil, "run", "--", "sh", "-c", "i=0; while [ $i -lt 400 ]; do sleep 20 & i=$((i+1)); done; echo all-started")
	if r.code == 0 || strings.Contains(r.stdout, "all-started") {
		t.Errorf("400 processes under pids_max = 200 all started: exit %d, stdout %q", r.code, r.stdout)
	}
	if out := mustMoat(t, other, "run", "--", "echo", "fine"); strings.TrimSpace(out) != "fine" {
		t.Fatalf("the other sandbox: %q", out)
	}
	if out := mustMoat(t, dir, "run", "--", "echo", "still"); strings.TrimSpace(out) != "still" {
		t.Fatalf("the bombed sandbox after its bomb: %q", out)
	}
}

// Admission refuses the sandbox that would not fit, saying what runs and
// what would make room; two concurrent ups cannot both squeeze in.
func TestAdmission(t *testing.T) {
	a, b, c := project(t, "adm-a"), project(t, "adm-b"), project(t, "adm-c")
	for _, d := range []string{a, b, c} {
		writeToml(t, d, "[sandbox]\nmemory = \"512MiB\"\nmemory_max = \"1GiB\"\n")
	}
	// A 3.5 GiB host (test knob) keeping 1 GiB: room for two 1 GiB
	// ceilings and their daemons' 192 MiB (128 MiB + memory_max/16), not
	// for a third.
	knobs := []string{"MOAT_TEST_HOST_RAM_MIB=3584", "MOAT_HOST_RESERVE_MIB=1024"}
	if r := moat(t, a, knobs, "up"); r.code != 0 {
		t.Fatalf("first up: exit %d %s", r.code, r.stderr)
	}
	var wg sync.WaitGroup
	res := make([]result, 2)
	for i, d := range []string{b, c} {
		wg.Add(1)
		go func() { defer wg.Done(); res[i] = moat(t, d, knobs, "up") }()
	}
	wg.Wait()
	ok, refused := 0, ""
	for _, r := range res {
		if r.code == 0 {
			ok++
		} else {
			refused = r.stderr
		}
	}
	if ok != 1 {
		t.Fatalf("two concurrent ups with room for one: %d started\n%+v", ok, res)
	}
	for _, want := range []string{"not enough memory", "adm-a", "memory_max 1 GiB, daemon 192 MiB", "moat down adm-a", "lower"} {
		if !strings.Contains(refused, want) {
			t.Errorf("refusal lacks %q:\n%s", want, refused)
		}
	}
}

// Induced host pressure (MOAT_TEST_PSI_FILE, read instead of
// /proc/pressure/memory) lowers a real sandbox's soft limit in the
// cgroup, and calm gives the ceiling back. Status's memory_limit_bytes is
// read from the group's own file (memory.soft_limit_in_bytes on v1,
// memory.high on v2) at each request.
func TestElasticFollowsHostPressure(t *testing.T) {
	dir := project(t, "elastic")
	writeToml(t, dir, "[sandbox]\nmemory = \"512MiB\"\nmemory_max = \"2GiB\"\n")
	psi := filepath.Join(t.TempDir(), "pressure")
	write := func(some, full string) {
		t.Helper()
		b := "some avg10=" + some + " avg60=0.00 avg300=0.00 total=0\nfull avg10=" + full + " avg60=0.00 avg300=0.00 total=0\n"
		if err := os.WriteFile(psi+".tmp", []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(psi+".tmp", psi); err != nil {
			t.Fatal(err)
		}
	}
	write("0.00", "0.00")
	if r := moat(t, dir, []string{"MOAT_TEST_PSI_FILE=" + psi, "MOAT_TEST_ELASTIC_EVERY=100ms"}, "up"); r.code != 0 {
		t.Fatalf("up: exit %d %s", r.code, r.stderr)
	}
	// waitSoft polls status (bounded) until the soft limit is want.
	waitSoft := func(step string, want uint64) {
		t.Helper()
		var got uint64
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			s := statusOf(t, dir, "elastic")
			if s.Resources == nil {
				t.Fatalf("%s: status has no resources", step)
			}
			if got = s.Resources.MemoryLimitBytes; got == want {
				return
			}
		}
		t.Fatalf("%s: soft limit %d MiB, want %d MiB", step, got>>20, want>>20)
	}
	tests := []struct {
		step, some, full string
		want             uint64
	}{
		{"calm host: the ceiling", "0.00", "0.00", 2 << 30},
		{"moderate pressure: 3/4 of the ceiling", "15.00", "0.00", 1536 << 20},
		{"high pressure: 1/2 of the ceiling", "55.00", "12.00", 1 << 30},
		{"calm again: the ceiling back", "0.00", "0.00", 2 << 30},
	}
	for _, tt := range tests {
		write(tt.some, tt.full)
		waitSoft(tt.step, tt.want)
	}
}
