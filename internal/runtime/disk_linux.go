package runtime

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"moat.dev/moat/internal/disk"
)

// PrepareDisk sizes the sandbox's disk image before the shim mounts it
// (disk.Prepare) and sets p.Disk. The daemon calls it while it holds the
// sandbox's lock and before the shim starts, so nothing has the image
// mounted and a refusal reaches the user as the start's error.
func PrepareDisk(p *Plan, log *slog.Logger) error {
	img := filepath.Join(p.StateDir, disk.ImageName)
	if os.Geteuid() != 0 {
		// Rootless: an ext4 image needs a loop device, which is root's,
		// and ext4 cannot be mounted in a user namespace.
		if !p.DiskUnlimited && p.DiskFrom != "" {
			return fmt.Errorf("sandbox.disk%s: a disk limit needs root (an ext4 image on a loop device); remove it or set disk = \"unlimited\" to run without sudo", from(p))
		}
		if _, err := os.Stat(img); err == nil {
			return fmt.Errorf("this sandbox's writable layer is in a disk image (%s), which only root can mount; start it with sudo, or make a new sandbox (moat destroy, then moat up) to run without sudo", img)
		}
		p.Disk = false
		return nil
	}
	if p.DiskUnlimited {
		if _, err := os.Stat(img); err == nil {
			return fmt.Errorf("sandbox.disk%s: \"unlimited\", but this sandbox's writable layer is already in its own disk image (%s); "+
				"set a size instead, or make a new sandbox (moat destroy, then moat up) to have none", from(p), img)
		}
		p.Disk = false
		return nil
	}
	act, size, err := disk.Prepare(p.StateDir, p.DiskLimit, p.DiskTemplates)
	if err != nil {
		if errors.Is(err, disk.ErrBelowUse) {
			return fmt.Errorf("sandbox.disk%s: %w (to shrink it: set it back, start the sandbox, delete files in it, then lower it)", from(p), err)
		}
		return fmt.Errorf("preparing the sandbox's disk image: %w", err)
	}
	if act != disk.Keep {
		log.Info("disk image", "action", act.String(), "size", disk.FormatBytes(size))
	}
	p.Disk = true
	return nil
}

func from(p *Plan) string {
	if p.DiskFrom == "" {
		return ""
	}
	return " (set in " + p.DiskFrom + ")"
}

// mountDisk mounts the disk image for the writable layer. A sandbox made
// before disk limits has its layer in the state dir: the first start with
// an image copies it in (cp -a keeps owners, modes, the overlay's
// whiteouts and its trusted.* attributes), then removes the old copy.
func (p *Plan) mountDisk() error {
	mnt, err := disk.Mount(p.StateDir)
	if err != nil {
		return err
	}
	for _, name := range []string{"upper", "root"} {
		old := filepath.Join(p.StateDir, name)
		if _, err := os.Lstat(old); err != nil {
			continue
		}
		dst := filepath.Join(mnt, name)
		if err := os.MkdirAll(dst, 0o700); err != nil {
			return err
		}
		out, err := exec.Command("cp", "-a", old+"/.", dst+"/").CombinedOutput()
		if err != nil {
			return fmt.Errorf("moving the writable layer of a sandbox made before disk limits (%s) into its disk image: %v: %s; "+
				"raise [sandbox] disk and start it again", old, err, strings.TrimSpace(string(out)))
		}
		if err := os.RemoveAll(old); err != nil {
			return fmt.Errorf("removing %s after copying it into the disk image: %w", old, err)
		}
	}
	// The old work dir is scratch by definition.
	os.RemoveAll(filepath.Join(p.StateDir, "work"))
	return nil
}
