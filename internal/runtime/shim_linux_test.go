package runtime

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/disk"
	"moat.dev/moat/internal/guestspec"
)

// TestOCISpec: what the guest gets from the host. The workspace and
// read-write shares are the only writable binds from outside the
// sandbox's own layer; moat's binary and its guest dir are read-only;
// every bind from the host is nosuid and nodev; the guest joins the
// shim's network namespace (tap0's), never the host's.
func TestOCISpec(t *testing.T) {
	p := &Plan{
		Hostname: "sb", GuestDir: "/s/guest", Moat: "/usr/local/bin/moat", Workspace: "/src/sb/",
		Env:         []string{"LANG=C.UTF-8", "PATH=/image/bin"},
		Shares:      []Share{{Source: "/data/ro", Target: "/data/ro/"}, {Source: "/data/rw", Target: "/mnt/rw", RW: true}},
		CgroupsPath: "/moat/sb",
	}
	s := p.ociSpec("/s/merged/root", []bindMount{{Source: "/s/merged/usr", Target: "/usr", RW: true}})

	if s.Root.Path != "/s/merged/root" || s.Hostname != "sb" || s.Linux.CgroupsPath != "/moat/sb" {
		t.Errorf("root %s, hostname %s, cgroups path %s", s.Root.Path, s.Hostname, s.Linux.CgroupsPath)
	}
	if !slices.Equal(s.Process.Args, []string{guestspec.Binary, "__init"}) || s.Process.User.UID != 0 {
		t.Errorf("process %q as uid %d, want moat's guest init as root of the guest", s.Process.Args, s.Process.User.UID)
	}
	// The image's environment follows the default PATH, so it wins.
	if len(s.Process.Env) != 3 || !strings.HasPrefix(s.Process.Env[0], "PATH=") || s.Process.Env[2] != "PATH=/image/bin" {
		t.Errorf("env %q", s.Process.Env)
	}
	if len(s.Process.Rlimits) != 0 {
		t.Errorf("rlimits without PidsMax: %v", s.Process.Rlimits)
	}

	binds := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		if m.Type == "bind" {
			binds[m.Destination] = m
		}
	}
	for _, tt := range []struct {
		dst, src string
		rw, host bool // host: a path of the host, not of the sandbox's own layer
	}{
		{"/usr", "/s/merged/usr", true, false},
		{guestspec.Dir, "/s/guest", false, true},
		{guestspec.Binary, "/usr/local/bin/moat", false, true},
		{"/src/sb", "/src/sb/", true, true}, // at its own path, cleaned
		{"/data/ro", "/data/ro", false, true},
		{"/mnt/rw", "/data/rw", true, true},
	} {
		m, ok := binds[tt.dst]
		if !ok {
			t.Errorf("no bind on %s; binds: %v", tt.dst, binds)
			continue
		}
		delete(binds, tt.dst)
		if m.Source != tt.src || slices.Contains(m.Options, "rw") != tt.rw || slices.Contains(m.Options, "ro") == tt.rw {
			t.Errorf("bind %s: %+v, want source %s rw %v", tt.dst, m, tt.src, tt.rw)
		}
		if tt.host && (!slices.Contains(m.Options, "nosuid") || !slices.Contains(m.Options, "nodev")) {
			t.Errorf("bind %s from the host: %v, want nosuid and nodev", tt.dst, m.Options)
		}
	}
	if len(binds) != 0 {
		t.Errorf("binds the plan did not ask for: %v", binds)
	}

	var netns *specs.LinuxNamespace
	for i, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			netns = &s.Linux.Namespaces[i]
		}
	}
	if netns == nil || netns.Path != "/proc/self/ns/net" {
		t.Errorf("network namespace %+v, want the shim's own (/proc/self/ns/net)", netns)
	}
	if slices.ContainsFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.UserNamespace }) {
		t.Error("a user namespace in the spec: runsc's own would be nested in the shim's")
	}

	p.PidsMax = 512
	s = p.ociSpec("/r", nil)
	want := []specs.POSIXRlimit{{Type: "RLIMIT_NPROC", Hard: 512, Soft: 512}}
	if !reflect.DeepEqual(s.Process.Rlimits, want) {
		t.Errorf("rlimits with PidsMax 512: %v, want %v", s.Process.Rlimits, want)
	}
	p.Workspace = ""
	s = p.ociSpec("/r", nil)
	for _, m := range s.Mounts {
		if m.Destination == "/src/sb" {
			t.Errorf("a plan without a workspace binds one: %+v", m)
		}
	}
}

// TestSandboxExit: how the shim reports the sandbox's end to the daemon.
func TestSandboxExit(t *testing.T) {
	if err := sandboxExit(unix.WaitStatus(0)); err != nil {
		t.Errorf("exit 0: %v", err)
	}
	if err := sandboxExit(unix.WaitStatus(3 << 8)); err == nil || !strings.Contains(err.Error(), "status 3") {
		t.Errorf("exit 3: %v", err)
	}
	if err := sandboxExit(unix.WaitStatus(unix.SIGKILL)); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("SIGKILL: %v", err)
	}
}

