//go:build linux

// Package rootless proves the recipe for running moat's sandbox without
// root, end to end on this host: an unprivileged user enters a user
// namespace mapped through newuidmap/newgidmap (internal/userns), mounts
// an overlay, creates tap0, passes its fd out to the unprivileged parent
// and runs the real runsc with the sandbox network stack; what the guest
// writes in the workspace must belong to the user.
//
// The test needs root only to set the host up as an administrator would:
// install uidmap, create a user with subordinate ranges, make
// /dev/net/tun usable by users. Everything after runs as that user.
package rootless

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/internal/userns"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(roleMain(role))
	}
	os.Exit(m.Run())
}

// testUser is the unprivileged user the test creates.
type testUser struct {
	name     string
	uid, gid uint32
	subUID   userns.Range // its first /etc/subuid range
}

func TestRootlessSandbox(t *testing.T) {
	h := setupHost(t)
	u := h.user
	const absent = ^uint32(0)
	tests := []struct {
		layout     string // "" for userns.RootIsUser, "keep" for KeepIDs
		rootFile   uint32 // host owner of the file the guest's root writes
		guestFile  uint32 // ... and of the one guest uid u.uid writes
		stateOwner uint32 // of what the child and runsc make in the state dir
	}{
		// The namespace's root is the user: the guest's root writes the
		// user's files. The workspace, the user's, is root's in the
		// guest, so guest uid u.uid (moat's agent today) cannot write it.
		{"", u.uid, absent, u.uid},
		// The user keeps its uid: guest uid u.uid owns the workspace and
		// writes the user's files; the guest's root writes files of the
		// first subordinate uid.
		// What the shim and runsc make in the state dir (runsc's root,
		// the bundle, the overlays' dirs) is the first subordinate uid's:
		// the daemon, as the user, cannot remove it.
		{"keep", u.subUID.Start, u.uid, u.subUID.Start},
	}
	for _, tt := range tests {
		name := cmp.Or(tt.layout, "root-is-user")
		t.Run(name, func(t *testing.T) {
			state, ws := mkdirOwned(t, h.base, name+"-state", u), mkdirOwned(t, h.base, name+"-ws", u)
			rep, stderr := h.run(t, "rootless", state, ws, tt.layout != "")
			t.Logf("%+v", rep)
			if os.Getenv(probeEnv) != "" {
				t.Logf("guest stderr:\n%s", stderr)
			}
			if !strings.Contains(rep.Frame, payload) {
				t.Errorf("frame read from the TAP fd = %q, want the guest's %q", rep.Frame, payload)
			}
			for _, f := range []struct {
				file string
				want uint32
			}{{"as-root", tt.rootFile}, {"as-guest-user", tt.guestFile}} {
				if got := owner(t, filepath.Join(ws, f.file)); got != f.want {
					t.Errorf("%s: host owner %s, want %s (guest stderr: %s)", f.file, ownerString(got), ownerString(f.want), stderr)
				}
			}
			for _, d := range []string{"runsc", "bundle", "root", "upper", "work", "merged"} {
				if got := owner(t, filepath.Join(state, d)); got != tt.stateOwner {
					t.Errorf("state dir's %s: host owner %s, want %s", d, ownerString(got), ownerString(tt.stateOwner))
				}
			}
		})
	}
}

