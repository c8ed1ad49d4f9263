package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"moat.dev/moat/internal/checkpoint"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/disk"
	"moat.dev/moat/internal/roles"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/statefs"
)

// Named snapshots (docs/suspend.md): a sandbox's state at one moment, its
// writable layer and, when it was running or suspended, its checkpoint
// image, kept under its state directory to go back to. A snapshot is laid
// out as a state directory is (the layer, suspend/, guest-moat, fork-keys/),
// so fork's copies serve in both directions, plus snapshot.json.
//
// On disk (frozen): <state>/snapshots/<tag>/, written as
// <state>/snapshots/.<tag>.new/ and renamed once whole and flushed, so a
// failed save leaves nothing that lists as a snapshot (a tag cannot start
// with a dot).

// snapshotInfo is snapshot.json and `moat snapshot list --json`'s entry.
// Field names are frozen.
type snapshotInfo struct {
	Schema  int    `json:"schema"`
	Tag     string `json:"tag"`
	Sandbox string `json:"sandbox"`
	// Saved is when the snapshot was made; At when the sandbox's state
	// in it was taken (its suspend, or its stop for a stopped sandbox).
	Saved time.Time `json:"saved"`
	At    time.Time `json:"at"`
	// Processes: it holds the guest's processes and memory; false for a
	// stopped sandbox's, whose restore boots afresh with its files.
	Processes bool `json:"processes"`
	// Bytes is its size on disk (allocated blocks: a sparse disk image
	// counts what it holds; blocks reflinked with the sandbox count too).
	Bytes int64 `json:"bytes"`
	// SetUp: on_create had succeeded (its work is in the files).
	SetUp bool `json:"set_up,omitempty"`
	// Manifest is what made it (the image's, when it has processes).
	Manifest checkpoint.Manifest `json:"manifest"`
	// SandboxResumed (save only): the sandbox was running,
	// was suspended for the copy and resumed after it.
	SandboxResumed bool `json:"sandbox_resumed,omitempty"`
}

const snapshotFile = "snapshot.json"

// tagOK: a tag is a directory name, readable in a list, and never the
// staging directory's dot: a letter or digit, then up to 63 of those or
// "._-". A function, not a regexp: the bounded repetition compiles into
// a program of tens of KB held from every moat process's start.
func tagOK(tag string) bool {
	if len(tag) == 0 || len(tag) > 64 || !isAlnum(tag[0]) {
		return false
	}
	for i := 1; i < len(tag); i++ {
		if c := tag[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

func validTag(tag string) error {
	if !tagOK(tag) {
		return codef(ExitUsage, "snapshot tag %q (the TAG argument) is not valid: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", tag)
	}
	return nil
}

func snapshotsDir(dir string) string     { return filepath.Join(dir, "snapshots") }
func snapshotDir(dir, tag string) string { return filepath.Join(snapshotsDir(dir), tag) }

// defaultTag is the UTC time of the save to the second ("20261205-154900"):
// sorts by time, and says when without a list; a second save within the
// same second gets "-2" and so on.
func defaultTag(dir string, now time.Time) (string, error) {
	base := now.UTC().Format("20060102-150405")
	for i := 1; i <= 9; i++ {
		tag := base
		if i > 1 {
			tag = fmt.Sprintf("%s-%d", base, i)
		}
		if _, err := os.Lstat(snapshotDir(dir, tag)); errors.Is(err, fs.ErrNotExist) {
			return tag, nil
		}
	}
	return "", codef(ExitError, "too many snapshots at %s; name one: moat snapshot save NAME TAG", base)
}

func newSnapshotCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "snapshot",
		Short: "Save a sandbox's live state under a tag, and go back to it",
		Long: `Named snapshots of a sandbox's state: its files and, when it runs or is
suspended, its processes with their memory. save keeps one under the
sandbox's state directory, list shows them, restore makes the sandbox's
state the snapshot's and resumes it, rm deletes one. moat destroy deletes
them all with the sandbox.

A snapshot is restored only by the moat and gVisor versions that saved it,
on a CPU with the features it had; otherwise restore refuses, says what
differs, and changes nothing.

  moat snapshot save api before-migration
  moat snapshot list api
  moat snapshot restore api before-migration --yes
  moat snapshot rm api before-migration --yes`,
	}
	c.AddCommand(newSnapshotSaveCmd(), newSnapshotListCmd(), newSnapshotRestoreCmd(), newSnapshotRmCmd())
	return c
}

func newSnapshotSaveCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "save NAME [TAG]",
		Short: "Save the sandbox's state now as snapshot TAG",
		Long: `Save sandbox NAME's state as it is now under TAG (default: the UTC time,
20261205-154900): its writable layer and, when it is running or suspended,
its processes with their memory. A running sandbox is suspended for the
copy and resumed after it: its processes carry on, but its attached
sessions are ended and its connections to the outside are reset, as by moat
suspend. Prints the tag.`,
		Example: `  moat snapshot save api
  moat snapshot save api before-migration --json`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			tag := ""
			if len(args) > 1 {
				tag = args[1]
			}
			info, err := e.snapshotSave(args[0], tag)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(c.OutOrStdout()).Encode(info)
			}
			fmt.Fprintln(c.OutOrStdout(), info.Tag)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// snapshotSave saves name's state as tag ("" for defaultTag).
