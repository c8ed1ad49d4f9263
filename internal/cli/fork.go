package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/disk"
	"moat.dev/moat/internal/keys"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
)

// forkResult is `moat fork --json`'s object. Fields are only added.
type forkResult struct {
	Schema int    `json:"schema"`
	Name   string `json:"name"`
	Parent string `json:"parent"`
	// At is when the parent's state was taken: the child has the parent's
	// files and processes as they were then, nothing later.
	At time.Time `json:"at"`
	// Processes: the child has the parent's processes (it was running or
	// suspended); false for a stopped parent, whose child boots afresh.
	Processes bool `json:"processes"`
	// ParentResumed: the parent was running, was suspended for the copy
	// and resumed after it.
	ParentResumed bool `json:"parent_resumed,omitempty"`
	Reflinked     bool `json:"reflinked"`
}

func newForkCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "fork NAME NEW",
		Short: "Make a new sandbox from another's live state: its files and processes",
		Long: `Make a new, independent sandbox NEW from the state sandbox NAME is in now:
its writable layer is copied (a reflink where the filesystem has them, else a
sparse copy) and, when NAME is running or suspended, its processes and their
memory too: NEW's first start restores them. NEW has the state of the moment
of the fork; what NAME does afterwards is not in NEW, nor the other way round.

A running NAME is suspended for the copy and resumed after it: its processes
keep running, its attached sessions are ended (as by moat suspend), and its
connections to the outside are reset.

NEW gets its own SSH keys, its own CA and its own secret placeholders; secret
values are never copied (NEW's gate reads them on the host when it starts,
and NAME's placeholders are worthless in NEW). NEW has NAME's configuration
and its runtime network rules; not its forwards. Both share the workspace
directory on the host.`,
		Example: `  moat fork api api-try2
  moat fork api api-try2 --json`,
		Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			res, err := e.fork(args[0], args[1])
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(c.OutOrStdout()).Encode(res)
			}
			fmt.Fprintln(c.OutOrStdout(), res.Name)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// fork makes child from parent's state. A running parent is suspended
