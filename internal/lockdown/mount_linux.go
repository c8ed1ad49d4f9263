//go:build amd64 || arm64

package lockdown

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// stageDirs are where the new root's tmpfs is mounted while it is built.
// Any existing directory does: the mount lives only in this process's mount
// namespace and is gone from view after pivot_root. The bind sources are
// cloned before, so covering one of them (t.TempDir is under /tmp) hides
// nothing.
var stageDirs = []string{"/tmp", "/mnt", "/run"}

// bindAttrs are the mount attributes of every bind: nothing in a bind can
// raise privileges, be a device, or run.
const bindAttrs = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC

// noMountSetattr makes enterRoot take the path for kernels before 5.12,
// which lack mount_setattr(2); tests set it to cover that path here.
var noMountSetattr bool

// haveMountSetattr probes for mount_setattr(2): on an invalid fd a kernel
// that has it answers EBADF, one that does not ENOSYS.
func haveMountSetattr() bool {
	if noMountSetattr {
		return false
	}
	err := unix.MountSetattr(-1, "", unix.AT_EMPTY_PATH, &unix.MountAttr{})
	return !errors.Is(err, unix.ENOSYS)
}

// clonedBind is a bind's source, detached from the host's tree and ready to
// be attached in the new root.
type clonedBind struct {
	Bind
	fd  int
	dir bool
}

// enterRoot makes a fresh tmpfs holding only binds the process's root.
func enterRoot(binds []Bind) error {
	// Without this, mounts below would propagate back to the host's
	// namespace if / is shared (systemd makes it so).
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / recursively private: %w (is the process in its own mount namespace, as root?)", err)
	}
	setattr := haveMountSetattr()
	clones, err := cloneBinds(binds, setattr)
	defer func() {
		for _, c := range clones {
			unix.Close(c.fd)
		}
	}()
	if err != nil {
		return err
	}
	stage, err := mountStage()
	if err != nil {
		return err
	}
	for _, c := range clones {
		if err := attach(stage, c, setattr); err != nil {
			return err
		}
	}
	if err := pivot(stage); err != nil {
		return err
	}
	// The root itself holds only mount points; nothing may be created
	// in it.
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("remounting the new root read-only: %w", err)
	}
	return nil
}

// cloneBinds takes a detached copy (open_tree OPEN_TREE_CLONE) of each
// bind's source so that nothing after depends on host paths. With
// mount_setattr the copy is recursive, like rbind, and gets its flags here
// on every mount in it; without, it is the one mount, and attach sets its
// flags with a remount, which reaches no submount: so none is taken.
func cloneBinds(binds []Bind, setattr bool) ([]clonedBind, error) {
	var out []clonedBind
	flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC)
	if setattr {
		flags |= unix.AT_RECURSIVE
	}
	for _, b := range binds {
		fd, err := unix.OpenTree(unix.AT_FDCWD, b.Path, flags)
		if err != nil {
			return out, fmt.Errorf("cloning bind %s (open_tree needs Linux 5.2): %w", b.Path, err)
		}
		out = append(out, clonedBind{Bind: b, fd: fd})
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return out, fmt.Errorf("reading bind %s: %w", b.Path, err)
		}
		out[len(out)-1].dir = st.Mode&unix.S_IFMT == unix.S_IFDIR
		if !setattr {
			continue
		}
		attr := unix.MountAttr{Attr_set: bindAttrs}
		if !b.Writable {
			attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
			return out, fmt.Errorf("setting mount flags of bind %s: %w", b.Path, err)
		}
	}
	return out, nil
}

// mountStage mounts the new root's tmpfs on the first stage directory that
// exists and returns it.
func mountStage() (string, error) {
	for _, dir := range stageDirs {
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
			continue
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
			return "", fmt.Errorf("mounting the new root's tmpfs on %s: %w", dir, err)
		}
		return dir, nil
	}
	return "", fmt.Errorf("mounting the new root: none of %v is a directory to mount it on", stageDirs)
}

// attach creates c's mount point under stage at c's own path and moves the
// clone there.
func attach(stage string, c clonedBind, setattr bool) error {
	target := filepath.Join(stage, c.Path)
	if err := mkdirAll(filepath.Dir(target)); err != nil {
		return fmt.Errorf("creating the parents of bind %s: %w", c.Path, err)
	}
	if c.dir {
		if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating the mount point of bind %s: %w", c.Path, err)
		}
	} else {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return fmt.Errorf("creating the mount point of bind %s: %w", c.Path, err)
		}
		f.Close()
	}
	if err := unix.MoveMount(c.fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching bind %s: %w", c.Path, err)
	}
	if setattr {
		return nil
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if !c.Writable {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("setting mount flags of bind %s: %w", c.Path, err)
	}
	return nil
}

// mkdirAll is os.MkdirAll with modes that do not depend on the umask: the
// jailed uid must be able to walk to its binds.
func mkdirAll(dir string) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if err := mkdirAll(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.Chmod(dir, 0o755)
}

// pivot makes stage the root and drops the old one from the namespace. The
// pivot_root(".", ".") form (pivot_root(2)) needs no directory for the old
// root: it is stacked on the new one and detached at once.
func pivot(stage string) error {
	if err := unix.Chdir(stage); err != nil {
		return fmt.Errorf("entering the new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivoting into the new root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering the new root: %w", err)
	}
	return nil
}
