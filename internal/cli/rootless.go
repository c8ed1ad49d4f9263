package cli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/roles"
	"moat.dev/moat/internal/userns"
)

// Rootless moat: an ordinary user runs sandboxes in user namespaces that
// map their subordinate ids (internal/userns). What the shim and runsc
// leave in a sandbox's state dir then belongs to those ids, which the
// user can remove only from inside such a namespace: roles.RemoveRole.

// rootless reports whether moat runs without root.
func rootless() bool { return os.Geteuid() != 0 }

// removeAll is os.RemoveAll, which rootless retries in a user namespace
// where subordinate ids own what is left.
func (e *env) removeAll(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil || !rootless() {
		return err
	}
	cfg, cerr := userns.Current(userns.KeepIDs)
	if cerr != nil {
		return fmt.Errorf("%v (what is left belongs to your subordinate ids: %v)", err, cerr)
	}
	exe, err := sandboxExe()
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(exe, roles.RemoveRole, dir)
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cfg.Start(cmd); err != nil {
		return fmt.Errorf("removing %s in a user namespace: %w", dir, err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("removing %s in a user namespace: %v: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// rootlessChecks are moat doctor's checks for running without root, in
// place of "running as root".
func rootlessChecks() []check {
	var out []check
	for _, p := range userns.Check(userns.KeepIDs) {
		out = append(out, check{name: p.Name + " (for moat without sudo)", ok: func() (bool, string) { return p.OK, p.Detail }, fix: p.Fix})
	}
	return out
}

// note is one thing moat doctor says about a sandbox without root.
type note struct{ name, text string }

// rootlessNotes are moat doctor's notes on what a sandbox lacks without
// root, in place of the disk image checks.
func rootlessNotes() []note {
	limits := "applied through this user's cgroup"
	if why := resources.NoLimits(); why != "" {
		limits = "none: " + why
	}
	return []note{
		{"resource limits", limits},
		{"disk limits", "none without sudo: [sandbox] disk needs root (an ext4 image on a loop device); leave it unset or set disk = \"unlimited\""},
		{"host image", "the host's /usr, /etc, ... belong to root, whom a user namespace cannot map: the guest reads and runs them but cannot change them (no sudo, no apt-get install inside)"},
	}
}
