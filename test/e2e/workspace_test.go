package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWorkspaceSymlinks is threat model 31. Symlinks in the workspace that point outside it (by
// absolute path, by ../, to a directory) resolve inside the guest's own filesystem, never to
// the host's files: reading through them finds nothing of the host's, writing through them
// creates nothing on the host. A workspace that is itself a symlink is the directory it
// resolves to, and one that resolves into moat's own state is refused.
func TestWorkspaceSymlinks(t *testing.T) {
	dir := project(t, "symlinks")
	base := filepath.Dir(dir)
	outside := filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	const canary = "moat-e2e-outside-canary-5d1c"
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte(canary+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"abs":     secret,
		"rel":     "../outside/secret.txt",
		"dirlink": outside,
		"etc":     "/etc/shadow", // the host's; the guest's own is hidden
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	r := moat(t, dir, nil, "run", "--", "sh", "-c",
		"for f in abs rel dirlink/secret.txt etc; do echo \"== $f\"; cat $f 2>&1; done; "+
			"ls dirlink/ 2>&1; echo planted > dirlink/planted 2>&1; mkdir -p dirlink 2>&1; echo done")
	t.Logf("guest:\n%s%s", r.stdout, r.stderr)
	if r.code != 0 || !strings.Contains(r.stdout, "done") {
		t.Fatalf("the guest run failed: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, canary) {
		t.Fatalf("the guest read the host's file outside the workspace through a symlink:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, "root:") {
		t.Fatalf("the guest read a shadow file through a symlink:\n%s", r.stdout)
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Fatal("a write through a workspace symlink created a file on the host outside the workspace")
	}
	// The links themselves are the workspace's and untouched.
	if got, _ := os.Readlink(filepath.Join(dir, "abs")); got != secret {
		t.Errorf("the workspace's symlink now points at %q", got)
	}

	// The workspace reached through a symlink is the directory it resolves to: the same
	// sandbox, the same path in the guest.
	via := filepath.Join(base, "via-link")
	if err := os.Symlink(dir, via); err != nil {
		t.Fatal(err)
	}
	if out := strings.TrimSpace(mustMoat(t, via, "run", "--", "pwd")); out != dir {
		t.Errorf("run from a symlink to the workspace: pwd in the guest is %q, want %q", out, dir)
	}
	if out := mustMoat(t, via, "list"); len(strings.Split(strings.TrimSpace(out), "\n")) != 2 {
		t.Errorf("a symlinked path to the workspace made another sandbox:\n%s", out)
	}

	// A workspace that resolves into moat's state (each sandbox's keys, its CA's key) is
	// refused, named as such, and nothing is created for it.
	intoState := filepath.Join(base, "state-link")
	if err := os.Symlink(filepath.Join(moatHome, "state", "sandboxes", "symlinks"), intoState); err != nil {
		t.Fatal(err)
	}
	r = moat(t, intoState, nil, "run", "--name", "into-state", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "moat's state") {
		t.Fatalf("a workspace inside moat's state: exit %d, stderr %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(moatHome, "state", "sandboxes", "into-state")); err == nil {
		t.Errorf("the refused workspace left a sandbox behind")
		moat(t, dir, nil, "destroy", "--yes", "into-state")
	}
}
