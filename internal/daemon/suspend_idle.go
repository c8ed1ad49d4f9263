package daemon

import (
	"context"
	"errors"
	"fmt"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/state"
)

// Idle parking: what the idle timeout does, [sandbox] idle_action. With
// "suspend" the sandbox keeps its processes through the park and the
// next command resumes it; with "stop" it is stopped as before. Unset,
// it suspends when the state's filesystem has room for the image, else
// stops; the keeper decides, since only it can see that filesystem, and
// logs which and why.

// idleReserveBytes is the free space an idle suspend leaves on the
// state's filesystem: the image must never take the last of a disk that
// the user's other work (and this sandbox's disk image) also needs.
const idleReserveBytes = 1 << 30

// unknownGuestBytes stands for the guest's memory when its cgroup cannot
// say: the default memory ceiling, an image's upper bound.
const unknownGuestBytes = 4 << 30

// idleParking decides what the idle timeout does: the configured action
// (config.IdleSuspend, config.IdleStop, or "" for the default), the
// state filesystem's free bytes and the guest's memory in use (0:
// unknown), an upper bound of the image's size. why is for the log.
func idleParking(action string, freeBytes, guestBytes uint64) (suspend bool, why string) {
	if action == config.IdleStop {
		return false, "idle_action is stop"
	}
	if guestBytes == 0 {
		guestBytes = unknownGuestBytes
	}
	need := guestBytes + idleReserveBytes
	if freeBytes < need {
		return false, fmt.Sprintf("the state's filesystem has %d MiB free, less than the guest's %d MiB in use and a reserve of %d MiB",
			freeBytes>>20, guestBytes>>20, idleReserveBytes>>20)
	}
	if action == config.IdleSuspend {
		return true, "idle_action is suspend"
	}
	return true, fmt.Sprintf("idle_action is unset and the state's filesystem has room (%d MiB free for %d MiB in use)", freeBytes>>20, guestBytes>>20)
}

// errIdleStop is the keeper's answer to an idle suspend it decided
// against (idleParking).
var errIdleStop = errors.New("the keeper decided to stop, not suspend")

// parkIdle ends an idle sandbox, in the gate process: suspended when the
// keeper agrees and the checkpoint succeeds, else stopped.
func (d *daemon) parkIdle(ctx context.Context) {
	ended, saved, err := d.suspendSandbox(ctx, true)
	switch {
	case err == nil:
		d.log.Info("idle: sandbox suspended", "sessions_ended", ended, "image_bytes", saved.ImageBytes)
		return
	case errors.Is(err, errIdleStop):
	default:
		d.log.Warn("idle: the suspend failed; stopping instead", "err", err)
	}
	d.requestStop(state.StopIdle, nil)
}
