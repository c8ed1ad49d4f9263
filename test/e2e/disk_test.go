package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const mib = 1 << 20

// loopsOf lists the loop devices whose backing file is under dir.
func loopsOf(dir string) []string {
	var out []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			out = append(out, strings.Split(f, "/")[3]+" "+strings.TrimSpace(string(b)))
		}
	}
	return out
}

// waitNoLoops fails unless dir's loop devices are gone within 10 s.
func waitNoLoops(t *testing.T, dir, after string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(loopsOf(dir)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("loop devices left %s: %v", after, loopsOf(dir))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func hostFree(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bavail * uint64(st.Bsize)
}

func writeConfig(t *testing.T, dir, doc string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
}

type diskJSON struct {
	Schema int `json:"schema"`
	Disk   *struct {
		LimitBytes uint64 `json:"limit_bytes"`
		UsedBytes  uint64 `json:"used_bytes"`
		HostBytes  uint64 `json:"host_bytes"`
	} `json:"disk"`
}

func diskStatus(t *testing.T, dir string) diskJSON {
	t.Helper()
	var s diskJSON
	out := mustMoat(t, dir, "status", "--json")
	if err := json.Unmarshal([]byte(out), &s); err != nil || s.Schema != 1 || s.Disk == nil {
		t.Fatalf("status --json without a disk (%v):\n%s", err, out)
	}
	return s
}

// TestDiskLimit: a guest writing past [sandbox] disk gets ENOSPC in its own
// filesystem; the host loses no more than the image, and another sandbox
// keeps working.
func TestDiskLimit(t *testing.T) {
	a, b := project(t, "disk-a"), project(t, "disk-b")
	writeConfig(t, a, "[sandbox]\ndisk = \"64MiB\"\n")
	writeConfig(t, b, "[sandbox]\ndisk = \"64MiB\"\n")
	mustMoat(t, b, "up")
	mustMoat(t, a, "up")
	stateA := filepath.Join(moatHome, "state/sandboxes/disk-a")
	if len(loopsOf(stateA)) != 1 {
		t.Fatalf("the running sandbox's image is on %d loop devices, want 1: %v", len(loopsOf(stateA)), loopsOf(stateA))
	}

	const tries = 512 * mib // 8 times the limit
	before := hostFree(t, moatHome)
	r := moat(t, a, nil, "run", "--", "sh", "-c", "head -c "+strconv.Itoa(tries)+" /dev/zero > ~/big; echo rc=$?; sync; ls -l ~/big")
	after := hostFree(t, moatHome)
	if !strings.Contains(r.stdout+r.stderr, "No space left on device") || strings.Contains(r.stdout, "rc=0") {
		t.Fatalf("writing %d MiB into a 64 MiB sandbox did not fail with ENOSPC:\nstdout: %s\nstderr: %s", tries/mib, r.stdout, r.stderr)
	}
	// Other processes on the host write too: the margin is theirs, and
	// far below what the guest tried.
	if before > after && before-after > 128*mib {
		t.Errorf("the host's filesystem lost %d MiB while the guest wrote into its 64 MiB disk", (before-after)/mib)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(stateA, "disk.img"), &st); err != nil {
		t.Fatal(err)
	}
	if got := uint64(st.Blocks) * 512; got > 64*mib {
		t.Errorf("the image takes %d MiB on the host, more than its 64 MiB", got/mib)
	}

	if out := mustMoat(t, b, "run", "--", "sh", "-c", "echo fine > ~/f && cat ~/f"); strings.TrimSpace(out) != "fine" {
		t.Errorf("the other sandbox: %q", out)
	}
	s := diskStatus(t, a)
	if s.Disk.LimitBytes != 64*mib || s.Disk.UsedBytes < 48*mib || s.Disk.UsedBytes > s.Disk.LimitBytes {
		t.Errorf("status of the full sandbox: %+v", *s.Disk)
	}
	if out := mustMoat(t, a, "list"); !strings.Contains(out, "DISK") || !strings.Contains(out, "/64 MiB") {
		t.Errorf("list does not show the disk use:\n%s", out)
	}
	// Deleting gives the space back to the guest.
	if out := mustMoat(t, a, "run", "--", "sh", "-c", "rm ~/big && echo again > ~/small && cat ~/small"); strings.TrimSpace(out) != "again" {
		t.Errorf("after rm: %q", out)
	}
}

// TestDiskKeptResizedFreed: the writable layer survives down/up and a raise
// of its limit, a limit below its use is refused naming the key and file,
// and a stop, a killed daemon and destroy leave no loop device.
func TestDiskKeptResizedFreed(t *testing.T) {
	dir := project(t, "disk-keep")
	state := filepath.Join(moatHome, "state/sandboxes/disk-keep")
	writeConfig(t, dir, "[sandbox]\ndisk = \"64MiB\"\n")
	sum := mustMoat(t, dir, "run", "--", "sh", "-c", "head -c 20000000 /dev/urandom > ~/keep && sha256sum < ~/keep")
	mustMoat(t, dir, "down")
	waitNoLoops(t, state, "after moat down")
	if s := diskStatus(t, dir); s.Disk.UsedBytes < 19*mib {
		t.Errorf("a stopped sandbox's disk use: %+v", *s.Disk)
	}

	writeConfig(t, dir, "[sandbox]\ndisk = \"128MiB\"\n")
	mustMoat(t, dir, "up", "--reconfigure")
	if got := mustMoat(t, dir, "run", "--", "sh", "-c", "sha256sum < ~/keep"); got != sum {
		t.Errorf("after down, up and a raise: %q, want %q", got, sum)
	}
	if s := diskStatus(t, dir); s.Disk.LimitBytes != 128*mib {
		t.Errorf("after the raise: %+v", *s.Disk)
	}

	writeConfig(t, dir, "[sandbox]\ndisk = \"32MiB\"\n")
	r := moat(t, dir, nil, "up", "--reconfigure")
	toml := filepath.Join(dir, "moat.toml")
	if r.code == 0 || !strings.Contains(r.stderr, "sandbox.disk") || !strings.Contains(r.stderr, toml) {
		t.Fatalf("lowering the limit below the use: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	writeConfig(t, dir, "[sandbox]\ndisk = \"128MiB\"\n")
	mustMoat(t, dir, "up", "--reconfigure")
	if got := mustMoat(t, dir, "run", "--", "sh", "-c", "sha256sum < ~/keep"); got != sum {
		t.Errorf("after a refused lowering: %q, want %q", got, sum)
	}

	// A killed daemon: the shim's namespaces die with it, and with them
	// the mount and the loop device.
	if len(loopsOf(state)) != 1 {
		t.Fatalf("running, the image is on %v", loopsOf(state))
	}
	b, err := os.ReadFile(filepath.Join(state, "daemon.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitNoLoops(t, state, "after the daemon was killed")
	if got := mustMoat(t, dir, "run", "--", "sh", "-c", "sha256sum < ~/keep"); got != sum {
		t.Errorf("after a crash: %q, want %q", got, sum)
	}
	mustMoat(t, dir, "destroy", "--yes")
	waitNoLoops(t, state, "after moat destroy")
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("the state dir is left after destroy: %v", err)
	}
	assertNothingLeft(t)
}

// TestGuestLogsBounded: what a guest's root writes to its console lands
// in runsc.log on the host, which rotates within its bound (16 MiB, one
// old file kept) however much is written.
func TestGuestLogsBounded(t *testing.T) {
	dir := project(t, "disk-logs")
	state := filepath.Join(moatHome, "state/sandboxes/disk-logs")
	const wrote = 40 << 20
	out := mustMoat(t, dir, "run", "--", "sudo", "sh", "-c",
		"head -c "+strconv.Itoa(wrote)+" /dev/zero | tr '\\0' x | fold -w 99 > /proc/1/fd/1; echo rc=$?")
	if strings.TrimSpace(out) != "rc=0" {
		t.Fatalf("writing to the console: %q", out)
	}
	var total int64
	for _, f := range []string{"runsc.log", "runsc.log.1"} {
		if fi, err := os.Stat(filepath.Join(state, f)); err == nil {
			total += fi.Size()
		}
	}
	// The console's lines reached the host (else the bound proves
	// nothing), and no more than two files' worth stayed.
	if total < 16<<20 || total > 32<<20 {
		t.Errorf("runsc.log and runsc.log.1 hold %d MiB after the guest wrote %d MiB; want 16 to 32", total>>20, wrote>>20)
	}
	if out := mustMoat(t, dir, "run", "--", "echo", "alive"); strings.TrimSpace(out) != "alive" {
		t.Errorf("after the flood: %q", out)
	}
}

// TestDiskFromUnlimited: a sandbox whose writable layer is in its state
// dir (disk = "unlimited", or made before disk limits) has it moved into
// an image when it gets a limit, overlay whiteouts and owners included;
// going back to "unlimited" is refused.
func TestDiskFromUnlimited(t *testing.T) {
	dir := project(t, "disk-move")
	state := filepath.Join(moatHome, "state/sandboxes/disk-move")
	writeConfig(t, dir, "[sandbox]\ndisk = \"unlimited\"\n")
	mustMoat(t, dir, "run", "--", "sh", "-c", "echo mine > ~/kept && sudo sh -c 'echo sys > /usr/local/moat-e2e-moved && rm /etc/issue'")
	if _, err := os.Stat(filepath.Join(state, "disk.img")); err == nil {
		t.Fatal("an unlimited sandbox has a disk image")
	}
	if s := mustMoat(t, dir, "status", "--json"); strings.Contains(s, `"disk"`) {
		t.Errorf("status of an unlimited sandbox shows a disk: %s", s)
	}
	mustMoat(t, dir, "down")
	writeConfig(t, dir, "[sandbox]\ndisk = \"64MiB\"\n")
	mustMoat(t, dir, "up", "--reconfigure")
	out := mustMoat(t, dir, "run", "--", "sh", "-c", "cat ~/kept /usr/local/moat-e2e-moved; stat -c %U ~/kept; if test -e /etc/issue; then echo issue-back; fi")
	if want := "mine\nsys\nagent\n"; out != want {
		t.Errorf("after the move: %q, want %q (the deleted /etc/issue stays deleted)", out, want)
	}
	for _, d := range []string{"upper", "root", "work"} {
		if _, err := os.Stat(filepath.Join(state, d)); err == nil {
			t.Errorf("%s is still in the state dir after the move", d)
		}
	}
	writeConfig(t, dir, "[sandbox]\ndisk = \"unlimited\"\n")
	if r := moat(t, dir, nil, "up", "--reconfigure"); r.code == 0 || !strings.Contains(r.stderr, "sandbox.disk") {
		t.Errorf("back to unlimited: exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

// guestLayer is the running sandbox's writable layer as the host can read
// it: its disk image's mount, through the shim's /proc/PID/root (the
// mount is in the shim's namespace only); "" when no shim of it runs.
// Searches of the host's disk use it instead of disk.img, which scanTree
// skips: the image is sparse, as large as the sandbox's limit, and the
// guest's last writes may still be in its mount's page cache.
func guestLayer(state string) string {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	want := "__shim\x00" + filepath.Join(state, "shim.json") + "\x00"
	for _, f := range cmdlines {
		if b, err := os.ReadFile(f); err == nil && strings.HasSuffix(string(b), want) {
			return filepath.Join(filepath.Dir(f), "root", state, "disk")
		}
	}
	return ""
}