func (e *env) snapshotSave(name, tag string) (*snapshotInfo, error) {
	dir, rec, err := e.byName(name)
	if err != nil {
		return nil, err
	}
	if rec.Runtime == runtimeDocker {
		return nil, codef(ExitUsage, "sandbox %q runs on Docker, which moat cannot checkpoint; snapshots need a gVisor sandbox", name)
	}
	if tag == "" {
		if tag, err = defaultTag(dir, time.Now()); err != nil {
			return nil, err
		}
	} else if err := validTag(tag); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(snapshotDir(dir, tag)); err == nil {
		return nil, codef(ExitUsage, "sandbox %q has a snapshot %q already; choose another tag, or remove it with: moat snapshot rm %s %s --yes", name, tag, name, tag)
	}
	info := &snapshotInfo{Schema: 1, Tag: tag, Sandbox: name}
	s := sandboxAt(dir)
	if s.alive() {
		if err := suspendFor(s, dir, name, "for the snapshot"); err != nil {
			return nil, err
		}
		defer func() { info.SandboxResumed = e.resumeAfter(dir, name, "the snapshot") }()
	}
	again, err := e.standbyAside(dir, name)
	if err != nil {
		return nil, err
	}
	defer again()
	if err := e.saveLocked(dir, info); err != nil {
		return nil, err
	}
	how := "its files"
	if info.Processes {
		how = "its files and its processes with their memory"
	}
	fmt.Fprintf(os.Stderr, "moat: saved snapshot %s of %s: %s as they were at %s (%s on disk); restore it with: moat snapshot restore %s %s\n",
		tag, name, how, info.At.Local().Format("15:04:05.000"), disk.FormatBytes(uint64(info.Bytes)), name, tag)
	return info, nil
}

