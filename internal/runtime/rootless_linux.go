package runtime

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// guestWrites are the host image's paths the guest's init writes at every
// start (internal/guest): a directory to make files in, or a file it
// rewrites in place.
//
// Rootless, the host's files belong to the host's root, whom the user
// namespace cannot map: the guest sees them as nobody's and even its
// root may not write them, nor make a file in their directories, so
// overlayfs never copies them up. The shim copies these few up itself,
// into the upper layer before it is mounted, as the namespace's root, who
// is the guest's root: the guest then owns them as it would with sudo.
// The rest of the host's system stays read-only (see the docs).
var guestWrites = []string{
	"etc/sudoers.d/",
	"etc/hosts",
	"etc/hostname",
	"etc/ssl/certs/",
	"etc/ssl/certs/ca-certificates.crt",
	"usr/local/share/ca-certificates/",
	"etc/pki/tls/certs/",
	"etc/pki/ca-trust/source/anchors/",
}

// copyUpForGuest copies paths (guestWrites) of the host's root host up
// into upper (the state dir's upper/, whose subdirectories are the host
// directories' upper layers), each ancestor directory with the host's
// mode. A path the upper layer already has (a copy of an earlier start,
// the guest's own file, a whiteout) is left as it is.
func copyUpForGuest(host, upper string, paths []string) error {
	for _, w := range paths {
		rel := strings.TrimSuffix(w, "/")
		fi, err := os.Lstat(filepath.Join(host, rel))
		if err != nil {
			continue // not on this host: the guest makes it in a directory it owns, or goes without
		}
		parts := strings.Split(rel, "/")
		for i := 1; i < len(parts); i++ {
			if err := mkdirLike(host, filepath.Join(parts[:i]...), upper); err != nil {
				return err
			}
		}
		dst := filepath.Join(upper, rel)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		switch {
		case fi.IsDir():
			err = mkdirLike(host, rel, upper)
		case fi.Mode().IsRegular():
			err = copyFile(filepath.Join(host, rel), dst, fi.Mode().Perm())
		}
		if err != nil {
			return fmt.Errorf("copying /%s up for the guest: %w", rel, err)
		}
	}
	return nil
}

// mkdirLike makes upper/rel, if missing, with host/rel's permissions.
func mkdirLike(host, rel, upper string) error {
	dst := filepath.Join(upper, rel)
	if _, err := os.Lstat(dst); err == nil {
		return nil
	}
	fi, err := os.Stat(filepath.Join(host, rel))
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return os.Chmod(dst, fi.Mode().Perm())
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}
