package e2e

// moat snapshot through the real CLI, daemon and gVisor's checkpoint and
// restore: a restore brings back the files and the processes' memory of
// the save; a snapshot or an image made by another moat or gVisor is
// refused before runsc runs, with nothing changed and the sandbox still
// usable; destroy takes the snapshots with it.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/testfs"
)

// snapshotToml starts a counter whose count lives in the shell's memory,
// and marks each run of on_up in the workspace (which no snapshot holds).
const snapshotToml = `[hooks]
on_up = [
  "echo up >> .on-up-marker",
  "setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1",
]
`

type snapshotJSON struct {
	Tag            string    `json:"tag"`
	Saved          time.Time `json:"saved"`
	Processes      bool      `json:"processes"`
	Bytes          int64     `json:"bytes"`
	SandboxResumed bool      `json:"sandbox_resumed"`
	Manifest       struct {
		MoatVersion  string `json:"moat_version"`
		RunscVersion string `json:"runsc_version"`
	} `json:"manifest"`
}

func TestSnapshot(t *testing.T) {
	name := "snap-e2e"
	dir := project(t, name)
	os.Chmod(dir, 0o777)
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(snapshotToml), 0o644); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(moatHome, "state", "sandboxes", name)
	mustMoat(t, dir, "up")
	sh := func(script string) string {
		t.Helper()
		return strings.TrimSpace(mustMoat(t, dir, "exec", name, "--", "sh", "-c", script))
	}
	count := func() int {
		t.Helper()
		n, err := strconv.Atoi(sh("cat /tmp/count 2>/dev/null || echo 0"))
		if err != nil {
			t.Fatalf("the counter: %v", err)
		}
		return n
	}
	onUps := func() int {
		b, _ := os.ReadFile(filepath.Join(dir, ".on-up-marker"))
		return strings.Count(string(b), "up\n")
	}
	// Far enough from 0 that a counter started again cannot pass for it.
	deadline := time.Now().Add(30 * time.Second)
	for count() < 30 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	sh("echo saved > /tmp/at-save")
	before := count()
	if before < 30 {
		t.Fatalf("the counter reached only %d in 30 s", before)
	}

	r := moat(t, dir, nil, "snapshot", "save", name, "t1", "--json")
	if r.code != 0 {
		t.Fatalf("snapshot save: exit %d\n%s", r.code, r.stderr)
	}
	var saved snapshotJSON
	if err := json.Unmarshal([]byte(r.stdout), &saved); err != nil || saved.Tag != "t1" || !saved.Processes || !saved.SandboxResumed || saved.Bytes <= 0 {
		t.Fatalf("snapshot save --json = %q (%v); want tag t1, processes, the sandbox resumed, a size", r.stdout, err)
	}
	if st := sandboxState(t, dir, name, nil); st != "running" {
		t.Fatalf("the sandbox is %s after the save, want running", st)
	}
	def := strings.TrimSpace(mustMoat(t, dir, "snapshot", "save", name))
	if !regexp.MustCompile(`^\d{8}-\d{6}$`).MatchString(def) {
		t.Errorf("the default tag is %q, want the UTC time as 20261205-154900", def)
	}

	t.Run("list", func(t *testing.T) {
		var l struct {
			Snapshots []snapshotJSON `json:"snapshots"`
		}
		if err := json.Unmarshal([]byte(mustMoat(t, dir, "snapshot", "list", name, "--json")), &l); err != nil {
			t.Fatal(err)
		}
		if len(l.Snapshots) != 2 {
			t.Fatalf("list has %d snapshots, want 2: %+v", len(l.Snapshots), l.Snapshots)
		}
		for _, s := range l.Snapshots {
			if s.Bytes <= 0 || s.Manifest.MoatVersion == "" || !strings.HasPrefix(s.Manifest.RunscVersion, "runsc version") || s.Saved.IsZero() {
				t.Errorf("snapshot %+v lacks a size, a time or the versions that made it", s)
			}
		}
		out := mustMoat(t, dir, "snapshot", "list", name)
		for _, want := range []string{"TAG", "GVISOR", "t1", def} {
			if !strings.Contains(out, want) {
				t.Errorf("snapshot list does not show %q:\n%s", want, out)
			}
		}
		var ml struct {
			Sandboxes []struct {
				Name          string `json:"name"`
				SnapshotBytes int64  `json:"snapshot_bytes"`
			} `json:"sandboxes"`
		}
		json.Unmarshal([]byte(mustMoat(t, dir, "list", "--json")), &ml)
		for _, s := range ml.Sandboxes {
			if s.Name == name && s.SnapshotBytes < saved.Bytes {
				t.Errorf("moat list --json counts %d bytes of snapshots, want at least t1's %d", s.SnapshotBytes, saved.Bytes)
			}
		}
	})

	t.Run("bad_tag_named", func(t *testing.T) {
		r := moat(t, dir, nil, "snapshot", "save", name, "../escape")
		if r.code != 2 || !strings.Contains(r.stderr, "TAG argument") {
			t.Fatalf("save with tag ../escape: exit %d, stderr %q; want 2 and a message naming the TAG argument", r.code, r.stderr)
		}
		if _, err := os.Stat(filepath.Join(stateDir, "escape")); err == nil {
			t.Fatal("a bad tag made a directory")
		}
		r = moat(t, dir, nil, "snapshot", "save", name, "t1")
		if r.code != 2 || !strings.Contains(r.stderr, "already") {
			t.Fatalf("save over t1: exit %d, stderr %q; want a refusal", r.code, r.stderr)
		}
	})

	// After the save: a file changed, one added, the counter killed.
	sh("pkill -f 'tmp/coun[t]'; true") // [t]: not this shell's own command line
	sh("echo changed > /tmp/at-save; touch /tmp/after-save; echo 99999 > /tmp/count")

	t.Run("restore_asks_for_yes", func(t *testing.T) {
		r := moat(t, dir, nil, "snapshot", "restore", name, "t1")
		if r.code != 2 || !strings.Contains(r.stderr, "--yes") {
			t.Fatalf("restore without --yes off a terminal: exit %d, stderr %q", r.code, r.stderr)
		}
		if got := sh("cat /tmp/at-save"); got != "changed" {
			t.Fatalf("a refused restore changed the files: /tmp/at-save = %q", got)
		}
	})

	t.Run("restore_brings_back_files_and_memory", func(t *testing.T) {
		r := moat(t, dir, nil, "snapshot", "restore", name, "t1", "--yes")
		if r.code != 0 {
			t.Fatalf("restore: exit %d\n%s", r.code, r.stderr)
		}
		if !strings.Contains(r.stderr, "stopped "+name+" for the restore") {
			t.Errorf("restore of a running sandbox does not say it stopped it:\n%s", r.stderr)
		}
		if got := sh("cat /tmp/at-save"); got != "saved" {
			t.Errorf("/tmp/at-save = %q after the restore, want the save's %q", got, "saved")
		}
		if got := sh("ls /tmp/after-save 2>/dev/null; true"); got != "" {
			t.Errorf("a file made after the save is there after the restore")
		}
		c1 := count()
		if c1 < before || c1 >= 99999 {
			t.Fatalf("the counter reads %d after the restore, %d at the save: it is not the saved process", c1, before)
		}
		deadline := time.Now().Add(10 * time.Second)
		for count() <= c1 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if c2 := count(); c2 <= c1 {
			t.Errorf("the counter stays at %d: the restored process does not run", c2)
		}
		if n := onUps(); n != 1 {
			t.Errorf("on_up ran %d times; want once (a restore of processes must not run it)", n)
		}
	})

	t.Run("another_moat_refused_and_the_sandbox_starts_cold", func(t *testing.T) {
		path := filepath.Join(stateDir, "snapshots", def, "snapshot.json")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		m["manifest"].(map[string]any)["moat_version"] = "v0.0.1-other"
		b, _ = json.Marshal(m)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		sh("echo current > /tmp/at-save")
		mustMoat(t, dir, "down", name)
		r := moat(t, dir, nil, "snapshot", "restore", name, def, "--yes")
		if r.code == 0 {
			t.Fatalf("a snapshot of another moat was restored:\n%s", r.stderr)
		}
		for _, want := range []string{"moat version: saved by v0.0.1-other", "Nothing was changed or deleted", "moat up " + name} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("the refusal does not say %q:\n%s", want, r.stderr)
			}
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the refused snapshot is gone: %v", err)
		}
		before := onUps()
		mustMoat(t, dir, "up", name)
		if got := sh("cat /tmp/at-save"); got != "current" {
			t.Errorf("after the refusal and a cold start, /tmp/at-save = %q, want the sandbox's own %q", got, "current")
		}
		if n := onUps(); n != before+1 {
			t.Errorf("on_up ran %d times in the cold start, want once", n-before)
		}
	})

	t.Run("suspend_image_of_another_gvisor_refused_and_kept", func(t *testing.T) {
		mustMoat(t, dir, "suspend", name)
		path := filepath.Join(stateDir, "suspend", "manifest.json")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("the suspend's image has no manifest: %v", err)
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		m["runsc_version"], m["runsc_id"] = "runsc version other", ""
		edited, _ := json.Marshal(m)
		os.WriteFile(path, edited, 0o600)
		r := moat(t, dir, nil, "resume", name)
		if r.code == 0 {
			t.Fatalf("an image of another gVisor was resumed:\n%s", r.stderr)
		}
		for _, want := range []string{"saved by runsc version other", "Nothing was deleted", "moat down " + name + " && moat up " + name} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("the refusal does not say %q:\n%s", want, r.stderr)
			}
		}
		if _, err := os.Stat(filepath.Join(stateDir, "suspend", "checkpoint.img")); err != nil {
			t.Fatalf("the refused image is gone: %v", err)
		}
		if st := sandboxState(t, dir, name, nil); st != "suspended" {
			t.Errorf("after the refusal the sandbox is %s, want suspended", st)
		}
		// Put back, it resumes: nothing was lost.
		os.WriteFile(path, b, 0o600)
		mustMoat(t, dir, "resume", name)
		mustMoat(t, dir, "exec", name, "--", "true")
	})

	t.Run("suspended_sandbox_stays_suspended", func(t *testing.T) {
		mustMoat(t, dir, "suspend", name)
		r := moat(t, dir, nil, "snapshot", "save", name, "from-suspended", "--json")
		var s snapshotJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &s) != nil || !s.Processes || s.SandboxResumed {
			t.Fatalf("save of a suspended sandbox: exit %d, %q\n%s; want its processes, the sandbox left suspended", r.code, r.stdout, r.stderr)
		}
		if st := sandboxState(t, dir, name, nil); st != "suspended" {
			t.Errorf("after the save the sandbox is %s, want suspended still", st)
		}
		if _, err := os.Stat(filepath.Join(stateDir, "suspend", "checkpoint.img")); err != nil {
			t.Errorf("the save used up the sandbox's own image: %v", err)
		}
		mustMoat(t, dir, "resume", name)
		mustMoat(t, dir, "exec", name, "--", "true")
	})

	t.Run("stopped_sandbox_gives_files_only", func(t *testing.T) {
		mustMoat(t, dir, "down", name)
		r := moat(t, dir, nil, "snapshot", "save", name, "cold", "--json")
		var s snapshotJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &s) != nil || s.Processes || s.SandboxResumed {
			t.Fatalf("save of a stopped sandbox: exit %d, %q\n%s; want files only", r.code, r.stdout, r.stderr)
		}
		if st := sandboxState(t, dir, name, nil); st != "stopped" {
			t.Errorf("after the save the sandbox is %s, want stopped still", st)
		}
	})

	t.Run("rm", func(t *testing.T) {
		r := moat(t, dir, nil, "snapshot", "rm", name, "t1")
		if r.code != 2 {
			t.Fatalf("rm without --yes off a terminal: exit %d", r.code)
		}
		mustMoat(t, dir, "snapshot", "rm", name, "t1", "--yes")
		if _, err := os.Stat(filepath.Join(stateDir, "snapshots", "t1")); err == nil {
			t.Fatal("t1 is still there after rm")
		}
		if r := moat(t, dir, nil, "snapshot", "restore", name, "t1", "--yes"); r.code != 3 {
			t.Errorf("restore of a removed snapshot: exit %d, want 3 (not found)", r.code)
		}
	})

	t.Run("destroy_removes_the_snapshots", func(t *testing.T) {
		mustMoat(t, dir, "destroy", "--yes", name)
		if _, err := os.Stat(stateDir); err == nil {
			t.Fatal("the sandbox's state, snapshots included, is still there after destroy")
		}
		assertNothingLeft(t)
	})
}