// saveLocked copies the stopped or suspended sandbox in dir into the
// snapshot info names, under the start lock: a start while it is copied
// would change its files and consume its image.
func (e *env) saveLocked(dir string, info *snapshotInfo) error {
	unlock, err := state.Lock(filepath.Join(dir, "start.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if state.DaemonAlive(dir) {
		return codef(ExitError, "sandbox %q started again during the snapshot; try again", info.Sandbox)
	}
	rec, err := state.Load(dir)
	if err != nil {
		return err
	}
	_, whole := runtime.ImageSize(dir)
	info.Processes = rec.State == state.StateSuspended && whole
	info.At, info.SetUp, info.Saved = rec.Stopped, rec.SetUp, time.Now().UTC()
	if info.At.IsZero() {
		info.At = info.Saved
	}
	if err := os.MkdirAll(snapshotsDir(dir), 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(snapshotsDir(dir), "."+info.Tag+".new")
	os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	if err := e.fillSnapshot(dir, tmp, info); err != nil {
		e.removeAll(tmp)
		return fmt.Errorf("saving snapshot %s of %s: %w; nothing was saved", info.Tag, info.Sandbox, err)
	}
	if err := os.Rename(tmp, snapshotDir(dir, info.Tag)); err != nil {
		e.removeAll(tmp)
		return err
	}
	return statefs.SyncPath(snapshotsDir(dir))
}

// fillSnapshot copies dir's state into the snapshot directory tmp and
// writes its snapshot.json, everything flushed.
func (e *env) fillSnapshot(dir, tmp string, info *snapshotInfo) error {
	if _, err := copyLayer(dir, tmp); err != nil {
		return fmt.Errorf("copying the writable layer: %w", err)
	}
	var m *checkpoint.Manifest
	if info.Processes {
		if err := copySaved(dir, tmp); err != nil {
			return fmt.Errorf("copying the checkpoint image: %w", err)
		}
		// The image's own manifest says what saved it; one from a
		// moat before manifests is taken to be this host's.
		m, _ = checkpoint.Read(runtime.SuspendDir(tmp))
	}
	if m == nil {
		now, err := checkpoint.Host(roles.MoatVersion(), e.runsc, nil)
		if err != nil {
			return err
		}
		m = &now
	}
	info.Manifest = *m
	size, err := flushTree(tmp)
	if err != nil {
		return fmt.Errorf("flushing: %w", err)
	}
	info.Bytes = size
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	return state.WriteAtomic(filepath.Join(tmp, snapshotFile), append(b, '\n'), 0o600)
}

// copySaved copies a suspended sandbox's image, the guest binary it maps
// and a fork's parent keys when it has them (copyImage).
func copySaved(src, dst string) error {
	if err := copyImage(src, dst); err != nil {
		return err
	}
	keysDir := runtime.ForkKeysDir(src)
	ents, err := os.ReadDir(keysDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.Mkdir(runtime.ForkKeysDir(dst), 0o700); err != nil {
		return err
	}
	for _, ent := range ents {
		b, err := os.ReadFile(filepath.Join(keysDir, ent.Name()))
		if err != nil {
			return err
		}
		if err := state.WriteAtomic(filepath.Join(runtime.ForkKeysDir(dst), ent.Name()), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// readSnapshot reads snapshot tag of the sandbox in dir.
func readSnapshot(dir, name, tag string) (*snapshotInfo, error) {
	path := filepath.Join(snapshotDir(dir, tag), snapshotFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, codef(ExitNotFound, "sandbox %q has no snapshot %q; see its snapshots with: moat snapshot list %s", name, tag, name)
	}
	if err != nil {
		return nil, err
	}
	var info snapshotInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, codef(ExitError, "%s is unreadable (%v); nothing was changed; remove the snapshot with: moat snapshot rm %s %s --yes", path, err, name, tag)
	}
	info.Tag, info.SandboxResumed = tag, false
	return &info, nil
}

// listSnapshots reads the sandbox's snapshots, oldest first; one whose
// snapshot.json is unreadable is listed with what is known.
func listSnapshots(dir, name string) []snapshotInfo {
	ents, _ := os.ReadDir(snapshotsDir(dir))
	var out []snapshotInfo
	for _, ent := range ents {
		if !ent.IsDir() || !tagOK(ent.Name()) {
			continue // a save under way, or not ours
		}
		info, err := readSnapshot(dir, name, ent.Name())
		if err != nil {
			info = &snapshotInfo{Schema: 1, Tag: ent.Name(), Sandbox: name, Bytes: statefs.Allocated(snapshotDir(dir, ent.Name()))}
		}
		out = append(out, *info)
	}
	return out
}

func newSnapshotListCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list NAME",
		Short: "List a sandbox's snapshots",
		Long: `List sandbox NAME's snapshots: tag, when it was saved, its size on disk,
whether it holds processes, and the moat and gVisor versions that made it
(only those restore it).`,
		Example: `  moat snapshot list api
  moat snapshot list api --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			dir, rec, err := e.byName(args[0])
			if err != nil {
				return err
			}
			snaps := listSnapshots(dir, rec.Name)
			out := c.OutOrStdout()
			if asJSON {
				if snaps == nil {
					snaps = []snapshotInfo{}
				}
				return json.NewEncoder(out).Encode(map[string]any{"schema": 1, "sandbox": rec.Name, "snapshots": snaps})
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TAG\tSAVED\tSIZE\tPROCESSES\tMOAT\tGVISOR")
			for _, s := range snaps {
				saved, procs := "?", "no"
				if !s.Saved.IsZero() {
					saved = s.Saved.Local().Format("2006-01-02 15:04:05")
				}
				if s.Processes {
					procs = "yes"
				}
				gv := strings.TrimPrefix(s.Manifest.RunscVersion, "runsc version ")
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Tag, saved, disk.FormatBytes(uint64(s.Bytes)), procs, orDash(s.Manifest.MoatVersion), orDash(gv))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newSnapshotRestoreCmd() *cobra.Command {
	var yes bool
	c := &cobra.Command{
		Use:   "restore NAME TAG",
		Short: "Make the sandbox's state snapshot TAG's, and resume it",
		Long: `Replace sandbox NAME's files, and its processes, with snapshot TAG's and
resume it: its processes with their memory come back as they were when the
snapshot was saved (a snapshot of a stopped sandbox boots afresh with its
files). What the sandbox holds now is discarded; the snapshot is kept. A
running sandbox is stopped first, its attached sessions ended. The
configuration, network rules and forwards stay the sandbox's own.

A snapshot saved by another moat or gVisor version, or on a CPU without a
feature it had, is refused before anything changes. On a terminal moat asks
first; elsewhere --yes is required.`,
		Example: `  moat snapshot restore api before-migration --yes`,
		Args:    cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			return e.snapshotRestore(args[0], args[1], yes)
		},
	}
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask")
	return c
}

// snapshotRestore replaces name's state with snapshot tag's and resumes
// it. Everything that can refuse does so before anything changes.
func (e *env) snapshotRestore(name, tag string, yes bool) error {
	dir, rec, err := e.byName(name)
	if err != nil {
		return err
	}
	if rec.Runtime == runtimeDocker {
		return codef(ExitUsage, "sandbox %q runs on Docker, which has no snapshots", name)
	}
	if err := validTag(tag); err != nil {
		return err
	}
	info, err := readSnapshot(dir, name, tag)
	if err != nil {
		return err
	}
	if err := e.checkSnapshot(dir, rec, info); err != nil {
		return err
	}
	if !yes {
		if !term.IsTerminal(int(os.Stdin.Fd())) {
			return codef(ExitUsage, "restore replaces sandbox %q's files and processes with snapshot %q's; confirm with: moat snapshot restore %s %s --yes", name, tag, name, tag)
		}
		fmt.Fprintf(os.Stderr, "Replace sandbox %q's files and processes with snapshot %q's (saved %s)? [y/N] ", name, tag, info.Saved.Local().Format(time.DateTime))
		var answer string
		fmt.Scanln(&answer)
		if a := strings.ToLower(answer); a != "y" && a != "yes" {
			return errors.New("not restored")
		}
	}
	if s := sandboxAt(dir); s.alive() {
		st, _ := ask(s, 2*time.Second, (*control.Client).Status)
		if err := e.stop(dir, state.StopUser); err != nil {
			return err
		}
		if st != nil && st.Sessions > 0 {
			fmt.Fprintf(os.Stderr, "moat: stopped %s for the restore, ending %d attached session(s)\n", name, st.Sessions)
		} else {
			fmt.Fprintf(os.Stderr, "moat: stopped %s for the restore\n", name)
		}
	}
	if err := e.restoreLocked(dir, info); err != nil {
		return err
	}
	if err := e.start(dir); err != nil {
		if _, kept := runtime.ImageSize(dir); info.Processes && !kept && !sandboxAt(dir).alive() {
			return fmt.Errorf("%w\nthe snapshot's processes could not be restored; the sandbox has the snapshot's files, and the snapshot is kept: start it afresh with: moat up %s", err, name)
		}
		return err
	}
	how := "files"
	if info.Processes {
		how = "files and processes"
	}
	fmt.Fprintf(os.Stderr, "moat: restored %s from snapshot %s: its %s as they were at %s\n", name, tag, how, info.At.Local().Format(time.DateTime))
	return nil
}

// checkSnapshot refuses a snapshot this host cannot restore: another
// moat, and for one with processes another gVisor or a CPU without a
// feature it had (checkpoint.Compare).
func (e *env) checkSnapshot(dir string, rec *state.Record, info *snapshotInfo) error {
	refuse := func(why string) error {
		st, _ := state.Effective(rec, dir)
		next := "start it as it is with: moat up " + rec.Name
		switch st {
		case state.StateRunning, state.StateStarting:
			next = "it keeps running as it is"
		case state.StateSuspended:
			next = "resume it as it is with: moat resume " + rec.Name + " (or start it afresh: moat down " + rec.Name + " && moat up " + rec.Name + ")"
		}
		return codef(ExitError, "snapshot %q of %s cannot be restored here: %s. Nothing was changed or deleted: the sandbox is %s and still usable (%s), and the snapshot is kept for the moat and gVisor that saved it",
			info.Tag, rec.Name, why, st, next)
	}
	if info.Manifest.Schema != 1 {
		return refuse("its snapshot.json has no manifest of what saved it")
	}
	now, err := checkpoint.Host(roles.MoatVersion(), e.runsc, &info.Manifest)
	if err != nil {
		return err
	}
	if ms := checkpoint.Compare(info.Manifest, now, checkpoint.Checks{Moat: true, Guest: info.Processes}); len(ms) > 0 {
		return refuse(checkpoint.Describe(ms))
	}
	return nil
}

// restoreItems are what a restore replaces in the state directory: the
// writable layer (writableLayer, less the mount points) and what a
// suspend keeps.
var restoreItems = []string{"upper", "work", "root", disk.ImageName, "suspend", "guest-moat", "fork-keys"}

// restoreLocked makes the stopped sandbox's state the snapshot's, under
// the start lock: the snapshot is copied beside the state first, then
// swapped in, the old state set aside until the swap is done, so a
// failure leaves the sandbox as it was.
func (e *env) restoreLocked(dir string, info *snapshotInfo) error {
	unlock, err := state.Lock(filepath.Join(dir, "start.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if state.DaemonAlive(dir) {
		return codef(ExitError, "sandbox %q started again during the restore; try again", info.Sandbox)
	}
	// A standby set up from the image about to be replaced.
	if err := daemon.DismissStandby(dir); err != nil {
		return err
	}
	src := snapshotDir(dir, info.Tag)
	stage, old := filepath.Join(dir, ".snapshot-restore.new"), filepath.Join(dir, ".snapshot-restore.old")
	e.removeAll(stage)
	e.removeAll(old)
	if err := os.Mkdir(stage, 0o700); err != nil {
		return err
	}
	defer e.removeAll(stage)
	if _, err := copyLayer(src, stage); err != nil {
		return fmt.Errorf("copying snapshot %s's writable layer: %w; the sandbox is unchanged", info.Tag, err)
	}
	if info.Processes {
		if err := copySaved(src, stage); err != nil {
			return fmt.Errorf("copying snapshot %s's checkpoint image: %w; the sandbox is unchanged", info.Tag, err)
		}
	}
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := swapState(dir, stage, old); err != nil {
		return fmt.Errorf("restoring snapshot %s: %w; the sandbox is unchanged", info.Tag, err)
	}
	if err := e.removeAll(old); err != nil {
		fmt.Fprintf(os.Stderr, "moat: removing the sandbox's state from before the restore: %v (in %s)\n", err, old)
	}
	return state.Update(dir, func(r *state.Record) error {
		r.State, r.StopReason = state.StateStopped, state.StopUser
		if info.Processes {
			r.State, r.StopReason = state.StateSuspended, state.StopSuspend
		}
		r.SetUp, r.Stopped, r.Error = info.SetUp, info.At, ""
		return nil
	})
}

func newSnapshotRmCmd() *cobra.Command {
	var yes bool
	c := &cobra.Command{
		Use:   "rm NAME TAG",
		Short: "Delete a snapshot",
		Long: `Delete snapshot TAG of sandbox NAME. The sandbox is untouched. On a
terminal moat asks first; elsewhere --yes is required.`,
		Example: `  moat snapshot rm api before-migration --yes`,
		Args:    cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			name, tag := args[0], args[1]
			dir, _, err := e.byName(name)
			if err != nil {
				return err
			}
			if err := validTag(tag); err != nil {
				return err
			}
			if _, err := os.Lstat(snapshotDir(dir, tag)); err != nil {
				return codef(ExitNotFound, "sandbox %q has no snapshot %q; see its snapshots with: moat snapshot list %s", name, tag, name)
			}
			if !yes {
				if !term.IsTerminal(int(os.Stdin.Fd())) {
					return codef(ExitUsage, "rm deletes snapshot %q of %s; confirm with: moat snapshot rm %s %s --yes", tag, name, name, tag)
				}
				fmt.Fprintf(os.Stderr, "Delete snapshot %q of %s? [y/N] ", tag, name)
				var answer string
				fmt.Scanln(&answer)
				if a := strings.ToLower(answer); a != "y" && a != "yes" {
					return errors.New("not deleted")
				}
			}
			// Not while a restore copies it.
			unlock, err := state.Lock(filepath.Join(dir, "start.lock"))
			if err != nil {
				return err
			}
			defer unlock()
			if err := e.removeAll(snapshotDir(dir, tag)); err != nil {
				return fmt.Errorf("removing snapshot %s of %s: %w", tag, name, err)
			}
			fmt.Fprintf(os.Stderr, "moat: removed snapshot %s of %s\n", tag, name)
			return nil
		},
	}
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask")
	return c
}

// snapshotBytes is the size on disk of the sandbox's snapshots, as they
// recorded it, for moat list.
func snapshotBytes(dir string) int64 {
	var n int64
	for _, s := range listSnapshots(dir, "") {
		n += s.Bytes
	}
	return n
}
