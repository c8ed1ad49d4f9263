package disk

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ReadImage reads what Decide needs of the sandbox's image; Exists is false
// when there is none yet.
func ReadImage(stateDir string) (Image, Superblock, error) {
	f, err := os.Open(filepath.Join(stateDir, ImageName))
	if errors.Is(err, os.ErrNotExist) {
		return Image{}, Superblock{}, nil
	}
	if err != nil {
		return Image{}, Superblock{}, fmt.Errorf("opening the sandbox's disk image: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Image{}, Superblock{}, fmt.Errorf("reading the sandbox's disk image: %w", err)
	}
	b := make([]byte, SuperblockSize)
	if _, err := f.ReadAt(b, SuperblockOffset); err != nil {
		return Image{}, Superblock{}, fmt.Errorf("reading the superblock of %s: %w", f.Name(), err)
	}
	sb, err := ParseSuperblock(b)
	if err != nil {
		return Image{}, Superblock{}, fmt.Errorf("reading %s: %w (moat up --fresh discards the sandbox's writable layer and makes a new one)", f.Name(), err)
	}
	return Image{Exists: true, SizeBytes: uint64(fi.Size()), UsedBytes: sb.UsedBytes()}, sb, nil
}

// FreeBytes is the space an unprivileged user could still write on the
// filesystem that holds dir.
func FreeBytes(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("reading the free space of %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// Prepare makes the sandbox's image what want (bytes; 0: not configured)
// asks before the shim mounts it, and returns its size. It runs in the
// daemon, before the shim, so that its errors reach the user who ran
// `moat up`, and while nothing has the image mounted (the daemon lock).
// templates is a directory of pristine images by size (see create); ""
// makes each image with mkfs.ext4.
func Prepare(stateDir string, want uint64, templates string) (Action, uint64, error) {
	img, sb, err := ReadImage(stateDir)
	if err != nil {
		return Keep, 0, err
	}
	// The image is sparse: if the host's filesystem filled up anyway
	// (other writers), its blocks could not be allocated, the guest's
	// filesystem saw I/O errors and the kernel marked it. Repaired before
	// it is mounted again, rather than left to fail the guest later.
	if img.Exists && sb.Errors {
		if err := run("e2fsck", "-f", "-y", filepath.Join(stateDir, ImageName)); err != nil && !exitedWith(err, 1) {
			return Keep, 0, fmt.Errorf("repairing the sandbox's disk image: %w", err)
		}
		if img, _, err = ReadImage(stateDir); err != nil {
			return Keep, 0, err
		}
	}
	var def uint64
	if !img.Exists && want == 0 {
		free, err := FreeBytes(stateDir)
		if err != nil {
			return Keep, 0, err
		}
		if def, err = Default(free); err != nil {
			return Keep, 0, fmt.Errorf("sizing the writable layer on the filesystem holding %s: %w", stateDir, err)
		}
	}
	act, size, err := Decide(img, want, def)
	if err != nil {
		return act, size, err
	}
	path := filepath.Join(stateDir, ImageName)
	switch act {
	case Create:
		err = create(path, size, templates)
	case Grow, Shrink:
		err = resize(path, img.SizeBytes, size)
	}
	if err != nil {
		return act, size, err
	}
	return act, size, nil
}

// mkfsArgs make a new image sparse. mke2fs discards a regular file (it
// punches a hole in the whole file, cheap on a new one), knows that it
// then reads as zeros, and so marks every inode table zeroed without
// writing it: with lazy_itable_init instead, the kernel's ext4lazyinit
// thread would zero them in the background after every new sandbox's
// first mount. The journal is not written either (lazy_journal_init),
// the file reading as zeros. No blocks are reserved for root: the guest's
// root is the gofer, which writes as the host's root anyway.
var mkfsArgs = []string{"-q", "-F", "-m", "0", "-L", "moat", "-E", "lazy_journal_init=1"}

// create makes a new image at path. mkfs.ext4 runs once per size on a
// host: its image is kept in templates, and each new sandbox's image is a
// sparse copy of it (a few MiB of metadata), because starting mkfs on
// every first start cost about 100 ms of a loaded host's cold start,
// where the copy costs a few. Sandboxes then share their filesystem's
// UUID, which ext4 does not mind (nothing mounts them by UUID).
func create(path string, size uint64, templates string) error {
	// Made under another name and renamed: a killed mkfs or copy leaves
	// no image that a later start would take for a filesystem.
	tmp := path + ".new"
	os.Remove(tmp)
	var err error
	if templates == "" {
		err = mkfs(tmp, size)
	} else {
		var tpl string
		if tpl, err = template(templates, size); err == nil {
			_, err = copySparse(tpl, tmp, size)
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("creating the sandbox's disk image: %w", err)
	}
	return nil
}

// mkfs makes a new image at path, which must not exist.
func mkfs(path string, size uint64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(size))
	f.Close()
	if err == nil {
		err = run("mkfs.ext4", append(mkfsArgs, path)...)
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// template is the pristine image of size in dir, made if missing (under
// a name of its own, then renamed: two daemons making it at once each
// make a whole one). One that is not a whole, empty filesystem of that
// size is made again.
func template(dir string, size uint64) (string, error) {
	path := filepath.Join(dir, "ext4-"+strconv.FormatUint(size, 10)+".img")
	if f, err := os.Open(path); err == nil {
		b := make([]byte, SuperblockSize)
		_, err = f.ReadAt(b, SuperblockOffset)
		fi, serr := f.Stat()
		f.Close()
		sb, perr := ParseSuperblock(b)
		if err == nil && serr == nil && perr == nil && uint64(fi.Size()) == size &&
			sb.Blocks*sb.BlockSize == size && sb.UsedBytes() < 1<<20 {
			return path, nil
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	tmp := path + "." + strconv.Itoa(os.Getpid())
	os.Remove(tmp)
	if err := mkfs(tmp, size); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return path, nil
}

// copySparse copies src to dst (new), size bytes, copying only src's
// data and leaving its holes as holes: a reflink where the filesystem
// has them, else each data extent with copy_file_range. It reports
// whether it reflinked.
func copySparse(src, dst string, size uint64) (reflinked bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false, err
	}
	defer out.Close()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return true, nil
	}
	if err := out.Truncate(int64(size)); err != nil {
		return false, err
	}
	rfd, wfd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < int64(size); {
		data, err := unix.Seek(rfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return false, fmt.Errorf("reading the extents of %s: %w", src, err)
		}
		hole, err := unix.Seek(rfd, data, unix.SEEK_HOLE)
		if err != nil {
			return false, fmt.Errorf("reading the extents of %s: %w", src, err)
		}
		for r, w := data, data; r < hole; {
			n, err := unix.CopyFileRange(rfd, &r, wfd, &w, int(hole-r), 0)
			if err != nil || n == 0 {
				return false, fmt.Errorf("copying %s: %v", src, err)
			}
		}
		off = hole
	}
	return false, nil
}

// resize changes the image's size offline, the file first when it grows
// and last when it shrinks. Offline, because growing a mounted ext4 needs
// CAP_SYS_RESOURCE, which a root without it (in some containers) lacks,
// and shrinking one is not possible at all.
func resize(path string, from, to uint64) error {
	if to > from {
		if err := os.Truncate(path, int64(to)); err != nil {
			return fmt.Errorf("growing the sandbox's disk image: %w", err)
		}
	}
	// resize2fs works only on a filesystem checked since its last mount.
	// e2fsck exits 1 when it fixed something, which is still a success.
	if err := run("e2fsck", "-f", "-y", path); err != nil && !exitedWith(err, 1) {
		return fmt.Errorf("checking the sandbox's disk image before resizing it: %w", err)
	}
	if err := run("resize2fs", path, strconv.FormatUint(to>>10, 10)+"K"); err != nil {
		if to < from {
			return fmt.Errorf("%w: shrinking the sandbox's disk image to %s: %v", ErrBelowUse, FormatBytes(to), err)
		}
		return fmt.Errorf("growing the sandbox's disk image to %s: %w", FormatBytes(to), err)
	}
	if to < from {
		if err := os.Truncate(path, int64(to)); err != nil {
			return fmt.Errorf("shrinking the sandbox's disk image: %w", err)
		}
	}
	return nil
}

// run runs an e2fsprogs tool; its output is in the error.
func run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	if errors.Is(err, exec.ErrNotFound) {
		return fmt.Errorf("%s not found: install e2fsprogs (apt-get install e2fsprogs), or set [sandbox] disk = \"unlimited\"", name)
	}
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func exitedWith(err error, code int) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == code
}

// Mount attaches the sandbox's image to a loop device that detaches
// itself when unmounted, mounts it on the state directory's disk/ in the
// calling process's mount namespace, and returns the mount point. Call it only
// in a private mount namespace that dies with the sandbox (the shim's).
func Mount(stateDir string) (string, error) {
	path := filepath.Join(stateDir, ImageName)
	mnt := filepath.Join(stateDir, MountName)
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return "", err
	}
	img, _, err := ReadImage(stateDir)
	if err != nil {
		return "", err
	}
	if !img.Exists {
		return "", fmt.Errorf("the sandbox's disk image %s is missing", path)
	}
	if err := waitDetached(path, 5*time.Second); err != nil {
		return "", err
	}
	dev, fd, err := attach(path)
	if err != nil {
		return "", err
	}
	// Closed only once mounted: an autoclear device detaches when its
	// last opener lets go, and until the mount that is this fd. On a
	// failed mount, the close is what frees the device.
	defer unix.Close(fd)
	// discard: what the guest deletes is handed back to the host (the
	// loop driver punches holes in the file).
	if err := unix.Mount(dev, mnt, "ext4", unix.MS_NOATIME, "discard"); err != nil {
		return "", fmt.Errorf("mounting the sandbox's disk image (%s on %s): %w", dev, mnt, err)
	}
	if err := os.Chmod(mnt, 0o700); err != nil {
		return "", err
	}
	return mnt, nil
}

// attach gives the image a free loop device with LO_FLAGS_AUTOCLEAR: once
// the last user lets go of it, the kernel detaches it. It returns the
// device and an open fd on it, which keeps it until the mount holds it.
func attach(path string) (string, int, error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("opening /dev/loop-control (is the loop module loaded? try: modprobe loop): %w", err)
	}
	defer unix.Close(ctl)
	img, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("opening the sandbox's disk image: %w", err)
	}
	defer unix.Close(img)
	cfg := unix.LoopConfig{Fd: uint32(img), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}}
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], path)
	// Another process may take the free device between GET_FREE and
	// CONFIGURE (EBUSY): ask again, a bounded number of times.
	for try := 0; ; try++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("finding a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", -1, fmt.Errorf("opening %s: %w", dev, err)
		}
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if err == nil {
			return dev, fd, nil
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EBUSY) || try == 20 {
			return "", -1, fmt.Errorf("attaching the sandbox's disk image to %s: %w", dev, err)
		}
	}
}

