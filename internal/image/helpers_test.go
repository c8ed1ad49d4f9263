package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// testMtime is a fixed, sub-second-free time so mtime comparisons are exact.
var testMtime = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

// ent is one tar entry of a test layer. The zero value of optional fields means a sensible default.
type ent struct {
	name   string
	typ    byte // tar.Type*; 0 means a regular file
	body   string
	link   string
	mode   int64
	uid    int
	gid    int
	major  int64
	minor  int64
	xattrs map[string]string
}

func dir(name string, mode int64) ent { return ent{name: name, typ: tar.TypeDir, mode: mode} }
func file(name, body string) ent      { return ent{name: name, body: body, mode: 0o644} }
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func hardlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeLink, link: target, mode: 0o644}
}
func whiteout(dirPath, name string) ent { return file(filepath.Join(dirPath, ".wh."+name), "") }

// layerTar builds an uncompressed layer tar from entries, in order.
func layerTar(t testing.TB, entries ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		hdr := &tar.Header{
			Name:     e.name,
			Typeflag: typ,
			Linkname: e.link,
			Mode:     e.mode,
			Uid:      e.uid,
			Gid:      e.gid,
			Devmajor: e.major,
			Devminor: e.minor,
			ModTime:  testMtime,
			Format:   tar.FormatPAX,
		}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("writing tar header %q: %v", e.name, err)
		}
		if typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t testing.TB, entries ...ent) v1.Layer {
	t.Helper()
	b := layerTar(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatalf("making layer: %v", err)
	}
	return l
}

// imageOf stacks layers (lowest first) into an image with a recognizable config.
func imageOf(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatalf("appending layers: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "MOAT_TEST=1"},
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{"echo hi"},
		WorkingDir: "/work",
		User:       "1000:1000",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatalf("setting config: %v", err)
	}
	return img
}

// dockerArchive writes img as a `docker save` tarball. An empty tag writes no RepoTags.
func dockerArchive(t testing.TB, img v1.Image, tag string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "docker.tar")
	var ref name.Reference
	if tag != "" {
		ref = mustTag(t, tag)
	} else {
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		// A digest reference writes no RepoTags, like `docker save IMAGE-ID`.
		ref, err = name.NewDigest("example.invalid/untagged@" + d.String())
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := tarball.WriteToFile(p, ref, img); err != nil {
		t.Fatalf("writing docker archive: %v", err)
	}
	return p
}

func mustTag(t testing.TB, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// ociArchive writes img as an OCI image layout and tars it up.
func ociArchive(t testing.TB, img v1.Image, annotations map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(annotations)); err != nil {
		t.Fatalf("writing layout: %v", err)
	}
	p := filepath.Join(dir, "oci.tar")
	tarDir(t, string(lp), p)
	return p
}

// tarDir packs src's contents (relative names) into a tar file at dst.
func tarDir(t testing.TB, src, dst string) {
	t.Helper()
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == src {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("tarring %s: %v", src, err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func gzipFile(t testing.TB, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	dst := src + ".gz"
	if err := os.WriteFile(dst, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return dst
}

func openStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func digestOf(t testing.TB, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func configDigestOf(t testing.TB, img v1.Image) string {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func diffIDOf(t testing.TB, l v1.Layer) string {
	t.Helper()
	d, err := l.DiffID()
	if err != nil {
		t.Fatal(err)
	}
	return d.Hex
}

// dirNames lists a directory's entry names, or nil if it does not exist.
func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