// for the copy and resumed after it: its writable layer must not change
// while it is copied, and the checkpoint image is what the child's
// processes are restored from.
func (e *env) fork(parent, child string) (*forkResult, error) {
	pdir, prec, err := e.byName(parent)
	if err != nil {
		return nil, err
	}
	if prec.Runtime == runtimeDocker {
		return nil, codef(ExitUsage, "sandbox %q runs on Docker, which moat cannot checkpoint; fork needs a gVisor sandbox", parent)
	}
	if err := config.ValidName(child); err != nil {
		return nil, withCode(ExitUsage, err)
	}
	cdir := e.dirs.Sandbox(child)
	if r, err := state.Load(cdir); err == nil {
		return nil, codef(ExitUsage, "the name %q is taken by the sandbox of %s; choose another, or remove it with: moat destroy %s", child, r.Workspace, child)
	}
	res := &forkResult{Schema: 1, Name: child, Parent: parent}
	s := sandboxAt(pdir)
	if s.alive() {
		if err := suspendFor(s, pdir, parent, "for the fork"); err != nil {
			return nil, err
		}
		// The parent comes back whatever became of the copy.
		defer func() { res.ParentResumed = e.resumeAfter(pdir, parent, "the fork") }()
	}
	again, err := e.standbyAside(pdir, parent)
	if err != nil {
		return nil, err
	}
	defer again()
	// A start of the parent while it is copied would change its files
	// and consume its image.
	unlock, err := state.Lock(filepath.Join(pdir, "start.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if state.DaemonAlive(pdir) {
		return nil, codef(ExitError, "sandbox %q started again during the fork; try again", parent)
	}
	prec, err = state.Load(pdir)
	if err != nil {
		return nil, err
	}
	res.At = prec.Stopped
	_, whole := runtime.ImageSize(pdir)
	res.Processes = prec.State == state.StateSuspended && whole
	if err := e.copySandbox(pdir, cdir, prec, res); err != nil {
		e.removeAll(cdir)
		return nil, err
	}
	how := "its files"
	if res.Processes {
		how = "its files and its processes with their memory"
	}
	copyHow := "copied"
	if res.Reflinked {
		copyHow = "reflinked"
	}
	fmt.Fprintf(os.Stderr, "moat: forked %s into %s: %s as they were at %s (the moment of the fork; %s), nothing later\n",
		parent, child, how, res.At.Local().Format("15:04:05.000"), copyHow)
	fmt.Fprintf(os.Stderr, "moat: %s has its own SSH keys, CA and secret placeholders; start it with: moat up %s\n", child, child)
	return res, nil
}

// copySandbox makes cdir from the stopped parent in pdir: a record with
// the parent's configuration and runtime rules, fresh keys (the CA and
// the placeholders are made at the child's first start, as for any new
// sandbox), the writable layer, and the checkpoint image with the guest
// binary it maps when there is one.
func (e *env) copySandbox(pdir, cdir string, prec *state.Record, res *forkResult) error {
	rec := &state.Record{
		Name: res.Name, Workspace: prec.Workspace, Image: prec.Image, Runtime: prec.Runtime,
		Desired: "stopped", State: state.StateStopped, StopReason: state.StopUser,
		Created: time.Now().UTC(), Stopped: prec.Stopped,
		GuestUID: prec.GuestUID, GuestGID: prec.GuestGID, Config: prec.Config,
		// SetUp: on_create's work is in the copied files.
		Rules: prec.Rules, Presets: prec.Presets, SetUp: prec.SetUp,
		// Not Forwards: their host ports are the parent's. Not
		// Placeholders: the child's are its own.
	}
	if res.Processes {
		rec.State, rec.StopReason = state.StateSuspended, state.StopSuspend
	}
	if err := state.Create(cdir, rec); err != nil {
		if errors.Is(err, os.ErrExist) {
			return codef(ExitUsage, "the name %q is taken; choose another", res.Name)
		}
		return err
	}
	if err := baseline(cdir, rec.Workspace); err != nil {
		return err
	}
	if err := keys.Ensure(cdir); err != nil {
		return err
	}
	reflinked, err := copyLayer(pdir, cdir)
	if err != nil {
		return fmt.Errorf("copying the writable layer of %s: %w", prec.Name, err)
	}
	res.Reflinked = reflinked
	if !res.Processes {
		return nil
	}
	if err := copyImage(pdir, cdir); err != nil {
		return fmt.Errorf("copying the checkpoint image of %s: %w", prec.Name, err)
	}
	return copyForkKeys(pdir, cdir)
}

// copyForkKeys gives the child, until its first restore, the parent's
// keys: the restored guest's agent knows only those, and the child's
// daemon connects with them once to have it take the child's own
// (daemon/fork.go).
func copyForkKeys(pdir, cdir string) error {
	dst := runtime.ForkKeysDir(cdir)
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, name := range []string{keys.ClientKey, keys.HostPub} {
		b, err := os.ReadFile(filepath.Join(pdir, name))
		if err != nil {
			return fmt.Errorf("reading the parent's keys: %w", err)
		}
		if err := state.WriteAtomic(filepath.Join(dst, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// copyLayer copies the writable layer: the disk image, or the layer's
// directories for a sandbox without one (disk = "unlimited").
func copyLayer(pdir, cdir string) (bool, error) {
	img := filepath.Join(pdir, disk.ImageName)
	if _, err := os.Stat(img); err == nil {
		return disk.Clone(img, filepath.Join(cdir, disk.ImageName))
	}
	reflinked := true
	for _, name := range []string{"upper", "root"} {
		src := filepath.Join(pdir, name)
		if _, err := os.Lstat(src); err != nil {
			continue
		}
		// cp -a keeps owners, modes, the overlay's whiteouts and its
		// trusted.* attributes, as the move into a disk image does.
		if err := copyTree(src, filepath.Join(cdir, name)); err != nil {
			return false, err
		}
		reflinked = false // cp does not say whether it could
	}
	return reflinked, nil
}

// copyImage copies the checkpoint image and the guest binary it maps.
func copyImage(pdir, cdir string) error {
	src, dst := runtime.SuspendDir(pdir), runtime.SuspendDir(cdir)
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, e := range ents {
		if _, err := disk.Clone(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	bin, cbin := runtime.GuestBinary(pdir), runtime.GuestBinary(cdir)
	if err := os.Link(bin, cbin); err != nil {
		if _, err := disk.Clone(bin, cbin); err != nil {
			return err
		}
		return os.Chmod(cbin, 0o755)
	}
	return nil
}