// TestSnapshotFullDisk: a save that runs out of disk while it copies
// leaves no snapshot, half-written or whole, and the sandbox running with
// its processes; with room again the save works.
func TestSnapshotFullDisk(t *testing.T) {
	home := testfs.Small(t, "200m") // unmounted after the clean-up below
	name := "snap-full"
	dir := project(t, name)
	os.Chmod(dir, 0o777)
	// disk = "unlimited": the writable layer in the state directory, not
	// an image the small filesystem has no room for.
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte("[sandbox]\ndisk = \"unlimited\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"MOAT_HOME=" + home}
	stateDir := filepath.Join(home, "state", "sandboxes", name)
	var filler string
	t.Cleanup(func() {
		if filler != "" {
			os.Remove(filler)
		}
		c := exec.Command(moatBin, "destroy", "--yes", name)
		c.Env = moatEnv(env)
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("destroy: %v\n%s", err, out)
		}
	})
	must := func(args ...string) string {
		t.Helper()
		r := moat(t, dir, env, args...)
		if r.code != 0 {
			t.Fatalf("moat %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
		return r.stdout
	}
	must("up")
	must("exec", name, "--", "sh", "-c", `setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.1; done' </dev/null >/dev/null 2>&1`)
	// A suspend measures the image; the guest then maps the moat binary
	// kept in the state directory, so later suspends write only the image.
	var susp struct {
		ImageBytes int64 `json:"image_bytes"`
	}
	if err := json.Unmarshal([]byte(must("suspend", name, "--json")), &susp); err != nil || susp.ImageBytes <= 0 {
		t.Fatalf("suspend --json: %v, %+v", err, susp)
	}
	must("resume", name)
	counter := func() int {
		t.Helper()
		n, err := strconv.Atoi(strings.TrimSpace(must("exec", name, "--", "cat", "/tmp/c")))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := counter()

	// Room for the suspend's image and half as much again: the copy of
	// the image into the snapshot is what meets the full disk.
	filler = testfs.Fill(t, home)
	fi, err := os.Stat(filler)
	if err != nil || os.Truncate(filler, fi.Size()-susp.ImageBytes*3/2) != nil {
		t.Fatalf("making room for one image: %v", err)
	}
	r := moat(t, dir, env, "snapshot", "save", name, "full")
	if r.code == 0 || !strings.Contains(r.stderr, "no space left on device") || !strings.Contains(r.stderr, "nothing was saved") {
		t.Fatalf("save on a full disk: exit %d, stderr %q; want a failure that says the disk is full and nothing was saved", r.code, r.stderr)
	}
	ents, _ := os.ReadDir(filepath.Join(stateDir, "snapshots"))
	for _, e := range ents {
		t.Errorf("%s is left in snapshots/ after the failed save", e.Name())
	}
	if st := sandboxState(t, dir, name, env); st != "running" {
		t.Fatalf("after the failed save the sandbox is %s, want running", st)
	}
	after := counter()
	later := after
	for i := 0; i < 40 && later == after; i++ {
		time.Sleep(100 * time.Millisecond)
		later = counter()
	}
	if after < before || later <= after {
		t.Fatalf("the guest's counter went %d, %d, %d across the failed save: its processes did not survive", before, after, later)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	filler = ""
	must("snapshot", "save", name, "full")
	if out := must("snapshot", "list", name); !strings.Contains(out, "full") {
		t.Fatalf("with room again, the save is not listed:\n%s", out)
	}
}