// TestRootlessParentDeath kills the unprivileged parent (the daemon's
// part) with SIGKILL while the guest runs: the child's parent-death
// signal, which userns.Wait set again after exec and setuid cleared it,
// must take the child, and with it (PID 1 of the run's PID namespace)
// runsc's sandbox and gofer.
func TestRootlessParentDeath(t *testing.T) {
	h := setupHost(t)
	u := h.user
	for _, layout := range []string{"root-is-user", "keep"} {
		t.Run(layout, func(t *testing.T) {
			state, ws := mkdirOwned(t, h.base, layout+"-state", u), mkdirOwned(t, h.base, layout+"-ws", u)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := h.command(ctx, "rootless", state, ws, layout == "keep")
			cmd.Env = append(cmd.Env, probeEnv+"=sleep 100")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// The guest runs once runsc's sandbox (runsc-sandbox boot) does.
			deadline := time.Now().Add(30 * time.Second)
			for len(h.procs("boot")) == 0 {
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatalf("runsc's sandbox did not start within 30 s; parent's stderr:\n%s", stderr.String())
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("running: %v", h.procs(""))
			cmd.Process.Kill()
			cmd.Wait()
			deadline = time.Now().Add(10 * time.Second)
			for {
				left := h.procs("")
				if len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					for _, p := range left {
						syscall.Kill(p.pid, syscall.SIGKILL)
					}
					t.Fatalf("10 s after the parent's SIGKILL these are still running: %v", left)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

type proc struct {
	pid  int
	uid  uint32
	args string
}

func (p proc) String() string { return fmt.Sprintf("%d(uid %d: %.60s)", p.pid, p.uid, p.args) }

// procs are the processes running as the test user or one of its
// subordinate uids whose command line contains word ("": all).
func (h *host) procs(word string) []proc {
	dirs, _ := os.ReadDir("/proc")
	var out []proc
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+d.Name(), &st) != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + d.Name() + "/status")
		uid := uint32(^uint32(0))
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				n, _ := strconv.ParseUint(f[1], 10, 32)
				uid = uint32(n)
			}
		}
		sub := h.user.subUID
		if uid != h.user.uid && (uid < sub.Start || uid-sub.Start >= sub.Count) {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		args := strings.ReplaceAll(string(cmdline), "\x00", " ")
		if word == "" || strings.Contains(args, word) {
			out = append(out, proc{pid, uid, args})
		}
	}
	return out
}

// TestRootlessCheck runs userns.Check as the test user on the host set up
// as the recipe needs: every prerequisite must be met. (Each one's
// failure message is in internal/userns' unit tests and doc.)
func TestRootlessCheck(t *testing.T) {
	h := setupHost(t)
	cmd := exec.Command(h.self, "-test.run=^$")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", roleEnv + "=check"}
	cmd.Dir = h.base
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: h.user.uid, Gid: h.user.gid, Groups: []uint32{}}}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("check role: %v", err)
	}
	var got []userns.Prereq
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("parsing %q: %v", out, err)
	}
	if len(got) != 7 {
		t.Errorf("Check returned %d prerequisites, want the 7 of its doc: %+v", len(got), got)
	}
	for _, p := range got {
		if !p.OK {
			t.Errorf("%s: %s (fix: %s)", p.Name, p.Detail, p.Fix)
		} else {
			t.Logf("%s: %s", p.Name, p.Detail)
		}
	}
}

func ownerString(uid uint32) string {
	if uid == ^uint32(0) {
		return "none (no file)"
	}
	return "uid " + strconv.FormatUint(uint64(uid), 10)
}

// TestRootlessStartTime compares the time to a running guest, rootless
// and as root, over ROOTLESS_RUNS runs of each.
func TestRootlessStartTime(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("ROOTLESS_RUNS"))
	if runs <= 0 {
		t.Skip("a measurement, not a check: set ROOTLESS_RUNS=5 to compare rootless and root start times")
	}
	runs = min(runs, 20)
	h := setupHost(t)
	var rootless, root []report
	for i := range runs {
		for _, mode := range []string{"rootless", "root"} {
			owner := h.user
			if mode == "root" {
				owner = nil
			}
			state := mkdirOwned(t, h.base, fmt.Sprintf("%s-state-%d", mode, i), owner)
			ws := mkdirOwned(t, h.base, fmt.Sprintf("%s-ws-%d", mode, i), owner)
			rep, _ := h.run(t, mode, state, ws, false)
			if mode == "root" {
				root = append(root, rep)
			} else {
				rootless = append(rootless, rep)
			}
		}
	}
	for _, m := range []struct {
		name string
		f    func(report) float64
	}{
		{"namespaces ready (Start returned)", func(r report) float64 { return r.MappedMS }},
		{"tap fd received", func(r report) float64 { return r.TapMS }},
		{"guest's datagram read", func(r report) float64 { return r.FrameMS }},
		{"guest exited", func(r report) float64 { return r.ExitMS }},
	} {
		a, b := median(rootless, m.f), median(root, m.f)
		t.Logf("%-34s rootless median %7.1f ms, root median %7.1f ms, ratio %.2f", m.name, a, b, a/b)
	}
}

func median(rs []report, f func(report) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	sort.Float64s(v)
	return v[len(v)/2]
}

type host struct {
	user  *testUser
	layer string // a lower layer owned by the user
	base  string // world-traversable dir holding the test binary and the runs' dirs
	self  string // the test binary, copied where the user can run it
	runsc string
}

