package daemon

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
)

// TestStartAndStopLeaveNothing runs the keeper's real start and stop in
// this process, against the built moat (its gate process and shim) and
// real gVisor, and after each way a run can end checks that
// nothing of it is left: no goroutine of the keeper, no process, the
// record saying stopped and why, the cgroups removed and the lock free.
// Run under the race detector (scripts/test.sh), it also races the
// keeper's start and stop.
func TestStartAndStopLeaveNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, cgroups, gVisor); run as root with MOAT_BIN and MOAT_RUNSC set, as scripts/test.sh does")
	}
	moatBin, runsc := os.Getenv("MOAT_BIN"), os.Getenv("MOAT_RUNSC")
	if moatBin == "" || runsc == "" {
		t.Skip("needs MOAT_BIN (a built moat) and MOAT_RUNSC (runsc), as scripts/test.sh sets them")
	}
	// Goroutines of the test binary and of other tests are not the
	// keeper's.
	before := goleak.IgnoreCurrent()
	home := t.TempDir()
	t.Setenv("MOAT_HOME", home) // the gate process finds the sandbox with it
	t.Setenv("MOAT_RUNSC", runsc)
	ws := filepath.Join(t.TempDir(), "lifecycle")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	// The sandbox is made, and started once, the way a user does: its
	// record, keys and configuration snapshot are the CLI's.
	moat := func(args ...string) {
		t.Helper()
		cmd := exec.Command(moatBin, args...)
		cmd.Dir = ws
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := runBounded(cmd, 2*time.Minute); err != nil {
			t.Fatalf("moat %v: %v\n%s", args, err, out.String())
		}
	}
	moat("up", "--name", "lifecycle")
	dir := filepath.Join(home, "state", "sandboxes", "lifecycle")
	t.Cleanup(func() {
		runBounded(exec.Command(moatBin, "destroy", "--yes", "lifecycle"), 2*time.Minute)
	})
	moat("down", "lifecycle")

	for _, tt := range []struct {
		name   string
		spoil  func(t *testing.T, o *Options) // what makes this start fail; nil: it does not
		reason string                         // the record's stop reason
		errHas string                         // what the record's error and run's error say; "": none
	}{
		{name: "stop", reason: state.StopUser},
		{
			// The gate process compiles the policy in its set-up, before
			// any guest exists; one that does not compile ends the start.
			name: "policy that does not compile",
			spoil: func(t *testing.T, o *Options) {
				editConfig(t, dir, func(c *config.Config) { c.Network.Use = []string{"no-such-policy"} })
			},
			reason: state.StopError, errHas: "no-such-policy",
		},
		{
			// The shim cannot mount the root filesystem (a layer is
			// missing): it never sends tap0, and the gate process's
			// "go" fails.
			name:   "shim that fails before the guest",
			spoil:  func(t *testing.T, o *Options) { o.Plan.Layers = []string{filepath.Join(ws, "no-layer")} },
			reason: state.StopError, errHas: "tap device",
		},
		{
			// The shim has no runsc to exec once it has the word: the
			// guest is gone while starting.
			name:   "shim that fails to start the guest",
			spoil:  func(t *testing.T, o *Options) { o.Plan.Runsc = filepath.Join(ws, "no-runsc") },
			reason: state.StopCrash, errHas: "guest exited while starting",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			snap := readRecord(t, dir).Config
			t.Cleanup(func() {
				state.Update(dir, func(r *state.Record) error { r.Config = snap; return nil })
			})
			// The keeper runs its gate process and shim from
			// moat-sandbox, which is built beside moat.
			o := keeperOptions(t, dir, filepath.Join(filepath.Dir(moatBin), "moat-sandbox"), runsc)
			if tt.spoil != nil {
				tt.spoil(t, o)
			}
			logFrom := logSize(dir)
			d := newDaemon(*o)
			runErr := make(chan error, 1)
			go func() { runErr <- d.run() }()
			if tt.spoil == nil {
				select {
				case <-d.booted:
				case err := <-runErr:
					t.Fatalf("the start failed: %v\n%s", err, logTail(dir))
				case <-time.After(90 * time.Second):
					t.Fatalf("the sandbox did not start within 90 s\n%s", logTail(dir))
				}
				if len(cgroupsOf(dir)) == 0 {
					t.Fatal("no cgroup of the running sandbox found under /sys/fs/cgroup: the check that it is removed would prove nothing")
				}
				d.requestStop(state.StopUser, nil)
			}
			var err error
			select {
			case err = <-runErr:
			case <-time.After(90 * time.Second):
				t.Fatalf("the daemon did not end within 90 s\n%s", logTail(dir))
			}
			switch {
			case tt.spoil == nil && err != nil:
				t.Errorf("run after a stop: %v", err)
			case tt.spoil != nil && (err == nil || !strings.Contains(err.Error(), tt.errHas)):
				t.Errorf("run = %v, want an error saying %q", err, tt.errHas)
			}

			// Each check is of a fact, after the daemon returned: it
			// waits for nothing it started.
			if err := goleak.Find(before); err != nil {
				t.Errorf("the keeper left goroutines behind: %v", err)
			}
			rec := readRecord(t, dir)
			if rec.State != state.StateStopped || rec.StopReason != tt.reason || rec.DaemonPID != 0 {
				t.Errorf("record: state %q, reason %q, daemon pid %d; want stopped, %q, 0", rec.State, rec.StopReason, rec.DaemonPID, tt.reason)
			}
			if got := rec.Error; (tt.errHas == "") != (got == "") || !strings.Contains(got, tt.errHas) {
				t.Errorf("record's error %q, want one saying %q", got, tt.errHas)
			}
			// Both processes log a clean-up step that failed and the
			// goroutines a bounded wait gave up on: the gate process's
			// are in another process, so its log is where they show.
			// The shim logs there only when it took this live keeper
			// for dead and removed the groups itself.
			for _, line := range strings.Split(logSince(dir, logFrom), "\n") {
				if strings.Contains(line, `msg="cleaning up`) || strings.Contains(line, "goroutines still running") ||
					strings.Contains(line, "component=shim") {
					t.Errorf("the stop did not end cleanly: %s", line)
				}
			}
			if left := processesOf(dir); len(left) > 0 {
				t.Errorf("processes left: %q", left)
			}
			for _, f := range []string{resources.GroupFile, resources.DaemonGroupFile} {
				if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
					t.Errorf("%s is still there: the cgroup was not removed", f)
				}
			}
			if left := cgroupsOf(dir); len(left) > 0 {
				t.Errorf("cgroups left: %q", left)
			}
			release, ok, err := state.TryLock(state.DaemonLock(dir))
			if err != nil || !ok {
				t.Errorf("the daemon lock is still held (%v)", err)
			} else {
				release()
			}
			if t.Failed() {
				t.Logf("daemon.log:\n%s", logTail(dir))
			}
		})
	}
}

