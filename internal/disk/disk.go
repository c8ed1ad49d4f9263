// Package disk bounds a sandbox's writable layer on the host.
//
// Without it the guest's writes (its home, /tmp, what apt installs) went
// straight to the filesystem that holds moat's state, and one agent
// writing into its home filled that filesystem to 100%: every other
// sandbox on it then failed closed, and the host's own services with it.
// Each sandbox now keeps its writable layer in its own ext4
// filesystem image, disk.img in its state directory, loop-mounted by the
// shim under disk/ (upper/, work/ and, for the host image, root/). The
// guest sees ENOSPC in its own filesystem when the image is full; the
// host's filesystem and other sandboxes do not notice.
//
// Why an image and not a quota: project quotas need a filesystem mounted
// with prjquota (ext4 also needs the "project" and "quota" features set
// when it was made), which a stock Debian host's root filesystem is not,
// and turning them on means remounting the host's filesystem. Loop devices
// and mkfs.ext4 (e2fsprogs, which Debian installs as "required") are on
// every stock host. The image is sparse: the host gives it only what the
// guest writes, and the "discard" mount option hands back what the guest
// deletes.
//
// Fate-sharing: the loop device is attached with LO_FLAGS_AUTOCLEAR and
// mounted only in the shim's private mount namespace, so when the shim's
// namespaces die (a stop, a crash, a killed daemon) the kernel unmounts
// the filesystem and the loop device detaches itself. No cleanup code has
// to run; destroy removes disk.img with the state directory.
//
// This file is the pure part (sizes, decisions, the superblock); the I/O
// is in disk_linux.go.
package disk

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Names in a sandbox's state directory. They are on disk: frozen.
const (
	ImageName = "disk.img" // the filesystem image
	MountName = "disk"     // its mount point, in the shim's namespace only
)

// Sizes.
const (
	// DefaultMaxBytes caps the derived default: enough for a language
	// toolchain, its package caches and a few system packages installed
	// with apt, which is what agents put in their home and /usr.
	DefaultMaxBytes = 20 << 30
	// MinBytes is the smallest image: ext4 itself (journal, inode tables)
	// takes a few MiB of it, and a limit below this is a typo.
	MinBytes = 32 << 20
	// minDefaultBytes: a derived default below this means the host is
	// nearly full; a sandbox that runs out at once helps no one, so the
	// start is refused and the user asked to choose.
	minDefaultBytes = 1 << 30
)

// Default is the size of a new sandbox's image when [sandbox] disk is not
// set: half the space free on the filesystem that holds the state
// directory when the sandbox first starts, at most DefaultMaxBytes, in
// whole GiB. Half, so that one runaway guest leaves the host at least half
// of what it had; the image is sparse, so the other half is not taken
// from anyone until the guest writes it. Whole GiB, so that sandboxes
// made on the same host share the template their image is copied from.
func Default(freeBytes uint64) (uint64, error) {
	n := min(freeBytes/2, DefaultMaxBytes) &^ (1<<30 - 1)
	if n < minDefaultBytes {
		return 0, fmt.Errorf("%w: only %s free; free some space there, or set [sandbox] disk to choose a size",
			ErrHostFull, FormatBytes(freeBytes))
	}
	return n, nil
}

// Errors.
var (
	// ErrHostFull: no default size fits the host's free space.
	ErrHostFull = errors.New("too little free space for a sandbox's writable layer")
	// ErrBelowUse: the configured size is below what the guest uses.
	ErrBelowUse = errors.New("disk limit below what the sandbox already uses")
	// ErrNotExt4: disk.img is not an ext4 filesystem moat made.
	ErrNotExt4 = errors.New("not an ext4 filesystem image")
)

// Action is what Decide asks for.
type Action int

const (
	Keep   Action = iota // mount as it is
	Create               // make a new image
	Grow                 // extend the file, then the filesystem (offline)
	Shrink               // shrink the filesystem (offline), then the file
)

func (a Action) String() string {
	return [...]string{"keep", "create", "grow", "shrink"}[a]
}

// Image is what is known of a sandbox's image before its start.
type Image struct {
	Exists    bool
	SizeBytes uint64 // the file's size: the limit
	UsedBytes uint64 // in use inside, from the superblock
}