// TestPrepareDiskWithoutImage: the checks PrepareDisk makes before any
// image exists or is made, as this user is (root or not); the making
// itself needs mkfs and a loop device (internal/disk, integration).
func TestPrepareDiskWithoutImage(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, disk.ImageName)
	if os.Geteuid() == 0 {
		p := &Plan{StateDir: dir, DiskUnlimited: true, Disk: true}
		if err := PrepareDisk(p, nil); err != nil || p.Disk {
			t.Errorf("unlimited, no image: %v, Disk %v; want no image used", err, p.Disk)
		}
		os.WriteFile(img, nil, 0o600)
		p = &Plan{StateDir: dir, DiskUnlimited: true, DiskFrom: "/src/moat.toml"}
		if err := PrepareDisk(p, nil); err == nil || !strings.Contains(err.Error(), "/src/moat.toml") || !strings.Contains(err.Error(), img) {
			t.Errorf("unlimited with an image: %v, want an error naming the file that set it and the image", err)
		}
		return
	}
	// Without root: no image, whatever the plan asks, and a limit the
	// user set is refused, naming where.
	p := &Plan{StateDir: dir, Disk: true}
	if err := PrepareDisk(p, nil); err != nil || p.Disk {
		t.Errorf("rootless, no limit: %v, Disk %v", err, p.Disk)
	}
	p = &Plan{StateDir: dir, DiskLimit: 1 << 30, DiskFrom: "/src/moat.toml"}
	if err := PrepareDisk(p, nil); err == nil || !strings.Contains(err.Error(), "/src/moat.toml") {
		t.Errorf("rootless with a limit: %v, want an error naming /src/moat.toml", err)
	}
	os.WriteFile(img, nil, 0o600)
	if err := PrepareDisk(&Plan{StateDir: dir}, nil); err == nil || !strings.Contains(err.Error(), "sudo") {
		t.Errorf("rootless with an image: %v, want an error saying to use sudo", err)
	}
}

// TestHideSecrets: the host's files that hold secrets are whiteouts in
// the guest's /etc upper layer (the guest sees no such file), except
// where the guest wrote its own, which is kept.
func TestHideSecrets(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a whiteout is a 0/0 character device, which only root can make; run as root")
	}
	var present []string
	for _, n := range hiddenEtc {
		if _, err := os.Lstat(filepath.Join("/etc", n)); err == nil {
			present = append(present, n)
		}
	}
	if len(present) == 0 {
		t.Skip("this host has none of the files hideSecrets hides (/etc/shadow, ...)")
	}
	upper := t.TempDir()
	// The guest changed the first one: its file stays.
	mine := filepath.Join(upper, present[0])
	os.MkdirAll(filepath.Dir(mine), 0o755)
	if err := os.WriteFile(mine, []byte("the guest's own\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a second start finds the whiteouts in place
		if err := hideSecrets(upper); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(mine); err != nil || string(b) != "the guest's own\n" {
		t.Errorf("the guest's own %s: %q, %v", present[0], b, err)
	}
	for _, n := range present[1:] {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(upper, n), &st); err != nil {
			t.Errorf("/etc/%s is not hidden: %v", n, err)
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("/etc/%s: mode %o rdev %d, want a 0/0 character device (an overlay whiteout)", n, st.Mode, st.Rdev)
		}
	}
	if len(present) < 2 {
		t.Logf("only %s on this host: the whiteouts themselves were not checked", present[0])
	}
}

// TestHeirSeesTheDaemonGo: a shim that removes its daemon's groups learns
// of the daemon's death in either of two independent ways (its pidfd, the
// hang-up of its socket), and not otherwise; once it has, no guest starts.
// The daemon here is a child process of the test; the shim's kill of its
// namespace is a no-op outside a PID namespace of its own.
func TestHeirSeesTheDaemonGo(t *testing.T) {
	for _, tt := range []struct {
		name string
		end  func(daemon *exec.Cmd, sock *os.File) // how the daemon goes; nil: it does not
	}{
		{name: "daemon alive"},
		{name: "daemon killed", end: func(d *exec.Cmd, _ *os.File) { d.Process.Kill(); d.Wait() }},
		// Its pidfd would say nothing if another process held it up.
		{name: "socket hung up", end: func(_ *exec.Cmd, sock *os.File) { sock.Close() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			daemon := exec.Command("sleep", "60")
			if err := daemon.Start(); err != nil {
				t.Fatal(err)
			}
			pidfd, err := unix.PidfdOpen(daemon.Process.Pid, 0)
			if err != nil {
				daemon.Process.Kill()
				daemon.Wait()
				t.Skipf("no pidfd_open here (Linux 5.3): %v", err)
			}
			pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			theirs, ours := os.NewFile(uintptr(pair[0]), "daemon"), os.NewFile(uintptr(pair[1]), "shim")
			h := newHeir(pidfd, pair[1])
			// The heir's watch ends before its fds are closed: it acts on
			// them when it fires.
			defer func() {
				daemon.Process.Kill()
				daemon.Wait()
				select {
				case <-h.done():
				case <-time.After(10 * time.Second):
					t.Fatal("the heir did not see its daemon killed within 10 s")
				}
				unix.Close(pidfd)
				theirs.Close()
				ours.Close()
			}()
			if h.isGone() {
				t.Fatal("gone before the daemon went")
			}
			if tt.end != nil {
				tt.end(daemon, theirs)
			}
			wait := 300 * time.Millisecond
			if tt.end != nil {
				wait = 10 * time.Second
			}
			select {
			case <-h.done():
				if tt.end == nil {
					t.Fatal("the heir says the daemon is gone; it is alive")
				}
			case <-time.After(wait):
				if tt.end != nil {
					t.Fatalf("the heir did not see the daemon go within %v", wait)
				}
				return
			}
			if !h.isGone() {
				t.Error("isGone is false after done closed")
			}
			guest := exec.Command("true")
			if err := h.start(guest); !errors.Is(err, errDaemonGone) || guest.Process != nil {
				t.Errorf("a guest started after the daemon went: %v", err)
			}
		})
	}
}
