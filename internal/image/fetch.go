package image

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

var errNoImage = errors.New("archive holds no image")

// platform is the only one moat runs: the sandbox kernel (gVisor) is amd64.
var platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Pull fetches ref from its registry and unpacks it. Registries on loopback are spoken to over
// plain HTTP (a local registry has no certificate to show); everything else over HTTPS.
//
// Pulls are anonymous. Reading the user's docker config would mean a root daemon executing
// whatever docker-credential-* helper that config names; private registries can be served by
// `docker save` + Import until moat has its own credential story.
func (s *Store) Pull(ctx context.Context, ref string, progress io.Writer) (*Image, error) {
	r, err := parseRef(ref)
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	progressf(progress, "pulling %s", r.Name())
	img, err := remote.Image(r,
		remote.WithContext(ctx),
		remote.WithPlatform(platform),
	)
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("pulling %s: reading manifest digest: %w", ref, err)
	}
	out, err := s.add(ctx, img, ref, r.Name(), d.String(), progress)
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	return out, nil
}

// parseRef parses ref, marking loopback registries insecure (plain HTTP).
func parseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("parsing image reference: %w", err)
	}
	if !isLoopback(r.Context().RegistryStr()) {
		return r, nil
	}
	return name.ParseReference(ref, name.Insecure)
}

// isLoopback reports whether a registry host[:port] is this machine. Only loopback: a registry
// elsewhere on the network gets no exemption from TLS.
func isLoopback(registry string) bool {
	host := registry
	if h, _, err := net.SplitHostPort(registry); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Import loads an image archive: a `docker save` tarball (manifest.json) or an OCI image layout
// tarball (oci-layout, index.json), optionally gzip-compressed. The format is detected from the
// content, not the file name. Archives that hold both (docker 25 and later) are read as
// docker-save, which carries the repo tags.
func (s *Store) Import(ctx context.Context, archive string, progress io.Writer) (*Image, error) {
	img, err := s.importArchive(ctx, archive, progress)
	if err != nil {
		return nil, fmt.Errorf("importing %s: %w", archive, err)
	}
	return img, nil
}

func (s *Store) importArchive(ctx context.Context, archive string, progress io.Writer) (*Image, error) {
	open := opener(archive)
	kind, err := sniff(open)
	if err != nil {
		return nil, err
	}
	switch kind {
	case formatDocker:
		return s.importDocker(ctx, open, progress)
	case formatOCI:
		return s.importOCI(ctx, open, progress)
	default:
		return nil, fmt.Errorf("not an image archive: found neither manifest.json (docker save) nor index.json (OCI layout)")
	}
}

type format int

const (
	formatUnknown format = iota
	formatDocker
	formatOCI
)

// opener opens the archive, transparently gunzipping it. It is called once per file the
// docker-save reader looks up, so it must be cheap and repeatable.
func opener(archive string) tarball.Opener {
	return func() (io.ReadCloser, error) {
		f, err := os.Open(archive)
		if err != nil {
			return nil, err
		}
		br := bufio.NewReader(f)
		magic, _ := br.Peek(2)
		if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
			zr, err := gzip.NewReader(br)
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("reading gzip header: %w", err)
			}
			return readCloser{zr, f}, nil
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil // the *os.File itself, so tar can seek past file bodies
	}
}

type readCloser struct {
	io.Reader
	f *os.File
}

func (r readCloser) Close() error { return r.f.Close() }

// archiveName is a tar member name as the formats define them: relative, "./" tolerated.
func archiveName(n string) string {
	return path.Clean(strings.TrimPrefix(n, "/"))
}

func sniff(open tarball.Opener) (format, error) {
	rc, err := open()
	if err != nil {
		return formatUnknown, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	kind := formatUnknown
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return kind, nil
		}
		if err != nil {
			return formatUnknown, fmt.Errorf("reading archive: %w", err)
		}
		switch archiveName(hdr.Name) {
		case "manifest.json":
			return formatDocker, nil
		case "index.json", "oci-layout":
			kind = formatOCI // keep looking: a docker-save manifest.json may follow
		}
	}
}

func (s *Store) importDocker(ctx context.Context, open tarball.Opener, progress io.Writer) (*Image, error) {
	m, err := tarball.LoadManifest(open)
	if err != nil {
		return nil, fmt.Errorf("reading manifest.json: %w", err)
	}
	if len(m) == 0 {
		return nil, errNoImage
	}
	var tag *name.Tag
	ref := ""
	if tags := m[0].RepoTags; len(tags) > 0 {
		t, err := name.NewTag(tags[0])
		if err != nil {
			return nil, fmt.Errorf("parsing repo tag %q: %w", tags[0], err)
		}
		tag, ref = &t, tags[0]
	} else if len(m) > 1 {
		return nil, fmt.Errorf("archive holds %d images and the first has no tag; save them one per archive", len(m))
	}
	if len(m) > 1 {
		progressf(progress, "archive holds %d images; importing the first, %s", len(m), ref)
	}
	img, err := tarball.Image(open, tag)
	if err != nil {
		return nil, fmt.Errorf("reading image: %w", err)
	}
	d, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("reading image config: %w", err)
	}
	nm := ref
	if tag != nil {
		nm = tag.Name()
	} else {
		ref = importPrefix + d.Hex[:12]
		nm = ref
	}
	progressf(progress, "importing %s (docker save archive)", ref)
	return s.add(ctx, img, ref, nm, d.String(), progress)
}

