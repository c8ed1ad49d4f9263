package runtime

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"moat.dev/moat/internal/disk"
)

// TestRunscArgs: the flags every runsc call carries. Those that keep the
// sandbox's promises are checked by value: the guest's network is
// gVisor's netstack on tap0 only, no host unix socket is reachable, and
// the writable layer is moat's own overlay (kept across down/up).
func TestRunscArgs(t *testing.T) {
	args := RunscArgs("/s", "", false)
	for _, want := range []string{
		"--root=/s/runsc",
		"--platform=systrap",
		"--network=sandbox",
		"--host-uds=none",
		"--overlay2=none",
		"--ignore-cgroups",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("RunscArgs lacks %s: %q", want, args)
		}
	}
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			t.Errorf("RunscArgs has %q, not a global flag: the subcommand follows them", a)
		}
		if strings.HasPrefix(a, "--debug") {
			t.Errorf("RunscArgs without debug has %q", a)
		}
	}
	if got := RunscArgs("/s", PlatformKVM, false); !slices.Contains(got, "--platform=kvm") {
		t.Errorf("RunscArgs on kvm: %q", got)
	}
	// Debug logs stay in the sandbox's state dir, which destroy removes.
	dbg := RunscArgs("/s", "", true)
	if !slices.Contains(dbg, "--debug") || !slices.Contains(dbg, "--debug-log=/s/runsc-logs/") {
		t.Errorf("RunscArgs with debug: %q", dbg)
	}
	if !slices.Equal(dbg[:len(args)], args) {
		t.Errorf("debug changes the other flags:\n%q\n%q", dbg, args)
	}
}

// TestPlanRunscArgs: --ignore-cgroups goes only when moat made the
// sandbox's cgroup (runsc must then find it), and nothing else changes.
func TestPlanRunscArgs(t *testing.T) {
	p := &Plan{StateDir: "/s"}
	if got, want := p.runscArgs(false), RunscArgs("/s", "", false); !slices.Equal(got, want) {
		t.Errorf("without a cgroup: %q, want %q", got, want)
	}
	p.CgroupsPath = "/moat.slice/sb"
	got := p.runscArgs(false)
	want := slices.DeleteFunc(RunscArgs("/s", "", false), func(a string) bool { return a == "--ignore-cgroups" })
	if !slices.Equal(got, want) {
		t.Errorf("with a cgroup: %q, want %q", got, want)
	}
}

// TestPlanPaths: where the writable layer lives, in the disk image's
// mount or the state dir. These names are on disk: frozen.
func TestPlanPaths(t *testing.T) {
	for _, tt := range []struct {
		disk                bool
		upper, work, rootFS string
	}{
		{false, "/s/upper", "/s/work", "/s/root"},
		{true, "/s/" + disk.MountName + "/upper", "/s/" + disk.MountName + "/work", "/s/" + disk.MountName + "/root"},
	} {
		p := &Plan{StateDir: "/s", Disk: tt.disk}
		if p.upper() != tt.upper || p.work() != tt.work || p.rootDir() != tt.rootFS {
			t.Errorf("Disk %v: upper %s, work %s, root %s; want %s, %s, %s", tt.disk, p.upper(), p.work(), p.rootDir(), tt.upper, tt.work, tt.rootFS)
		}
		// Only mount points: never in the image, whose mount is one.
		if p.merged() != "/s/merged" {
			t.Errorf("Disk %v: merged %s", tt.disk, p.merged())
		}
	}
	if RunscRoot("/s") != "/s/runsc" || BundleDir("/s") != "/s/bundle" {
		t.Errorf("RunscRoot %s, BundleDir %s", RunscRoot("/s"), BundleDir("/s"))
	}
}

// TestPlanFile: the plan the daemon writes is what the shim reads, only
// its owner can read it, and Rootless is never taken from the file: the
// shim sets it from how it was started.
func TestPlanFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shim.json")
	p := &Plan{
		ID: "moat-sb", StateDir: "/s", Runsc: "/bin/runsc", Moat: "/bin/moat", GuestDir: "/s/guest",
		Hostname: "sb", Image: "host", Env: []string{"LANG=C.UTF-8"}, Workspace: "/src/sb",
		Shares: []Share{{Source: "/data", Target: "/data", RW: false}}, Debug: true,
		Cgroup: json.RawMessage(`{"path":"/sys/fs/cgroup/moat/sb"}`), CgroupsPath: "/moat/sb", PidsMax: 4096,
		Platform: PlatformKVM, DiskLimit: 10 << 30, DiskFrom: "/src/sb/moat.toml", Disk: true,
		Rootless: true,
	}
	if err := WritePlan(path, p); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("shim.json mode %v, want 0600", fi.Mode().Perm())
	}
	got, err := ReadPlan(path)
	if err != nil {
		t.Fatal(err)
	}
	want := *p
	want.Rootless = false
	// The cgroup is the resources package's JSON, kept as it is but for
	// the indentation.
	var cg bytes.Buffer
	if err := json.Compact(&cg, got.Cgroup); err != nil {
		t.Fatal(err)
	}
	got.Cgroup = cg.Bytes()
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("read back:\n got %+v\nwant %+v", *got, want)
	}

	os.WriteFile(path, []byte("{not json"), 0o600)
	if _, err := ReadPlan(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a broken plan: %v, want an error naming %s", err, path)
	}
	if _, err := ReadPlan(filepath.Join(t.TempDir(), "none.json")); err == nil {
		t.Error("a missing plan: no error")
	}
}