// setupHost does as root what an administrator does once: uidmap
// installed, a user with subordinate ranges, /dev/net/tun usable by
// users. All of it is undone when the test ends.
func setupHost(t *testing.T) *host {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to create a test user and install uidmap; run as root: go test -count=1 ./test/rootless")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("this host forbids user namespaces (user.max_user_namespaces = 0)")
	}
	runsc := os.Getenv("MOAT_RUNSC")
	if runsc == "" {
		runsc, _ = filepath.Abs("../../bin/runsc")
	}
	if _, err := os.Stat(runsc); err != nil {
		t.Fatalf("runsc not found at %s (set MOAT_RUNSC, or build it with scripts/setup.sh): %v", runsc, err)
	}
	ensureUidmap(t)
	ensureTun(t)
	u := createUser(t)

	base, err := os.MkdirTemp("", "moat-rootless-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(base, "rootless.test")
	if err := copyFile(exe, self, 0o755); err != nil {
		t.Fatal(err)
	}
	// A lower layer as the user would extract an image layer: its files
	// are the user's, so root's inside the namespace.
	layer := mkdirOwned(t, base, "layer", u)
	if err := os.Mkdir(filepath.Join(layer, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer, "d", "b"), []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(layer, "d"), filepath.Join(layer, "d", "b")} {
		if err := os.Chown(p, int(u.uid), int(u.gid)); err != nil {
			t.Fatal(err)
		}
	}
	return &host{user: u, base: base, self: self, runsc: runsc, layer: layer}
}

// run runs the parent role, as the test user when asUser, and returns its
// report. Every process of the run is gone when it returns: the parent
// exited or was killed, and its child (PID 1 of the run's PID namespace,
// with a parent-death signal) took runsc's processes with it.
func (h *host) run(t *testing.T, mode, state, ws string, keepIDs bool) (report, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := h.command(ctx, mode, state, ws, keepIDs)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		logs := runscLogs(state)
		t.Fatalf("%s run: %v\nstderr:\n%s%s", mode, err, stderr.String(), logs)
	}
	var rep report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%s run: parsing its report %q: %v\nstderr:\n%s", mode, stdout.String(), err, stderr.String())
	}
	return rep, stderr.String()
}

// command is the parent role's command for a run.
func (h *host) command(ctx context.Context, mode, state, ws string, keepIDs bool) *exec.Cmd {
	cmd := exec.CommandContext(ctx, h.self, "-test.run=^$")
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		roleEnv + "=parent", modeEnv + "=" + mode,
		stateEnv + "=" + state, wsEnv + "=" + ws, runscEnv + "=" + h.runsc,
		uidEnv + "=" + strconv.Itoa(int(h.user.uid)),
		layerEnv + "=" + h.layer,
	}
	if os.Getenv(debugEnv) != "" {
		cmd.Env = append(cmd.Env, debugEnv+"=1")
	}
	if keepIDs {
		cmd.Env = append(cmd.Env, keepEnv+"=1")
	}
	for _, k := range []string{dropEnv, extraEnv, probeEnv} {
		if v := os.Getenv(k); v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Dir = h.base
	if mode == "rootless" {
		// The user's own ids and no supplementary group: as a login of
		// that user, not as root with a different uid.
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: h.user.uid, Gid: h.user.gid, Groups: []uint32{}}}
	}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// runscLogs are runsc's debug logs of a failed run (ROOTLESS_DEBUG=1).
func runscLogs(state string) string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(state, "runsc-logs", "*"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		if len(data) > 6000 {
			data = data[len(data)-6000:]
		}
		fmt.Fprintf(&b, "\n--- %s (tail)\n%s", f, data)
	}
	return b.String()
}

// ensureUidmap installs Debian's uidmap (newuidmap, newgidmap) when it is
// missing, as an administrator would.
func ensureUidmap(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("newuidmap"); err == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	apt := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return cmd.CombinedOutput()
	}
	if _, err := apt("install", "-y", "-q", "uidmap"); err == nil {
		return
	}
	// A fresh machine may not have the package lists yet.
	if out, err := apt("update", "-q"); err != nil {
		t.Fatalf("apt-get update (to install uidmap): %v\n%s", err, out)
	}
	if out, err := apt("install", "-y", "-q", "uidmap"); err != nil {
		t.Fatalf("installing uidmap (apt-get install uidmap): %v\n%s", err, out)
	}
}

