package cli

import (
	"fmt"
	"io"
	"os/exec"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/disk"
)

// writableLayer is what `moat up --fresh` removes from a stopped
// sandbox's state dir: the disk image that holds the layer, and the
// layer's directories of sandboxes without one (disk = "unlimited").
var writableLayer = []string{"upper", "work", "merged", "root", disk.ImageName, disk.MountName}

// diskColumn is `moat list`'s DISK: used/limit, or "-" for a sandbox
// without a limit or one never started.
func diskColumn(d *control.Disk) string {
	if d == nil {
		return "-"
	}
	return disk.FormatBytes(d.UsedBytes) + "/" + disk.FormatBytes(d.LimitBytes)
}

// printDisk is `moat status`'s disk line.
func printDisk(out io.Writer, d *control.Disk) {
	if d == nil {
		return
	}
	pct := 0.0
	if d.LimitBytes > 0 {
		pct = 100 * float64(d.UsedBytes) / float64(d.LimitBytes)
	}
	fmt.Fprintf(out, "disk:       %s used of %s (%.0f%%); the image takes %s on the host\n",
		disk.FormatBytes(d.UsedBytes), disk.FormatBytes(d.LimitBytes), pct, disk.FormatBytes(d.HostBytes))
}

// stoppedDisk is the disk use of a sandbox that is not running, read from
// its image.
func stoppedDisk(dir string) *control.Disk { return daemon.DiskStatus(dir, 0) }

// diskChecks are `moat doctor`'s checks for the disk images that hold
// sandboxes' writable layers (internal/disk).
func diskChecks() []check {
	return []check{
		{"loop devices (for [sandbox] disk)", func() (bool, string) { return fileExists("/dev/loop-control"), "" },
			"load the loop module: modprobe loop (or set [sandbox] disk = \"unlimited\")"},
		{"mkfs.ext4, e2fsck, resize2fs (for [sandbox] disk)", func() (bool, string) {
			for _, tool := range []string{"mkfs.ext4", "e2fsck", "resize2fs"} {
				if _, err := exec.LookPath(tool); err != nil {
					return false, tool + " not found"
				}
			}
			return true, ""
		}, "apt-get install e2fsprogs (or set [sandbox] disk = \"unlimited\")"},
	}
}
