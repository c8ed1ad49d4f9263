package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/checkpoint"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/disk"
	"moat.dev/moat/internal/roles"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/session"
	"moat.dev/moat/internal/state"
)

// suspendWait bounds `moat suspend`: the checkpoint (the daemon bounds it
// at 10 minutes), then the daemon's stop.
const suspendWait = 12 * time.Minute

// suspendResult is `moat suspend --json`'s object. Fields are only added.
type suspendResult struct {
	Schema        int    `json:"schema"`
	Name          string `json:"name"`
	State         string `json:"state"`
	ImageBytes    int64  `json:"image_bytes"`
	SessionsEnded int    `json:"sessions_ended"`
	Standby       bool   `json:"standby,omitempty"`
}

func newSuspendCmd() *cobra.Command {
	var asJSON, standby bool
	c := &cobra.Command{
		Use:   "suspend [NAME]",
		Short: "Save a running sandbox, processes and memory included, and stop it",
		Long: `Save the running guest of a sandbox (NAME, else the current directory's),
its processes, their memory and open files, into its state directory, and stop
it. The next moat resume, run, exec or shell brings it back as it was, without
running on_up again. Sessions attached now are ended first (their commands get
SIGHUP); connections to the outside are reset on resume. moat list shows the
sandbox as suspended with the size of its image.

With --standby, moat then starts the sandbox's next daemon at once and has
it wait just short of the restore: the resume is then about half as long,
and the sandbox holds about 45 MiB of memory (its gate, its runsc sandbox,
no guest) while it stays suspended. A change to what the sandbox would
start with (its configuration, network rules or forwards, a secret's
value) makes the resume start afresh as without it; moat down, destroy and
snapshot restore end the standby.`,
		Example: `  moat suspend
  moat suspend --standby
  moat suspend api --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			dir, rec, err := e.resolve(args)
			if err != nil {
				return err
			}
			// suspended is how both ways to a suspended sandbox end: its
			// standby if asked for, then the JSON.
			suspended := func(size int64, ended int) error {
				if standby {
					if err := e.standBy(dir, rec.Name); err != nil {
						return err
					}
				}
				return printSuspended(c, asJSON, rec.Name, size, ended, state.StandbyAlive(dir))
			}
			s := sandboxAt(dir)
			if !s.alive() {
				if st, _ := state.Effective(rec, dir); st == state.StateSuspended {
					fmt.Fprintf(os.Stderr, "moat: sandbox %q is suspended already\n", rec.Name)
					size, _ := runtime.ImageSize(dir)
					return suspended(size, 0)
				}
				return codef(ExitUsage, "sandbox %q is not running; nothing to suspend (start it with: moat up %s)", rec.Name, rec.Name)
			}
			ended, err := suspendNow(s, dir, rec.Name, "")
			if err != nil {
				return err
			}
			if err := state.Update(dir, func(r *state.Record) error { r.Desired = "stopped"; return nil }); err != nil {
				return err
			}
			if ended > 0 {
				fmt.Fprintf(os.Stderr, "moat: ended %d attached session(s) first\n", ended)
			}
			size, _ := runtime.ImageSize(dir)
			fmt.Fprintf(os.Stderr, "moat: suspended %s (image %s); resume with: moat resume %s\n", rec.Name, disk.FormatBytes(uint64(size)), rec.Name)
			return suspended(size, ended)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().BoolVar(&standby, "standby", false, "keep the next daemon waiting, for a resume in half the time (holds about 45 MiB)")
	return c
}

func printSuspended(c *cobra.Command, asJSON bool, name string, size int64, ended int, standby bool) error {
	if !asJSON {
		return nil
	}
	return json.NewEncoder(c.OutOrStdout()).Encode(suspendResult{Schema: 1, Name: name, State: state.StateSuspended,
		ImageBytes: size, SessionsEnded: ended, Standby: standby})
}

// standBy starts the suspended sandbox's standby (daemon/standby.go),
// unless it has one: the daemon its next resume would start, waiting
// just short of the restore.
func (e *env) standBy(dir, name string) error {
	if err := gvisorOnly(dir); err != nil {
		return err
	}
	unlock, err := state.Lock(filepath.Join(dir, "start.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if state.StandbyAlive(dir) {
		return nil
	}
	if state.DaemonAlive(dir) {
		return codef(ExitError, "sandbox %q was started again meanwhile: nothing to stand by for", name)
	}
	if err := e.checkSaved(dir); err != nil {
		return err
	}
	if _, err := e.spawnDaemon(dir, false, true); err != nil {
		return fmt.Errorf("%w\nsandbox %q is suspended all the same; resume it the usual way with: moat resume %s", err, name, name)
	}
	fmt.Fprintf(os.Stderr, "moat: standing by to resume %s at once\n", name)
	return nil
}

// suspendNow suspends the running sandbox in dir, as moat suspend does,
// and waits for its daemon to go; it returns how many attached sessions
// were ended. purpose ("for the fork") is said in its errors. moat
// suspend, moat fork and moat snapshot save all suspend through here.
func suspendNow(s sandbox, dir, name, purpose string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), suspendWait)
	defer cancel()
	a, err := s.client().Suspend(ctx)
	var he *control.HTTPError
	if errors.As(err, &he) {
		if purpose == "" {
			return 0, fromDaemon(err)
		}
		return 0, fmt.Errorf("suspending %s %s: %w", name, purpose, fromDaemon(err))
	}
	// Any other error may be the daemon stopping as it answers: the
	// record says whether the guest was saved.
	if err := waitGone(s, time.Minute); err != nil {
		return 0, err
	}
	rec, lerr := state.Load(dir)
	if lerr != nil {
		return 0, lerr
	}
	if rec.State != state.StateSuspended {
		if err == nil {
			err = errors.New(rec.Error)
		}
		if purpose != "" {
			purpose = " " + purpose
		}
		return 0, fmt.Errorf("sandbox %q was not suspended%s (%s: %v); see: moat logs %s", name, purpose, rec.State, err, name)
	}
	if a == nil {
		return 0, nil
	}
	return a.Sessions, nil
}

// suspendFor suspends a running sandbox for a copy of its state (fork,
// snapshot save) and says so; resumeAfter brings it back.
func suspendFor(s sandbox, dir, name, purpose string) error {
	ended, err := suspendNow(s, dir, name, purpose)
	if err != nil {
		return err
	}
	if ended > 0 {
		fmt.Fprintf(os.Stderr, "moat: ended %d attached session(s) of %s first\n", ended, name)
	}
	fmt.Fprintf(os.Stderr, "moat: suspended %s %s\n", name, purpose)
	return nil
}

// resumeAfter resumes the sandbox suspendFor suspended, whatever became
// of the copy, and reports whether it runs again.
func (e *env) resumeAfter(dir, name, purpose string) bool {
	if err := e.start(dir); err != nil {
		fmt.Fprintf(os.Stderr, "moat: resuming %s after %s failed: %v; resume it with: moat resume %s\n", name, purpose, err, name)
		return false
	}
	fmt.Fprintf(os.Stderr, "moat: resumed %s\n", name)
	return true
}

// waitGone waits for the daemon to exit, up to d.
func waitGone(s sandbox, d time.Duration) error {
	deadline := time.Now().Add(d)
	for s.alive() {
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon of %q did not stop within %v; see: moat logs %s", s.name, d, s.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func newResumeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "resume [NAME]",
		Short: "Bring a suspended sandbox back as it was",
		Long: `Restore a sandbox (NAME, else the current directory's) that moat suspend saved:
its processes, their memory and open files come back; on_up does not run
again; forwards come back; connections the guest had to the outside are reset.
moat run, exec and shell resume a suspended sandbox too.`,
		Example: `  moat resume
  moat resume api`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			dir, rec, err := e.resolve(args)
			if err != nil {
				return err
			}
			st, _ := state.Effective(rec, dir)
			switch rec.State {
			case state.StateSuspended, state.StateSuspending, state.StateResuming:
				// A suspend or a resume cut short resumes too, when its
				// image is whole (the daemon decides).
			default:
				if st == state.StateRunning {
					fmt.Fprintf(os.Stderr, "moat: sandbox %q is running\n", rec.Name)
					return nil
				}
				return codef(ExitUsage, "sandbox %q is %s, not suspended; start it with: moat up %s", rec.Name, st, rec.Name)
			}
			if err := e.start(dir); err != nil {
				if _, kept := runtime.ImageSize(dir); !kept && !sandboxAt(dir).alive() {
					// The shim drops an image runsc refused (runsc.log says why).
					return fmt.Errorf("%w\nthe saved processes could not be restored and are dropped; the sandbox's files are kept: start it afresh with: moat up %s", err, rec.Name)
				}
				return err
			}
			fmt.Fprintf(os.Stderr, "moat: resumed %s\n", rec.Name)
			return nil
		},
	}
}

// standbyAside ends a suspended sandbox's standby, if it has one, while
// its state is copied (the standby's shim has its disk image mounted), and
// returns what starts one again after.
func (e *env) standbyAside(dir, name string) (again func(), err error) {
	if !state.StandbyAlive(dir) {
		return func() {}, nil
	}
	if err := daemon.DismissStandby(dir); err != nil {
		return nil, err
	}
	return func() {
		if err := e.standBy(dir, name); err != nil {
			fmt.Fprintf(os.Stderr, "moat: %v\n", err)
		}
	}, nil
}

// suspendedText is `moat list`'s state for a suspended sandbox: with the
// size of its image on disk, and whether it has a standby.
func suspendedText(le listEntry) (string, bool) {
	st := le.State
	if st != state.StateSuspended {
		return "", false
	}
	size := le.SuspendImageBytes
	if !le.imageWhole {
		return st + " (no image)", true
	}
	if le.Standby {
		return fmt.Sprintf("%s (%s, standby)", st, disk.FormatBytes(uint64(size))), true
	}
	return fmt.Sprintf("%s (%s)", st, disk.FormatBytes(uint64(size))), true
}

// sessionEndedBySuspend is the hint for a session whose connection was
// lost, or whose command did not start: when its sandbox is being
// suspended, that is why.
func sessionEndedBySuspend(dir string, err error) error {
	lost := errors.Is(err, session.ErrConnectionLost)
	if !lost && !errors.Is(err, session.ErrNotStarted) {
		return err
	}
	r, lerr := state.Load(dir)
	if lerr != nil {
		return err
	}
	switch r.State {
	case state.StateSuspending, state.StateSuspended:
		if !lost {
			return fmt.Errorf("the command did not start: sandbox %q was being suspended; resume it with: moat resume %s", r.Name, r.Name)
		}
		return fmt.Errorf("the session ended: sandbox %q was suspended; resume it with: moat resume %s", r.Name, r.Name)
	}
	return err
}

// discardSuspended makes a suspended sandbox that `moat down` stops a
// stopped one: its image goes, and the next start boots afresh.
func discardSuspended(dir string) error {
	r, err := state.Load(dir)
	if err != nil || r.State != state.StateSuspended || state.DaemonAlive(dir) {
		return err
	}
	if err := runtime.RemoveSaved(dir); err != nil {
		return fmt.Errorf("removing the suspended image: %w", err)
	}
	return state.Update(dir, func(r *state.Record) error {
		if r.State == state.StateSuspended {
			r.State, r.StopReason = state.StateStopped, state.StopUser
		}
		return nil
	})
}

// checkSaved refuses, before runsc is asked, to restore a suspended
// sandbox's image on a host other than the one that saved it: another
// gVisor, or a CPU without a feature the guest had (checkpoint.Compare).
// runsc would refuse it too, but the shim then drops the image; here
// nothing is deleted, and the user is told what differs. Another moat is
// not refused: the restore maps the moat binary the guest was saved with.
// An image without a manifest was saved by a moat from before manifests
// and is left to runsc's own check.
func (e *env) checkSaved(dir string) error {
	rec, err := state.Load(dir)
	if err != nil {
		return err
	}
	switch rec.State {
	case state.StateSuspended, state.StateSuspending, state.StateResuming:
	default:
		return nil
	}
	if _, whole := runtime.ImageSize(dir); !whole {
		return nil
	}
	refuse := func(why string) error {
		return codef(ExitError, "sandbox %q cannot resume here: %s. Nothing was deleted: its saved processes are kept for the host that saved them, "+
			"and its files are as they were; to start it afresh with its files, dropping the saved processes: moat down %s && moat up %s",
			rec.Name, why, rec.Name, rec.Name)
	}
	saved, err := checkpoint.Read(runtime.SuspendDir(dir))
	if errors.Is(err, checkpoint.ErrNoManifest) {
		return nil
	}
	if err != nil {
		return refuse(fmt.Sprintf("its image's manifest is unreadable (%v)", err))
	}
	now, err := checkpoint.Host(roles.MoatVersion(), e.runsc, saved)
	if err != nil {
		return err
	}
	if ms := checkpoint.Compare(*saved, now, checkpoint.Checks{Guest: true}); len(ms) > 0 {
		return refuse(checkpoint.Describe(ms))
	}
	return nil
}