// importOCI unpacks the layout into a temp dir (the layout reader needs random access by blob
// path) and reads the image for our platform from it.
func (s *Store) importOCI(ctx context.Context, open tarball.Opener, progress io.Writer) (*Image, error) {
	dir, err := os.MkdirTemp(s.tmpDir(), "oci-")
	if err != nil {
		return nil, fmt.Errorf("creating temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := unpackLayout(ctx, open, dir); err != nil {
		return nil, err
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("reading OCI layout: %w", err)
	}
	img, desc, err := pickImage(idx, 0)
	if err != nil {
		return nil, err
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("reading manifest digest: %w", err)
	}
	ref, nm := layoutRef(desc.Annotations)
	if ref == "" {
		ref = importPrefix + d.Hex[:12]
		nm = ref
	}
	progressf(progress, "importing %s (OCI layout archive)", ref)
	return s.add(ctx, img, ref, nm, d.String(), progress)
}

// unpackLayout copies an OCI layout tarball's directories and regular files into dir. Nothing
// else belongs in a layout; anything else is refused, so no symlink ever exists under dir and
// plain path operations on confined names stay inside it.
func unpackLayout(ctx context.Context, open tarball.Opener, dir string) error {
	rc, err := open()
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(&countingReader{r: rc, ctx: ctx})
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading archive: %w", err)
		}
		rel, err := confinePath(hdr.Name)
		if err != nil {
			return fmt.Errorf("archive entry %q: %w", hdr.Name, err)
		}
		p := filepath.Join(dir, filepath.FromSlash(rel))
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o700)
		case tar.TypeReg:
			err = writeBlob(p, tr)
		case tar.TypeXGlobalHeader:
		default:
			err = fmt.Errorf("has type %q, which an OCI layout never holds: %w", hdr.Typeflag, ErrUnsafeArchive)
		}
		if err != nil {
			return fmt.Errorf("archive entry %q: %w", hdr.Name, err)
		}
	}
}

func writeBlob(p string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// pickImage finds the image for our platform, descending into nested indexes (containerd and
// buildx export an index per multi-arch image). Entries without a platform are accepted: a
// single-image layout rarely says what it is for.
func pickImage(idx v1.ImageIndex, depth int) (v1.Image, v1.Descriptor, error) {
	if depth > 4 { // real layouts nest once; anything deeper is a loop or a trap
		return nil, v1.Descriptor{}, fmt.Errorf("OCI layout nests indexes too deeply")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Descriptor{}, fmt.Errorf("reading OCI index: %w", err)
	}
	for _, desc := range im.Manifests {
		if desc.Platform != nil && !desc.Platform.Satisfies(platform) {
			continue // another architecture, or an attestation ("unknown/unknown")
		}
		switch {
		case desc.MediaType.IsImage():
			img, err := idx.Image(desc.Digest)
			if err != nil {
				return nil, desc, fmt.Errorf("reading image %s: %w", desc.Digest, err)
			}
			return img, desc, nil
		case desc.MediaType.IsIndex():
			child, err := idx.ImageIndex(desc.Digest)
			if err != nil {
				return nil, desc, fmt.Errorf("reading index %s: %w", desc.Digest, err)
			}
			img, cdesc, err := pickImage(child, depth+1)
			if errors.Is(err, errNoImage) {
				continue
			}
			if cdesc.Annotations == nil { // the name lives on the outer entry
				cdesc.Annotations = desc.Annotations
			}
			return img, cdesc, err
		}
	}
	return nil, v1.Descriptor{}, fmt.Errorf("%w for %s", errNoImage, platform.String())
}

// layoutRef reads the image's name from the annotations exporters put on index entries. The OCI
// ref.name is often just a tag ("latest"), which names no repository, so it is used only when it
// looks like a full reference.
func layoutRef(ann map[string]string) (ref, normalized string) {
	for _, key := range []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"} {
		v := ann[key]
		if v == "" || !strings.ContainsAny(v, "/:") {
			continue
		}
		if r, err := name.ParseReference(v); err == nil {
			return v, r.Name()
		}
	}
	return "", ""
}