// waitDetached waits (bounded) until no loop device still holds the
// image. The previous shim's namespaces are torn down by the kernel after
// it exits; mounting the same ext4 through a second device while the
// first still has it would corrupt it, so a device that stays is an error.
func waitDetached(path string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		dev := Holder(path)
		if dev == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the sandbox's disk image is still attached to %s after %s; is another moat process of this sandbox alive? (see: losetup -j %s)", dev, wait, path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Holder is the loop device (/dev/loopN) whose backing file is path, or "".
// The kernel names the backing file by its resolved path.
func Holder(path string) string {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		resolved = path
	}
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range devs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if name := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)"); name == path || name == resolved {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		}
	}
	return ""
}

// Stat is the sandbox's disk use. A running sandbox's filesystem is
// mounted only in its shim's namespace, reached through
// /proc/SHIM/root; a stopped one's is read from its superblock. It
// returns (nil, nil) for a sandbox without an image.
func Stat(stateDir string, shimPID int) (*Usage, error) {
	path := filepath.Join(stateDir, ImageName)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); errors.Is(err, unix.ENOENT) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("reading the sandbox's disk image: %w", err)
	}
	u := &Usage{LimitBytes: uint64(st.Size), HostBytes: uint64(st.Blocks) * 512}
	if shimPID > 0 {
		// Only while the image is mounted there: before, or once the shim
		// is gone, the same path is a plain directory on the host's own
		// filesystem, whose use is not the sandbox's.
		var fs unix.Statfs_t
		var dir, parent unix.Stat_t
		mnt := filepath.Join("/proc", strconv.Itoa(shimPID), "root", stateDir, MountName)
		if unix.Stat(mnt, &dir) == nil && unix.Stat(filepath.Dir(mnt), &parent) == nil && dir.Dev != parent.Dev &&
			unix.Statfs(mnt, &fs) == nil && fs.Type == unix.EXT4_SUPER_MAGIC {
			u.UsedBytes = (fs.Blocks - fs.Bfree) * uint64(fs.Bsize)
			return u, nil
		}
	}
	img, _, err := ReadImage(stateDir)
	if err != nil {
		return nil, err
	}
	u.UsedBytes = img.UsedBytes
	return u, nil
}
