package daemon

import (
	"context"
	"time"

	"moat.dev/moat/internal/exemap"
)

// Both processes of the daemon idle for most of a sandbox's life with a
// fraction of the binary in use; package initialisation and the start
// mapped much more of it. They hand those pages back to the page cache
// (internal/exemap) once the sandbox runs, once the host's tools have
// answered (the keeper's last work of a start), each time the last
// session ends (the gate process), and every textReleaseEvery for what a
// collection or a request mapped since.

// textReleaseEvery is how often the keeper and the gate process hand back
// the binary's pages. A release costs what runs next a minor fault per
// window of pages it touches, all from the page cache: once a minute is
// nothing to a busy gate and keeps an idle one from creeping back up.
const textReleaseEvery = time.Minute

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

// releaseText hands the binary's pages back now and then every
// textReleaseEvery until ctx ends.
func (d *daemon) releaseText(ctx context.Context) {
	d.text.Release()
	d.text.ReleaseEvery(ctx, textReleaseEvery)
}
