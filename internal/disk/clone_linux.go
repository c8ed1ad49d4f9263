package disk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Clone copies the file src to dst (which must not exist), mode 0600: a
// reflink (FICLONE) where the filesystem has them, which shares src's
// blocks until either side writes, else a sparse copy that keeps src's
// holes as holes (a 20 GiB disk image holding 500 MiB copies 500 MiB).
// It reports whether it reflinked. Used by moat fork, on a stopped
// sandbox's files, so nothing writes src during the copy.
func Clone(src, dst string) (reflinked bool, err error) {
	fi, err := os.Stat(src)
	if err != nil {
		return false, err
	}
	if reflinked, err = copySparse(src, dst, uint64(fi.Size())); err != nil {
		if !errors.Is(err, fs.ErrExist) { // dst is someone else's: keep it
			os.Remove(dst)
		}
		return false, fmt.Errorf("copying %s: %w", src, err)
	}
	return reflinked, nil
}
