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
	"moat.dev/moat/internal/statefs"
	"moat.dev/moat/internal/userns"
)

// Rootless moat: an ordinary user runs sandboxes in user namespaces that
// map their subordinate ids (internal/userns). What the shim and runsc
// leave in a sandbox's state dir then belongs to those ids, which the
// user can remove and copy only from inside such a namespace:
// roles.RemoveRole, statefs.Role.

// rootless reports whether moat runs without root.
func rootless() bool { return os.Geteuid() != 0 }

// removeAll is os.RemoveAll, which rootless retries in a user namespace
// where subordinate ids own what is left.
func (e *env) removeAll(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil || !rootless() {
		return err
	}
	if _, err := inUserns(roles.RemoveRole, dir); err != nil {
		return fmt.Errorf("removing %s in a user namespace (what is left belongs to your subordinate ids): %w", dir, err)
	}
	return nil
}

// copyTree is statefs.Copy; rootless, in a user namespace, where
// subordinate ids own a sandbox's layer.
func copyTree(src, dst string) error {
	if !rootless() {
		return statefs.Copy(src, dst)
	}
	if _, err := inUserns(statefs.CopyArgs(src, dst)...); err != nil {
		return fmt.Errorf("copying %s in a user namespace: %w", src, err)
	}
	return nil
}

// flushTree is statefs.Flush; rootless, in a user namespace, which can
// open every file of a copied layer.
func flushTree(root string) (int64, error) {
	if !rootless() {
		return statefs.Flush(root)
	}
	out, err := inUserns(statefs.FlushArgs(root)...)
	if err != nil {
		return 0, fmt.Errorf("flushing %s in a user namespace: %w", root, err)
	}
	return statefs.ParseFlushed(out)
}

// swapState is statefs.Swap of restoreItems; rootless, in a user
// namespace, where a directory of the layer may be moved.
func swapState(dir, stage, old string) error {
	if !rootless() {
		return statefs.Swap(dir, stage, old, restoreItems)
	}
	if _, err := inUserns(statefs.SwapArgs(dir, stage, old, restoreItems)...); err != nil {
		return fmt.Errorf("in a user namespace: %w", err)
	}
	return nil
}

// inUserns runs moat-sandbox with args (a role first) as root of a user
// namespace that maps the user's own ids and subordinate ranges, waits
// for it, and returns what it printed.
func inUserns(args ...string) (string, error) {
	cfg, err := userns.Current(userns.KeepIDs)
	if err != nil {
		return "", err
	}
	exe, err := sandboxExe()
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cfg.Start(cmd); err != nil {
		return "", err
	}
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
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
