package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
)

// startState restores only a sandbox that was suspended (or whose suspend
// or resume was cut short) and has a whole image and its guest's binary;
// every other start boots afresh and removes what a suspend kept, stale
// from then on.
func TestStartState(t *testing.T) {
	for _, tc := range []struct {
		prev         string
		image, bin   bool
		want         string
		restore, old bool // restore: Plan.Restore set; old: the image is still there
	}{
		{state.StateSuspended, true, true, state.StateResuming, true, true},
		{state.StateSuspending, true, true, state.StateResuming, true, true},
		{state.StateResuming, true, true, state.StateResuming, true, true},
		{state.StateSuspended, false, true, state.StateStarting, false, false},
		{state.StateSuspended, true, false, state.StateStarting, false, false},
		// A stopped (or crashed running) sandbox's image is stale: the
		// guest ran on after it, or booted afresh since.
		{state.StateStopped, true, true, state.StateStarting, false, false},
		{state.StateRunning, true, true, state.StateStarting, false, false},
		{state.StateCreated, false, false, state.StateStarting, false, false},
	} {
		dir := t.TempDir()
		if tc.image {
			os.MkdirAll(runtime.SuspendDir(dir), 0o700)
			os.WriteFile(filepath.Join(runtime.SuspendDir(dir), "checkpoint.img"), []byte("x"), 0o600)
		}
		if tc.bin {
			os.WriteFile(runtime.GuestBinary(dir), []byte("moat"), 0o755)
		}
		d := &daemon{o: Options{Dir: dir, Plan: &runtime.Plan{StateDir: dir, Moat: "/usr/bin/moat"}}, log: slog.New(slog.DiscardHandler)}
		got := d.startState(&state.Record{State: tc.prev})
		if got != tc.want {
			t.Errorf("%s image=%v bin=%v: state %q, want %q", tc.prev, tc.image, tc.bin, got, tc.want)
		}
		if restoring := d.o.Plan.Restore != ""; restoring != tc.restore {
			t.Errorf("%s image=%v bin=%v: restore %q, want %v", tc.prev, tc.image, tc.bin, d.o.Plan.Restore, tc.restore)
		}
		if tc.restore && d.o.Plan.Moat != runtime.GuestBinary(dir) {
			t.Errorf("%s: a restore mounts %s, not the guest's kept binary", tc.prev, d.o.Plan.Moat)
		}
		if _, ok := runtime.ImageSize(dir); ok != tc.old {
			t.Errorf("%s image=%v bin=%v: image kept %v, want %v", tc.prev, tc.image, tc.bin, ok, tc.old)
		}
	}
}

func TestStoppedState(t *testing.T) {
	for reason, want := range map[string]string{
		state.StopSuspend: state.StateSuspended,
		state.StopUser:    state.StateStopped,
		state.StopIdle:    state.StateStopped,
		state.StopError:   state.StateStopped,
		state.StopCrash:   state.StateStopped,
	} {
		if got := stoppedState(reason); got != want {
			t.Errorf("stoppedState(%q) = %q, want %q", reason, got, want)
		}
	}
}

func TestIdleParking(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		action      string
		free, guest uint64
		want        bool
	}{
		{"", 8 << 30, 100 * mib, true},                    // room: the default suspends
		{"", idleReserveBytes + 50*mib, 100 * mib, false}, // no room for the image and the reserve
		{"", idleReserveBytes + 100*mib, 100 * mib, true}, // just enough
		{"", 2 << 30, 0, false},                           // unknown guest: the default ceiling must fit
		{"suspend", idleReserveBytes, 100 * mib, false},   // asked for, but the disk would fill
		{"suspend", 8 << 30, 100 * mib, true},
		{"stop", 1 << 40, 100 * mib, false}, // asked to stop, whatever the room
	} {
		got, why := idleParking(tc.action, tc.free, tc.guest)
		if got != tc.want || why == "" {
			t.Errorf("idleParking(%q, %d MiB free, %d MiB in use) = %v (%s), want %v", tc.action, tc.free/mib, tc.guest/mib, got, why, tc.want)
		}
	}
}
