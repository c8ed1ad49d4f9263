package daemon

import (
	"context"

	"moat.dev/moat/internal/exemap"
)

// Both processes of the daemon idle for most of a sandbox's life with a
// fraction of the binary in use; package initialisation and the start
// mapped much more of it. They hand those pages back to the page cache
// (internal/exemap) once the sandbox runs, once the host's tools have
// answered (the keeper's last work of a start), and after garbage
// collections. Not when a session ends: the next one would fault back in
// what the last mapped, a few milliseconds on every `moat exec`.

// findText finds this process's mappings of the binary (d.text): early,
// before any goroutine that releases them, and in the gate process before
// its jail hides /proc. Without them nothing is handed back, which costs
// memory, not correctness.
func (d *daemon) findText() {
	text, err := exemap.Find()
	if err != nil {
		d.log.Warn("the binary's pages stay mapped while idle", "err", err)
		return
	}
	d.text = text
}

// releaseText hands the binary's pages back now and after collections
// until ctx ends.
func (d *daemon) releaseText(ctx context.Context) {
	d.text.Release()
	d.text.ReleaseAfterGC(ctx)
}