// ensureTun makes /dev/net/tun usable by users for the test, as udev does
// on Debian (0666), and puts its mode back after.
func ensureTun(t *testing.T) {
	t.Helper()
	fi, err := os.Stat("/dev/net/tun")
	if err != nil {
		t.Fatalf("/dev/net/tun: %v (modprobe tun)", err)
	}
	mode := fi.Mode().Perm()
	if mode&0o006 == 0o006 {
		return
	}
	t.Logf("/dev/net/tun is %04o: making it 0666 for the test, as udev does on Debian", mode)
	if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod("/dev/net/tun", mode) })
}

const userPrefix = "moatrl"

// createUser adds an unprivileged user with a subordinate range of 65536
// uids and gids (useradd gives one from /etc/login.defs on Debian; else
// usermod adds one past every existing range), and removes it, its group
// and its ranges when the test ends.
func createUser(t *testing.T) *testUser {
	t.Helper()
	removeStaleUsers(t)
	name := fmt.Sprintf("%s%d", userPrefix, os.Getpid()%1000000)
	if out, err := exec.Command("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { deleteUser(t, name) })
	if r := subRanges(t, userns.SubUIDFile, name); len(r) == 0 {
		start := nextFreeSubID(t)
		spec := fmt.Sprintf("%d-%d", start, start+65535)
		if out, err := exec.Command("usermod", "--add-subuids", spec, "--add-subgids", spec, name).CombinedOutput(); err != nil {
			t.Fatalf("usermod --add-subuids %s %s: %v: %s", spec, name, err, out)
		}
	}
	pu, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(pu.Uid)
	gid, _ := strconv.Atoi(pu.Gid)
	sub := subRanges(t, userns.SubUIDFile, name)
	if len(sub) == 0 || len(subRanges(t, userns.SubGIDFile, name)) == 0 {
		t.Fatalf("user %s has no subordinate ranges after useradd and usermod", name)
	}
	t.Logf("user %s: uid %d gid %d, subordinate uids %d+%d", name, uid, gid, sub[0].Start, sub[0].Count)
	return &testUser{name: name, uid: uint32(uid), gid: uint32(gid), subUID: sub[0]}
}

// deleteUser removes the user; userdel also removes its group and its
// subordinate ranges, which is checked.
func deleteUser(t *testing.T, name string) {
	if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
		t.Errorf("userdel %s: %v: %s", name, err, out)
		return
	}
	for _, f := range []string{userns.SubUIDFile, userns.SubGIDFile} {
		if r := subRanges(t, f, name); len(r) > 0 {
			t.Errorf("userdel %s left its ranges in %s", name, f)
		}
	}
}

// removeStaleUsers deletes users a killed run of this test left behind
// (userdel refuses one that still has processes).
func removeStaleUsers(t *testing.T) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var stale []string
	for sc.Scan() {
		name, _, _ := strings.Cut(sc.Text(), ":")
		if strings.HasPrefix(name, userPrefix) {
			stale = append(stale, name)
		}
	}
	for _, name := range stale {
		t.Logf("removing user %s left by an earlier run", name)
		deleteUser(t, name)
	}
}

func subRanges(t *testing.T, file, name string) []userns.Range {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pu, err := user.Lookup(name)
	uid := uint64(1<<32 - 1) // a deleted user: match by name only
	if err == nil {
		uid, _ = strconv.ParseUint(pu.Uid, 10, 32)
	}
	r, err := userns.ParseSubIDs(f, file, name, uint32(uid))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// nextFreeSubID is past every range in /etc/subuid and /etc/subgid, and at
// least 100000 (Debian's SUB_UID_MIN).
func nextFreeSubID(t *testing.T) uint32 {
	next := uint64(100000)
	for _, file := range []string{userns.SubUIDFile, userns.SubGIDFile} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Split(line, ":")
			if len(f) != 3 {
				continue
			}
			s, _ := strconv.ParseUint(f[1], 10, 32)
			c, _ := strconv.ParseUint(f[2], 10, 32)
			next = max(next, s+c)
		}
	}
	return uint32(next)
}

func mkdirOwned(t *testing.T, base, name string, u *testUser) string {
	t.Helper()
	d := filepath.Join(base, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if u != nil {
		if err := os.Chown(d, int(u.uid), int(u.gid)); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// owner is path's owner, or ^0 when there is no such file.
func owner(t *testing.T, path string) uint32 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); errors.Is(err, fs.ErrNotExist) {
		return ^uint32(0)
	} else if err != nil {
		t.Fatalf("the guest's file: %v", err)
	}
	return st.Uid
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
