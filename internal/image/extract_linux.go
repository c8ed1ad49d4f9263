package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Whiteout names from the OCI image spec ("Representing Changes").
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh." // AUFS bookkeeping (.wh..wh.plnk, .wh..wh.aufs); meaningless to overlayfs
	whiteoutOpaque = ".wh..wh..opq"
)

// The attribute that marks a directory whose lower-layer contents overlayfs must hide. overlayfs
// reads trusted.overlay.opaque, which only root of the host may set; mounted with userxattr, as
// the shim mounts in a user namespace, it reads user.overlay.opaque instead, which root of that
// namespace may set. The whiteout device (char 0/0) is the same in both: the kernel lets anyone
// make that one (Linux 5.8 on).
const (
	overlayOpaqueXattr     = "trusted.overlay.opaque"
	overlayUserOpaqueXattr = "user.overlay.opaque"
)

// extractor unpacks one layer tar into a directory it holds open.
//
// Every path is resolved from the root fd one component at a time with
// openat(O_NOFOLLOW|O_DIRECTORY), and every final component is created or changed with an *at
// call that does not follow symlinks either. So an entry can never be placed through a symlink,
// whether the symlink came from this layer ("link -> /etc" then "link/passwd") or was planted
// some other way. Resolving names with filepath.Join and then calling os.* functions would follow
// symlinks and is exactly the bug this code exists to avoid.
type extractor struct {
	root   int    // O_DIRECTORY fd of the layer root
	chown  bool   // only root can give files away; unprivileged runs keep their own uid
	opaque string // overlayOpaqueXattr, or overlayUserOpaqueXattr for a rootless store

	// dirTimes are applied after the last entry: creating a child changes its parent's mtime.
	dirTimes []dirTime
}

type dirTime struct {
	rel string
	ts  []unix.Timespec
}

// extractLayer unpacks the tar stream r into dir, which must exist and be empty, marking opaque
// directories with the attribute opaque. On error dir holds a partial layer; the caller removes
// it.
func extractLayer(r io.Reader, dir, opaque string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dir, err)
	}
	defer unix.Close(fd)
	x := &extractor{root: fd, chown: os.Geteuid() == 0, opaque: opaque}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading layer tar: %w", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		if err := x.place(hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	return x.finishDirs()
}

func (x *extractor) place(hdr *tar.Header, r io.Reader) error {
	rel, err := confinePath(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid >= math.MaxUint32 || hdr.Gid >= math.MaxUint32 {
		// -1 would mean "leave unchanged" to chown, silently keeping the file ours.
		return fmt.Errorf("bad owner %d:%d: %w", hdr.Uid, hdr.Gid, ErrUnsafeArchive)
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("names the layer root but is not a directory: %w", ErrUnsafeArchive)
		}
		if err := x.meta(x.root, hdr); err != nil {
			return err
		}
		x.dirTimes = append(x.dirTimes, dirTime{"", times(hdr)})
		return nil
	}
	parent, base, err := x.walk(rel, true)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(parent, base)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.mkdir(parent, base, rel, hdr)
	case tar.TypeReg:
		return x.file(parent, base, hdr, r)
	case tar.TypeSymlink:
		return x.symlink(parent, base, hdr)
	case tar.TypeLink:
		return x.hardlink(parent, base, rel, hdr)
	case tar.TypeChar:
		if hdr.Devmajor == 0 && hdr.Devminor == 0 {
			// Already an overlayfs whiteout (some tools export layers straight from overlay
			// upper dirs); it can only hide, never grant access.
			return x.mkWhiteout(parent, base)
		}
		fallthrough
	case tar.TypeBlock, tar.TypeFifo:
		// A device node in the cache would be a host device reachable by whoever can open the
		// file; images have no business shipping them (the sandbox provides /dev).
		return fmt.Errorf("is a device node or fifo (type %q), which moat refuses to create: %w", hdr.Typeflag, ErrUnsafeArchive)
	default:
		return fmt.Errorf("has unsupported tar type %q: %w", hdr.Typeflag, ErrUnsafeArchive)
	}
}

// walk opens the directory that holds rel's last component and returns it with that component.
// With create, missing parents are made as tar does (0755, root-owned). It refuses to pass
// through a symlink.
func (x *extractor) walk(rel string, create bool) (parent int, base string, err error) {
	elems := strings.Split(rel, "/")
	base = elems[len(elems)-1]
	fd, err := unix.FcntlInt(uintptr(x.root), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("duplicating layer root fd: %w", err)
	}
	for i, e := range elems[:len(elems)-1] {
		next, err := openDir(fd, e)
		if errors.Is(err, unix.ENOENT) && create {
			next, err = mkdirImplicit(fd, e)
		}
		if err != nil {
			err = explainWalk(fd, e, strings.Join(elems[:i+1], "/"), err)
			unix.Close(fd)
			return -1, "", err
		}
		unix.Close(fd)
		fd = next
	}
	return fd, base, nil
}

