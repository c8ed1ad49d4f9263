package daemon

import (
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/disk"
)

// DiskStatus is the writable layer's use for status, of a running
// sandbox (shimPID > 0: its mount is read) or a stopped one (its image's
// superblock); nil without an image or when it cannot be read (status
// shows what it can).
func DiskStatus(dir string, shimPID int) *control.Disk {
	u, err := disk.Stat(dir, shimPID)
	if err != nil || u == nil {
		return nil
	}
	return &control.Disk{LimitBytes: u.LimitBytes, UsedBytes: u.UsedBytes, HostBytes: u.HostBytes}
}
