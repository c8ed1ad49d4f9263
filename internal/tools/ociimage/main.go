// Command ociimage packs a root filesystem directory into a single-layer OCI image layout tarball
// that `moat image import` accepts. scripts/debian-image.sh uses it to turn a debootstrap tree into
// the Debian image the opt-in end-to-end test runs apt in.
//
//	go run ./internal/tools/ociimage ROOTFS OUT.tar REF
//
// It exists because the host has no docker or buildah to do this, and because `tar -C ROOTFS`
// would carry the device nodes debootstrap makes under /dev, which moat's importer refuses (a
// device node in the shared layer cache would be a host device). The tree is walked without
// following symlinks and written with its own owners, modes (setuid included, sudo needs it),
// symlinks, hard links and file capabilities; owner names are left out so the host's passwd never
// leaks into the image. Entries under /dev are dropped (the sandbox provides /dev), and so are
// sockets and fifos anywhere, each with a note on stderr.
//
// REF is recorded as the layout's io.containerd.image.name annotation, which the importer takes
// as the image's name, and its tag as org.opencontainers.image.ref.name, as the OCI spec intends.
package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: ociimage ROOTFS OUT.tar REF\n  e.g. ociimage /tmp/rootfs debian.tar moat-test/debian:bookworm")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(rootfs, out, ref string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("parsing reference %q: %w", ref, err)
	}
	// Scratch space beside OUT, so the final rename stays on one filesystem.
	work, err := os.MkdirTemp(filepath.Dir(out), ".ociimage-")
	if err != nil {
		return fmt.Errorf("creating work dir: %w", err)
	}
	defer os.RemoveAll(work)

	start := time.Now()
	layerPath := filepath.Join(work, "layer.tar.gz")
	n, err := writeLayer(rootfs, layerPath)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "ociimage: packed %d entries from %s in %.1fs\n", n, rootfs, time.Since(start).Seconds())

	// Already gzip: LayerFromFile hashes it as is instead of compressing it again.
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("reading layer: %w", err)
	}
	img, err := image(layer)
	if err != nil {
		return err
	}
	p, err := layout.Write(filepath.Join(work, "layout"), empty.Index)
	if err != nil {
		return fmt.Errorf("creating OCI layout: %w", err)
	}
	err = p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": tag.TagStr(),
	}), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}))
	if err != nil {
		return fmt.Errorf("writing OCI layout: %w", err)
	}
	tmp := filepath.Join(work, "image.tar")
	if err := tarDir(string(p), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("moving image into place: %w", err)
	}
	d, _ := img.Digest()
	fmt.Fprintf(os.Stderr, "ociimage: wrote %s (%s, %s)\n", out, tag, d)
	return nil
}

// image wraps the layer in an OCI manifest and config. The environment is Debian's default PATH:
// the sandbox's sessions read it from the image config.
func image(layer v1.Layer) (v1.Image, error) {
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	base, err := mutate.ConfigFile(base, &v1.ConfigFile{
		OS:           "linux",
		Architecture: "amd64",
		Created:      v1.Time{Time: time.Now().UTC().Truncate(time.Second)},
		Config: v1.Config{
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cmd: []string{"/bin/bash"},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("writing image config: %w", err)
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{CreatedBy: "moat scripts/debian-image.sh", Created: v1.Time{Time: time.Now().UTC().Truncate(time.Second)}},
	})
	if err != nil {
		return nil, fmt.Errorf("adding layer: %w", err)
	}
	return img, nil
}

// writeLayer writes rootfs as a gzip-compressed tar to path and returns the number of entries.
func writeLayer(rootfs, path string) (int, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, fmt.Errorf("creating layer file: %w", err)
	}
	defer f.Close()
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	w := &walker{root: rootfs, tw: tw, links: map[inode]string{}}
	if err := filepath.WalkDir(rootfs, w.visit); err != nil {
		return 0, fmt.Errorf("packing %s: %w", rootfs, err)
	}
	if err := tw.Close(); err != nil {
		return 0, fmt.Errorf("finishing layer tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return 0, fmt.Errorf("finishing layer gzip: %w", err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("writing layer file: %w", err)
	}
	return w.n, nil
}

type inode struct{ dev, ino uint64 }

type walker struct {
	root  string
	tw    *tar.Writer
	links map[inode]string // first name seen for each multiply-linked file
	n     int
}

func (w *walker) visit(path string, d fs.DirEntry, err error) error {
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(w.root, path)
	if err != nil {
		return err
	}
	rel = filepath.ToSlash(rel)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fmt.Errorf("inspecting %s: %w", rel, err)
	}
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, 0),
		Format:  tar.FormatPAX,
	}
	if rel == "." {
		// The image's "/": whatever mode the build directory had (mktemp makes 0700), the
		// guest's root must be 0755 and root's, or the agent user can reach nothing.
		hdr.Name, hdr.Mode, hdr.Uid, hdr.Gid = "./", 0o755, 0, 0
	}
	if rel == "dev" || strings.HasPrefix(rel, "dev/") {
		if rel != "dev" {
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return fs.SkipDir
			}
			return nil // device nodes and /dev/fd-style symlinks: the sandbox provides /dev
		}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		if hdr.Name != "./" {
			hdr.Name += "/"
		}
		return w.write(hdr, "")
	case unix.S_IFLNK:
		target, err := os.Readlink(path)
		if err != nil {
			return fmt.Errorf("reading symlink %s: %w", rel, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return w.write(hdr, "")
	case unix.S_IFREG:
		if st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := w.links[key]; ok {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				return w.write(hdr, "")
			}
			w.links[key] = rel
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
		if capability, ok := fileCapability(path); ok {
			hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": capability}
		}
		return w.write(hdr, path)
	default:
		fmt.Fprintf(os.Stderr, "ociimage: skipping %s: not a file, directory or symlink\n", rel)
		return nil
	}
}

// write adds one entry, with the contents of body for regular files.
func (w *walker) write(hdr *tar.Header, body string) error {
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("writing %s: %w", hdr.Name, err)
	}
	w.n++
	if body == "" {
		return nil
	}
	f, err := os.Open(body)
	if err != nil {
		return fmt.Errorf("reading %s: %w", hdr.Name, err)
	}
	defer f.Close()
	// Exactly Size bytes: a file that changed under us must fail the build, not corrupt the tar.
	if _, err := io.CopyN(w.tw, f, hdr.Size); err != nil {
		return fmt.Errorf("reading %s: %w", hdr.Name, err)
	}
	return nil
}

// fileCapability returns the file's security.capability xattr (ping and friends carry one instead
// of being setuid).
func fileCapability(path string) (string, bool) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, "security.capability", buf)
	if err != nil || n <= 0 {
		if err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.ENOTSUP) {
			fmt.Fprintf(os.Stderr, "ociimage: reading capabilities of %s: %v\n", path, err)
		}
		return "", false
	}
	return string(buf[:n]), true
}

// tarDir writes the OCI layout directory as an uncompressed tar of directories and regular files,
// the only entry types an OCI layout holds (and the only ones the importer accepts in one).
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("creating %s: %w", out, err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: info.ModTime().Truncate(time.Second)}
		switch {
		case d.IsDir():
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
			return tw.WriteHeader(hdr)
		case d.Type().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			src, err := os.Open(path)
			if err != nil {
				return err
			}
			defer src.Close()
			_, err = io.CopyN(tw, src, hdr.Size)
			return err
		default:
			return fmt.Errorf("%s: unexpected file type in OCI layout", rel)
		}
	})
	if err != nil {
		return fmt.Errorf("archiving OCI layout: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archiving OCI layout: %w", err)
	}
	return f.Close()
}
