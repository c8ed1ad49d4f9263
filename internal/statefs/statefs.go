// Package statefs is what fork and the snapshot commands do to a
// sandbox's state directory: copy its writable layer and image, flush a
// copy to disk, and swap one state for another.
//
// moat does it itself with root. Without root, a sandbox's layer and
// image belong in part to the user's subordinate ids (what the shim, as
// root of its user namespace, and the guest made), which the user can
// neither read nor move; then moat-sandbox does the same work as root of
// such a namespace (Role, Main), so that both ways run this code.
package statefs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Role is moat-sandbox's role that runs one operation as root of a user
// namespace with the user's subordinate ids: `__userns-files OP ARGS`.
const Role = "__userns-files"

// Copy copies the directory tree src to dst, which must not exist, with
// cp -a: owners, modes, times, hard links, an overlay's whiteouts and its
// xattrs kept, reflinked where the filesystem can.
func Copy(src, dst string) error {
	if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("copying %s: %s is there already", src, dst)
	}
	out, err := exec.Command("cp", "-a", "--reflink=auto", "-T", "--", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp -a %s: %v: %s", src, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Flush flushes every regular file and directory under root and returns
// the space the files under root take on disk (Allocated): a copy is
// renamed into place only once its data is on disk, so a host crash
// cannot leave one that lists whole but reads as zeroes.
func Flush(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n += blocks(d)
		if !d.Type().IsRegular() && !d.IsDir() {
			return nil
		}
		return SyncPath(path)
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// SyncPath flushes one file or directory.
func SyncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Allocated is the space the files under root take on disk, as far as
// the caller can see them.
func Allocated(root string) int64 {
	var n int64
	filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil {
			n += blocks(d)
		}
		return nil
	})
	return n
}

// blocks is the space d takes on disk; 0 when it cannot be read.
func blocks(d fs.DirEntry) int64 {
	if fi, err := d.Info(); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			return st.Blocks * 512
		}
	}
	return 0
}

// Swap moves dir's items (names in it) into old and stage's into dir; on
// a failure it moves them back. An item missing from stage is then
// missing from dir. A directory moved to another parent needs its
// owner's say (its ".." changes), hence the namespace without root.
func Swap(dir, stage, old string, items []string) error {
	var moved []string
	undo := func() {
		for _, name := range moved {
			os.RemoveAll(filepath.Join(dir, name))
			os.Rename(filepath.Join(old, name), filepath.Join(dir, name))
		}
	}
	for _, name := range items {
		if err := os.Rename(filepath.Join(dir, name), filepath.Join(old, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			undo()
			return err
		}
		moved = append(moved, name)
	}
	for _, name := range items {
		if err := os.Rename(filepath.Join(stage, name), filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			undo()
			return err
		}
	}
	return SyncPath(dir)
}

// CopyArgs are moat-sandbox's arguments that run Copy in Role.
func CopyArgs(src, dst string) []string { return []string{Role, "cp", src, dst} }

// FlushArgs are moat-sandbox's arguments that run Flush in Role.
func FlushArgs(root string) []string { return []string{Role, "flush", root} }

// SwapArgs are moat-sandbox's arguments that run Swap in Role.
func SwapArgs(dir, stage, old string, items []string) []string {
	return append([]string{Role, "swap", dir, stage, old}, items...)
}

// Main runs the operation args name (after Role), in a namespace whose
// maps are written; Flush prints the space on stdout. It returns the
// process's exit code.
func Main(args []string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "moat:", err)
		return 1
	}
	switch {
	case len(args) == 3 && args[0] == "cp":
		if err := Copy(args[1], args[2]); err != nil {
			return fail(err)
		}
	case len(args) == 2 && args[0] == "flush":
		n, err := Flush(args[1])
		if err != nil {
			return fail(err)
		}
		fmt.Println(n)
	case len(args) >= 4 && args[0] == "swap":
		if err := Swap(args[1], args[2], args[3], args[4:]); err != nil {
			return fail(err)
		}
	default:
		fmt.Fprintf(os.Stderr, "moat-sandbox %s: %q is not an operation of it\n", Role, args)
		return 2
	}
	return 0
}

// ParseFlushed is the space Main's flush printed.
func ParseFlushed(out string) (int64, error) {
	return strconv.ParseInt(strings.TrimSpace(out), 10, 64)
}