// Decide is what a start does with the image: want is [sandbox] disk (0:
// not set, then a new image gets def and an existing one keeps its size).
// It returns the action and the image's size after it.
func Decide(img Image, want, def uint64) (Action, uint64, error) {
	switch {
	case !img.Exists && want == 0:
		return Create, def, nil
	case !img.Exists:
		return Create, want, nil
	case want == 0 || want == img.SizeBytes:
		return Keep, img.SizeBytes, nil
	case want > img.SizeBytes:
		return Grow, want, nil
	case want < img.UsedBytes+slackBytes(want):
		return Keep, img.SizeBytes, fmt.Errorf("%w: disk = %s, but the sandbox already uses %s of its %s; raise disk, or delete files in the sandbox first",
			ErrBelowUse, FormatBytes(want), FormatBytes(img.UsedBytes), FormatBytes(img.SizeBytes))
	default:
		return Shrink, want, nil
	}
}

// slackBytes is room kept above the data when shrinking: ext4's own
// metadata grows with the data it describes, and a filesystem shrunk to
// exactly its data would fail the guest's next write.
func slackBytes(size uint64) uint64 { return max(size/20, 8<<20) }

// Superblock is what moat reads of an ext4 superblock.
type Superblock struct {
	BlockSize      uint64
	Blocks         uint64
	FreeBlocks     uint64
	OverheadBlocks uint64 // journal, bitmaps, inode tables; 0 when mke2fs did not record it
	// Errors: the kernel found the filesystem inconsistent (an I/O error,
	// as when the host's own disk filled under the sparse image).
	Errors bool
}

// SuperblockOffset is where the superblock starts in the image; it is
// SuperblockSize bytes long.
const (
	SuperblockOffset = 1024
	SuperblockSize   = 1024
)

// ParseSuperblock reads the fields moat needs from an ext4 superblock
// (b starts at SuperblockOffset). Layout: the kernel's struct
// ext4_super_block.
func ParseSuperblock(b []byte) (Superblock, error) {
	if len(b) < SuperblockSize {
		return Superblock{}, fmt.Errorf("%w: short superblock (%d bytes)", ErrNotExt4, len(b))
	}
	le := binary.LittleEndian
	if le.Uint16(b[0x38:]) != 0xEF53 {
		return Superblock{}, fmt.Errorf("%w: bad magic", ErrNotExt4)
	}
	logBS := le.Uint32(b[0x18:])
	if logBS > 6 { // 64 KiB is ext4's largest block
		return Superblock{}, fmt.Errorf("%w: block size 2^%d KiB", ErrNotExt4, logBS)
	}
	s := Superblock{
		BlockSize:      1024 << logBS,
		Blocks:         uint64(le.Uint32(b[0x4:])),
		FreeBlocks:     uint64(le.Uint32(b[0xC:])),
		OverheadBlocks: uint64(le.Uint32(b[0x248:])),
		Errors:         le.Uint16(b[0x3A:])&0x2 != 0, // s_state & EXT2_ERROR_FS
	}
	const incompat64bit = 0x80
	if le.Uint32(b[0x60:])&incompat64bit != 0 {
		s.Blocks |= uint64(le.Uint32(b[0x150:])) << 32
		s.FreeBlocks |= uint64(le.Uint32(b[0x158:])) << 32
	}
	if s.FreeBlocks > s.Blocks {
		return Superblock{}, fmt.Errorf("%w: %d free of %d blocks", ErrNotExt4, s.FreeBlocks, s.Blocks)
	}
	return s, nil
}

// UsedBytes is what the files inside take, as df counts it: the blocks
// neither free nor ext4's own overhead. The free count on disk is exact
// after an unmount, which is when moat reads it. resize2fs clears the
// overhead's record (the kernel writes it again at the next mount), so
// until then the overhead counts as used: more, never less.
func (s Superblock) UsedBytes() uint64 {
	used := s.Blocks - s.FreeBlocks
	if s.OverheadBlocks < used {
		used -= s.OverheadBlocks
	}
	return used * s.BlockSize
}

// Usage is a sandbox's disk use against its limit.
type Usage struct {
	LimitBytes uint64 // the image's size: [sandbox] disk
	UsedBytes  uint64 // what the guest's files take inside it
	HostBytes  uint64 // what the image takes on the host's filesystem
}

// FormatBytes writes n for a person: "1.5 GiB", "512 MiB", "0 B".
func FormatBytes(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f, i := float64(n), 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 || f >= 100 || f == float64(uint64(f)) {
		return fmt.Sprintf("%.0f %s", f, units[i])
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}