func openDir(dirfd int, name string) (int, error) {
	return unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

func mkdirImplicit(dirfd int, name string) (int, error) {
	if err := unix.Mkdirat(dirfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	fd, err := openDir(dirfd, name)
	if err != nil {
		return -1, err
	}
	// Explicit because the umask may have narrowed it, and a 0700 /usr would lock the sandbox's
	// unprivileged user out of the image.
	if err := unix.Fchmod(fd, 0o755); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// explainWalk turns the errno of a failed parent open into a message about the archive.
func explainWalk(dirfd int, name, path string, err error) error {
	var st unix.Stat_t
	if serr := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			return fmt.Errorf("goes through symlink %q; moat never follows symlinks while unpacking: %w", path, ErrUnsafeArchive)
		case unix.S_IFDIR:
		default:
			return fmt.Errorf("parent %q is not a directory", path)
		}
	}
	return fmt.Errorf("opening parent %q: %w", path, err)
}

// clearEntry removes whatever is at parent/base so a new entry can take its place, as tar does. An
// existing directory is kept when keepDir (a directory entry for an existing directory updates
// it); otherwise only an empty one is removed, since layers never legitimately replace a
// populated directory with a file within a single tar.
func clearEntry(parent int, base string, keepDir bool) (isDir bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("inspecting existing entry: %w", err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return true, nil
		}
		if err := unix.Unlinkat(parent, base, unix.AT_REMOVEDIR); err != nil {
			return false, fmt.Errorf("replacing existing directory: %w", err)
		}
		return false, nil
	}
	if err := unix.Unlinkat(parent, base, 0); err != nil {
		return false, fmt.Errorf("replacing existing entry: %w", err)
	}
	return false, nil
}

func (x *extractor) mkdir(parent int, base, rel string, hdr *tar.Header) error {
	isDir, err := clearEntry(parent, base, true)
	if err != nil {
		return err
	}
	if !isDir {
		if err := unix.Mkdirat(parent, base, 0o700); err != nil {
			return fmt.Errorf("creating directory: %w", err)
		}
	}
	fd, err := openDir(parent, base)
	if err != nil {
		return fmt.Errorf("opening directory: %w", err)
	}
	defer unix.Close(fd)
	if err := x.meta(fd, hdr); err != nil {
		return err
	}
	x.dirTimes = append(x.dirTimes, dirTime{rel, times(hdr)})
	return nil
}

func (x *extractor) file(parent int, base string, hdr *tar.Header, r io.Reader) error {
	if _, err := clearEntry(parent, base, false); err != nil {
		return err
	}
	// 0600 until meta sets the real mode: nothing else can see the file half-written anyway,
	// but there is no reason to create it wider.
	fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating file: %w", err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	if _, err := io.Copy(f, r); err != nil {
		return fmt.Errorf("writing file: %w", err)
	}
	if err := x.meta(fd, hdr); err != nil {
		return err
	}
	return setTimes(parent, base, times(hdr))
}

func (x *extractor) symlink(parent int, base string, hdr *tar.Header) error {
	if _, err := clearEntry(parent, base, false); err != nil {
		return err
	}
	// The target is stored verbatim, absolute or not: it is resolved inside the sandbox, against
	// the sandbox's root, never by the host (walk refuses to traverse it).
	if err := unix.Symlinkat(hdr.Linkname, parent, base); err != nil {
		return fmt.Errorf("creating symlink: %w", err)
	}
	if x.chown {
		if err := unix.Fchownat(parent, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return x.ownerError("setting symlink owner", hdr, err)
		}
	}
	return setTimes(parent, base, times(hdr))
}

