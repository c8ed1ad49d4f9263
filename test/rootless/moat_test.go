package rootless

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/internal/lockdown"
)

// TestRootlessMoat runs the moat binary as an ordinary user, exactly as
// that user would type it, on the host set up as an administrator would
// (setupHost): doctor finds every prerequisite, a sandbox starts with its
// jailed gate process, what the agent writes in the workspace belongs to
// the user, the missing limits are said plainly, an explicit disk limit
// is refused, and destroy removes the state dir the namespace's ids own,
// leaving no process of the user or of its subordinate ids behind.
func TestRootlessMoat(t *testing.T) {
	h := setupHost(t)
	u := h.user
	bin := moatBinary(t, h.base)
	home := mkdirOwned(t, h.base, "home", u)
	ws := mkdirOwned(t, h.base, "ws", u)
	moat := func(t *testing.T, dir string, args ...string) (stdout, stderr string, code int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + home, "MOAT_HOME=" + home, "MOAT_RUNSC=" + h.runsc}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: []uint32{}}}
		cmd.WaitDelay = 5 * time.Second
		var so, se bytes.Buffer
		cmd.Stdout, cmd.Stderr = &so, &se
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("moat %v: %v", args, err)
		}
		return so.String(), se.String(), code
	}
	t.Cleanup(func() {
		moat(t, ws, "destroy", "--yes", "ws")
		waitNoProcs(t, h)
	})

	// Where cgroup v1 is mounted, as here, a user can write no cgroup.
	_, v2err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	noLimits := v2err != nil

	out, _, code := moat(t, ws, "doctor")
	if code != 0 {
		t.Fatalf("moat doctor as %s: exit %d\n%s", u.name, code, out)
	}
	for _, want := range []string{"ok   user namespaces", "ok   /etc/subuid", "ok   newuidmap", "ok   overlay in a user namespace", "note disk limits"} {
		if !strings.Contains(out, want) {
			t.Errorf("moat doctor's output lacks %q:\n%s", want, out)
		}
	}
	if noLimits && !strings.Contains(out, "note resource limits: none") {
		t.Errorf("moat doctor does not say there are no resource limits:\n%s", out)
	}

	stdout, stderr, code := moat(t, ws, "run", "--trust-project", "--", "sh", "-c", "echo hi > f && id -u")
	if code != 0 {
		t.Fatalf("moat run as %s: exit %d\nstdout: %s\nstderr: %s\ndaemon.log:\n%s", u.name, code, stdout, stderr, readLog(home))
	}
	if got := strings.TrimSpace(stdout); got != strconv.Itoa(int(u.uid)) {
		t.Errorf("the agent's uid in the guest = %q, want the user's %d", got, u.uid)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "f")); err != nil || string(b) != "hi\n" {
		t.Errorf("the agent's file: %q, %v", b, err)
	}
	if got := owner(t, filepath.Join(ws, "f")); got != u.uid {
		t.Errorf("the agent's file belongs to %s on the host, want the user %d", ownerString(got), u.uid)
	}
	// The first line after the sandbox's creation: the start's.
	lines := strings.Split(stderr, "\n")
	if strings.HasPrefix(lines[0], "moat: created sandbox") {
		lines = lines[1:]
	}
	if first := lines[0]; noLimits && !strings.Contains(first, "no resource limits") {
		t.Errorf("the start's first line %q does not say the sandbox has no resource limits", first)
	}

	// The gate process: jailed, as the user.
	gates := h.procs("__gate")
	if len(gates) != 1 {
		t.Fatalf("gate processes of the user: %v, want one", gates)
	}
	if err := lockdown.Verify(gates[0].pid, lockdown.Config{UID: int(u.uid), GID: int(u.gid)}); err != nil {
		t.Errorf("the rootless gate process is not jailed as the user: %v", err)
	}

	status, _, code := moat(t, ws, "status")
	if code != 0 || (noLimits && !strings.Contains(status, "limits:     none")) {
		t.Errorf("moat status: exit %d, does not say there are no limits:\n%s", code, status)
	}
	status, _, code = moat(t, ws, "status", "--json")
	if code != 0 || (noLimits && !strings.Contains(status, `"no_limits":"cgroup v1`)) {
		t.Errorf("moat status --json: exit %d, has no no_limits:\n%s", code, status)
	}

	// A killed keeper takes the gate process, the shim and runsc's
	// processes with it (parent-death signals, set again after each
	// change of ids); the next start clears runsc's stale state, which
	// belongs to a subordinate id, from inside the namespace.
	keepers := h.procs("__daemon")
	if len(keepers) != 1 {
		t.Fatalf("keeper processes of the user: %v, want one", keepers)
	}
	syscall.Kill(keepers[0].pid, syscall.SIGKILL)
	waitNoProcs(t, h)
	if so, se, code := moat(t, ws, "run", "--", "cat", "f"); code != 0 || so != "hi\n" {
		t.Fatalf("moat run after the keeper was killed: exit %d, stdout %q\nstderr: %s\ndaemon.log:\n%s", code, so, se, readLog(home))
	}

	// Destroy: the state dir holds the namespace's files (runsc's root,
	// the overlays' layers), which only a user namespace can remove.
	if _, se, code := moat(t, ws, "destroy", "--yes", "ws"); code != 0 {
		t.Fatalf("moat destroy: exit %d: %s", code, se)
	}
	if _, err := os.Stat(filepath.Join(home, "state", "sandboxes", "ws")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state dir is still there after destroy: %v", err)
	}
	waitNoProcs(t, h)

	// An explicit disk limit needs root: refused, with what to do.
	ws2 := mkdirOwned(t, h.base, "ws2", u)
	if err := os.WriteFile(filepath.Join(ws2, "moat.toml"), []byte("[sandbox]\ndisk = \"2GiB\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { moat(t, ws2, "destroy", "--yes", "ws2") })
	_, stderr, code = moat(t, ws2, "run", "--trust-project", "--", "true")
	if code == 0 || !strings.Contains(stderr, "disk limit needs root") || !strings.Contains(stderr, `disk = "unlimited"`) {
		t.Errorf("moat run with [sandbox] disk set, rootless: exit %d, want a refusal naming the fix; stderr:\n%s", code, stderr)
	}
}

// moatBinary is MOAT_BIN, else moat built for the test; copied where the
// test user can run it.
func moatBinary(t *testing.T, base string) string {
	t.Helper()
	dst := filepath.Join(base, "moat")
	if src := os.Getenv("MOAT_BIN"); src != "" {
		if err := copyFile(src, dst, 0o755); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	// Without cgo: the gate process's lockdown refuses a cgo binary.
	cmd := exec.Command("go", "build", "-o", dst, "moat.dev/moat/cmd/moat")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building moat (or set MOAT_BIN): %v\n%s", err, out)
	}
	return dst
}

// waitNoProcs waits until no process of the test user or its subordinate
// ids is left, for up to 10 s.
func waitNoProcs(t *testing.T, h *host) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := h.procs("")
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes of the test user left: %v", left)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readLog(home string) string {
	b, _ := os.ReadFile(filepath.Join(home, "state", "sandboxes", "ws", "daemon.log"))
	r, _ := os.ReadFile(filepath.Join(home, "state", "sandboxes", "ws", "runsc.log"))
	return string(b) + "\nrunsc.log:\n" + string(r)
}
