package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// rootProject is a project directory owned by root with the given mode.
func rootProject(t *testing.T, name string, mode os.FileMode) string {
	t.Helper()
	dir := project(t, name)
	if err := os.Chown(dir, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRootOwnedWorkspace: root without sudo (a CI job, a container) in a
// project root owns gets an agent that is root in the guest, so the
// project's files stay root's, and the claude preset's IS_SANDBOX lets
// Claude Code skip permissions as root.
func TestRootOwnedWorkspace(t *testing.T) {
	dir := rootProject(t, "rootws-e2e", 0o700)
	r := moat(t, dir, []string{"SUDO_UID=", "SUDO_GID="}, "run", "--", "sh", "-c", "echo hi > f; id -u; id -un; echo $HOME")
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if got := strings.Fields(r.stdout); strings.Join(got, " ") != "0 root /root" {
		t.Errorf("id -u, id -un, HOME = %q, want 0 root /root", got)
	}
	fi, err := os.Stat(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != 0 {
		t.Errorf("f is owned by %d:%d, want root's", st.Uid, st.Gid)
	}
}

// TestUnusableWorkspace: an agent that cannot enter the workspace gets one
// error that names it, its owner and mode, with exit 125.
func TestUnusableWorkspace(t *testing.T) {
	dir := rootProject(t, "noentry-e2e", 0o700)
	r := moat(t, dir, []string{"SUDO_UID=1234", "SUDO_GID=1234"}, "run", "--", "true")
	if r.code != 125 {
		t.Fatalf("exit %d, want 125\nstderr: %s", r.code, r.stderr)
	}
	for _, want := range []string{dir, "uid 1234", "root (uid 0)", "0700", "chmod o+rx"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q: %s", want, r.stderr)
		}
	}
}