func (x *extractor) hardlink(parent int, base, rel string, hdr *tar.Header) error {
	target, err := confinePath(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if target == "" {
		return fmt.Errorf("hard link to the layer root: %w", ErrUnsafeArchive)
	}
	if target == rel {
		return nil // a link to itself: nothing to do, and clearing first would destroy it
	}
	tparent, tbase, err := x.walk(target, false)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	defer unix.Close(tparent)
	if _, err := clearEntry(parent, base, false); err != nil {
		return err
	}
	// Flags 0: if the target is a symlink, link the symlink itself rather than what it points to.
	if err := unix.Linkat(tparent, tbase, parent, base, 0); err != nil {
		return fmt.Errorf("creating hard link to %q: %w", hdr.Linkname, err)
	}
	return nil
}

// whiteout converts an OCI whiteout entry into overlayfs's form.
func (x *extractor) whiteout(parent int, base string) error {
	if base == whiteoutOpaque {
		err := unix.Fsetxattr(parent, x.opaque, []byte("y"), 0)
		if errors.Is(err, unix.ENOTSUP) && x.opaque == overlayUserOpaqueXattr {
			return fmt.Errorf("marking directory opaque (%s): the image store's filesystem holds no user xattrs, which moat without sudo needs; put MOAT_HOME on one that does (ext4, xfs, btrfs): %w", x.opaque, err)
		}
		if err != nil {
			return fmt.Errorf("marking directory opaque (%s): %w", x.opaque, err)
		}
		return nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("whiteout names no file: %w", ErrUnsafeArchive)
	}
	return x.mkWhiteout(parent, name)
}

// mkWhiteout makes the 0/0 character device with which overlayfs hides a lower file.
func (x *extractor) mkWhiteout(parent int, name string) error {
	if _, err := clearEntry(parent, name, false); err != nil {
		return err
	}
	if err := unix.Mknodat(parent, name, unix.S_IFCHR, int(unix.Mkdev(0, 0))); err != nil {
		return fmt.Errorf("creating whiteout for %q (needs root): %w", name, err)
	}
	return nil
}

// ownerError explains a failed chown. In a user namespace (a store without root) EINVAL means
// the image gives an id the namespace does not map: the user's subordinate range is too small.
func (x *extractor) ownerError(what string, hdr *tar.Header, err error) error {
	if errors.Is(err, unix.EINVAL) && x.opaque == overlayUserOpaqueXattr {
		return fmt.Errorf("%s %d:%d: moat without sudo maps only the ids its subordinate range covers (/etc/subuid, /etc/subgid), and this image uses one past it; as root, give the user a larger range (usermod --add-subuids, --add-subgids), or import and run the image with sudo: %w", what, hdr.Uid, hdr.Gid, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// meta sets owner, mode and xattrs on an open file or directory, in that order: chown clears
// setuid/setgid bits and file capabilities, so they are set after it.
func (x *extractor) meta(fd int, hdr *tar.Header) error {
	if x.chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return x.ownerError("setting owner", hdr, err)
		}
	}
	// The raw tar mode's low 12 bits are exactly the unix permission bits, setuid, setgid and
	// sticky included.
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return fmt.Errorf("setting mode: %w", err)
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || !allowedXattr(name) {
			continue
		}
		err := unix.Fsetxattr(fd, name, []byte(v), 0)
		if errors.Is(err, unix.ENOTSUP) {
			continue // the cache's filesystem cannot hold it; the file still works without
		}
		if err != nil {
			return fmt.Errorf("setting xattr %s: %w", name, err)
		}
	}
	return nil
}

// allowedXattr decides which archive xattrs are kept. user.* and file capabilities are what images
// carry (ping's cap_net_raw). trusted.* and user.overlay.* are dropped: they steer overlayfs
// itself (redirect, origin, metacopy, opaque), and only this package may set those, from
// whiteouts it has checked. security.selinux and friends belong to the host's policy, not the
// image's.
func allowedXattr(name string) bool {
	if name == "security.capability" {
		return true
	}
	return strings.HasPrefix(name, "user.") && !strings.HasPrefix(name, "user.overlay.")
}

func times(hdr *tar.Header) []unix.Timespec {
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	return []unix.Timespec{timespec(atime), timespec(hdr.ModTime)}
}

// timespec avoids Time.UnixNano, which overflows outside 1678–2262 and tar allows any date.
func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

func setTimes(parent int, base string, ts []unix.Timespec) error {
	if err := unix.UtimesNanoAt(parent, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting times: %w", err)
	}
	return nil
}

// finishDirs sets directory times last-first, once nothing will be created inside them.
func (x *extractor) finishDirs() error {
	for i := len(x.dirTimes) - 1; i >= 0; i-- {
		d := x.dirTimes[i]
		if d.rel == "" {
			if err := unix.UtimesNanoAt(x.root, ".", d.ts, 0); err != nil {
				return fmt.Errorf("setting times on layer root: %w", err)
			}
			continue
		}
		parent, base, err := x.walk(d.rel, false)
		if err == nil {
			err = setTimes(parent, base, d.ts)
			unix.Close(parent)
		}
		if errors.Is(err, unix.ENOENT) {
			continue // a later whiteout or entry replaced it
		}
		if err != nil {
			return fmt.Errorf("entry %q: %w", d.rel, err)
		}
	}
	return nil
}