// keeperOptions are the keeper's options for the sandbox in dir, as the
// CLI's __daemon role makes them (internal/cli's daemonOptions) for a
// sandbox of the host image without shares: only what the keeper reads.
// The gate process makes its own from the record.
func keeperOptions(t *testing.T, dir, moatBin, runsc string) *Options {
	t.Helper()
	rec := readRecord(t, dir)
	cfg, err := rec.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := state.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	plan := &runtime.Plan{
		ID: "moat-" + rec.Name, StateDir: dir, Runsc: runsc, Moat: moatBin,
		GuestDir: filepath.Join(dir, "guest"), Hostname: rec.Name, Image: rec.Image, Workspace: rec.Workspace,
		DiskLimit: cfg.Sandbox.DiskBytes, DiskUnlimited: cfg.Sandbox.DiskUnlimited, DiskFrom: cfg.Sandbox.DiskFrom,
		DiskTemplates: filepath.Join(dirs.Cache, "disk"),
	}
	if plan.Platform, err = runtime.ChoosePlatform(cfg.Sandbox.Platform, runtime.HostKVM()); err != nil {
		t.Fatal(err)
	}
	lim := resources.FromConfig(cfg.Sandbox)
	// The daemon's group holds this whole test process, whose race
	// detector needs several times a daemon's memory.
	lim.DaemonBytes = max(lim.DaemonBytes, 2<<30)
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	// The keeper's log and the gate process's, in daemon.log as ever.
	logf, err := os.OpenFile(filepath.Join(dir, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	return &Options{Dir: dir, Runsc: runsc, Moat: moatBin, Plan: plan, Guest: &guestspec.Spec{},
		Log: slog.New(slog.NewTextHandler(logf, nil)), LogOut: logf, ImageRef: rec.Image,
		Limits: &lim, Network: NetworkOptions{Config: cfg.Network}}
}

func readRecord(t *testing.T, dir string) *state.Record {
	t.Helper()
	rec, err := state.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// editConfig changes the sandbox's configuration snapshot, which the
// gate process reads, past the CLI's checks.
func editConfig(t *testing.T, dir string, edit func(*config.Config)) {
	t.Helper()
	err := state.Update(dir, func(r *state.Record) error {
		cfg, err := r.Snapshot()
		if err != nil {
			return err
		}
		edit(&cfg)
		r.Config, err = json.Marshal(cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// processesOf are the processes whose command line names dir (the gate
// process, the shim, runsc), waiting a little for a shim that is
// ending.
func processesOf(dir string) []string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []string
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil || e.Name() == "self" {
				continue
			}
			if c := string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})); strings.Contains(c, dir) {
				left = append(left, e.Name()+": "+c)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cgroupsOf are the directories of the sandbox's cgroup and its
// daemon's in any hierarchy under /sys/fs/cgroup: moat/<name>-<hash> and
// moat/<name>-<hash>.daemon, where hash is the first 4 bytes of the
// SHA-256 of the state dir (as resources names them). Bounded in depth.
func cgroupsOf(dir string) []string {
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	id := filepath.Base(dir) + "-" + hex.EncodeToString(sum[:4])
	var left []string
	filepath.WalkDir("/sys/fs/cgroup", func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return nil
		}
		if rel, _ := filepath.Rel("/sys/fs/cgroup", p); strings.Count(rel, "/") >= 6 {
			return filepath.SkipDir
		}
		if filepath.Base(filepath.Dir(p)) == "moat" && (e.Name() == id || e.Name() == id+".daemon") {
			left = append(left, p)
			return filepath.SkipDir
		}
		return nil
	})
	return left
}

func logSize(dir string) int64 {
	fi, err := os.Stat(filepath.Join(dir, "daemon.log"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logSince is daemon.log from offset on: what this run logged.
func logSince(dir string, offset int64) string {
	b, _ := os.ReadFile(filepath.Join(dir, "daemon.log"))
	return string(b[min(offset, int64(len(b))):])
}

func logTail(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "daemon.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-40):], "\n")
}

// runBounded runs cmd, killing it after limit.
func runBounded(cmd *exec.Cmd, limit time.Duration) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		cmd.Process.Signal(unix.SIGKILL)
		<-done
		return fmt.Errorf("killed after %v", limit)
	}
}
