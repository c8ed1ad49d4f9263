// Package image is moat's on-disk cache of OCI images.
//
// A sandbox's root filesystem is an overlay: one private writable upper layer over read-only lower
// layers that every sandbox shares. This package produces those lower layers. It takes an image from
// a registry (Pull) or from an archive made by `docker save` or an OCI layout tarball (Import),
// unpacks each layer once per diff ID into its own directory, converts OCI whiteouts into the form
// overlayfs understands, and records what the image is (its layers, its entrypoint, its environment)
// so the runtime can build a bundle without touching the network again.
//
// Image layers are hostile input (threat model 33): a layer is a tar file written by whoever built
// the image, and unpacking it runs as root on the host (or, for moat without sudo, as root of a
// user namespace with the user's subordinate ids: rootless_linux.go). Every entry is therefore placed with
// openat(2) walks that never follow a symlink, names are confined to the layer root, device nodes are
// refused, and any refusal fails the whole import without leaving a partial layer behind. See
// extract_linux.go.
//
// Layout under the store root (all 0700, owned by the user running moat):
//
//	images/<key>.json      one record per image reference (see Image)
//	layers/<hex>/          an unpacked layer, named by the sha256 of its uncompressed tar (diff ID)
//	layers/<hex>.json      size and provenance of that layer
//	locks/<hex>.lock       per-layer flock so two imports never unpack the same layer at once
//	lock                   store-wide flock: shared while importing, exclusive while removing
//	tmp/                   layers and archives being unpacked; renamed into place when complete
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

var (
	// ErrNotFound means no cached image matches the reference. The error's message says how to
	// get the image.
	ErrNotFound = errors.New("image not found")

	// ErrUnsafeArchive means an archive or layer tried to place something outside its root, or
	// held an entry moat refuses to create on the host (device nodes, content that does not match
	// its digest). The import was abandoned and nothing from it was kept.
	ErrUnsafeArchive = errors.New("unsafe image archive")
)

// recordSchema is the version of the image record format; bump it only with a migration.
const recordSchema = 1

// Image is one cached image. It is persisted as JSON in images/<key>.json.
//
// The JSON field names are frozen: records written by older moat versions must keep loading.
// Fields may be added, never renamed or removed.
type Image struct {
	Schema int `json:"schema"`

	// Ref is what the user named the image: the reference given to Pull, or for imports the first
	// repo tag in the archive, else "import:<first 12 hex digits of Digest>".
	Ref string `json:"ref"`

	// Name is Ref normalized (registry, repository and tag spelled out) so that "alpine" and
	// "index.docker.io/library/alpine:latest" are the same image. For imports without a tag it
	// equals Ref.
	Name string `json:"name"`

	// Digest identifies the image: the manifest digest for pulls and OCI layouts, the image
	// config digest for docker-save archives (what `docker images` calls the image ID; the
	// archive holds no manifest of its own to hash).
	Digest string `json:"digest"`

	// DiffIDs are the layers' uncompressed digests, lowest layer first. They name the layer
	// directories; Layers is derived from them whenever a record is loaded, so a store can move.
	DiffIDs []string `json:"diff_ids"`

	// Layers are the absolute paths of the unpacked layer directories, lowest first.
	Layers []string `json:"layers"`

	Config    Config `json:"config"`
	SizeBytes int64  `json:"size_bytes"` // uncompressed bytes of all layers' tar streams

	// Created is when this image was added to the store. Built is the creation time the image's
	// own config claims (zero for reproducible builds, and not to be trusted for anything).
	Created time.Time `json:"created"`
	Built   time.Time `json:"built,omitzero"`
}

// Config is the part of the OCI image config the runtime needs to start a process.
// JSON field names are frozen (see Image).
type Config struct {
	Env        []string `json:"env,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// LowerDir returns the layers in the form overlayfs's lowerdir= option wants: highest layer first,
// joined with ':'. Characters overlayfs treats as separators (':' and ',' and the escape '\') are
// backslash-escaped so an unusual store path cannot split into extra layers.
func (img *Image) LowerDir() string {
	esc := strings.NewReplacer(`\`, `\\`, `:`, `\:`, `,`, `\,`)
	dirs := make([]string, 0, len(img.Layers))
	for i := len(img.Layers) - 1; i >= 0; i-- {
		dirs = append(dirs, esc.Replace(img.Layers[i]))
	}
	return strings.Join(dirs, ":")
}

// ShortDigest is the first 12 hex digits of the digest, as people type it.
func (img *Image) ShortDigest() string { return shortHex(img.Digest) }

// Store is the on-disk image cache. It is safe for concurrent use by goroutines and by processes:
// all coordination is through files under the root.
type Store struct {
	root string

	// ns is set for a store without root (OpenRootless): unpacking and removing layers, whose
	// files belong to the image's ids mapped into the user's subordinate range, happen in a
	// child that is root of a user namespace.
	ns *namespace
	// opaque is the attribute that marks an opaque directory in the layers this process unpacks:
	// trusted.overlay.opaque, or user.overlay.opaque in that child.
	opaque string
}

// Open opens the store at root, creating it if needed.
//
// The root is forced to 0700 because unpacked layers keep their setuid bits and root ownership
// (sudo inside the sandbox needs them): a setuid-root binary in a directory any host user could
// reach would be a local privilege escalation. With the root closed, only the user running moat
// (and root) can reach those files, and they already hold the privileges the files grant. A store
// without root (OpenRootless) is closed the same way: its setuid files belong to the user's
// subordinate ids, which the user already commands.
//
// As root, a store of another user's is refused: moat without sudo made it (OpenRootless), its
// files belong to that user's subordinate ids and its opaque directories carry the attribute only
// a userxattr mount reads, so a root sandbox would see wrong owners and files its image deleted.
func Open(root string) (*Store, error) {
	return open(root, func(abs string, fi os.FileInfo) error {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && os.Geteuid() == 0 && st.Uid != 0 {
			return fmt.Errorf("image store %s belongs to uid %d: moat without sudo made it, for its own sandboxes; with sudo, use a store of root's (set MOAT_HOME to a directory of root's), or run moat without sudo", abs, st.Uid)
		}
		return nil
	})
}

// open opens the store at root; check, if set, vets the root directory before anything changes
// it.
func open(root string, check func(abs string, fi os.FileInfo) error) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("opening image store %s: %w", root, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("opening image store %s: %w", abs, err)
	}
	fi, err := os.Lstat(abs)
	if err != nil {
		return nil, fmt.Errorf("opening image store %s: %w", abs, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("opening image store %s: not a directory", abs)
	}
	if check != nil {
		if err := check(abs, fi); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(abs, 0o700); err != nil {
		return nil, fmt.Errorf("restricting image store %s to its owner: %w", abs, err)
	}
	s := &Store{root: abs, opaque: overlayOpaqueXattr}
	for _, d := range []string{s.imagesDir(), s.layersDir(), s.locksDir(), s.tmpDir()} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	return s, nil
}

// Root is the store's directory.
func (s *Store) Root() string { return s.root }

func (s *Store) imagesDir() string { return filepath.Join(s.root, "images") }
func (s *Store) layersDir() string { return filepath.Join(s.root, "layers") }
func (s *Store) locksDir() string  { return filepath.Join(s.root, "locks") }
func (s *Store) tmpDir() string    { return filepath.Join(s.root, "tmp") }

func (s *Store) layerDir(hex string) string { return filepath.Join(s.layersDir(), hex) }

// recordPath names an image's record by a hash of its normalized name: names hold '/' and ':',
// which would otherwise need an escaping scheme of their own.
func (s *Store) recordPath(name string) string {
	sum := sha256.Sum256([]byte(name))
	return filepath.Join(s.imagesDir(), hex.EncodeToString(sum[:16])+".json")
}

// normalize spells out a reference so different ways of writing it compare equal. Strings that
// are not references (e.g. "import:…") are returned unchanged.
func normalize(ref string) string {
	if strings.HasPrefix(ref, importPrefix) {
		return ref
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return ref
	}
	return r.Name()
}

const importPrefix = "import:"

// List returns every cached image, sorted by Ref.
func (s *Store) List() ([]*Image, error) {
	ents, err := os.ReadDir(s.imagesDir())
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	var imgs []*Image
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".json") {
			continue // temp files of an in-flight write
		}
		img, err := s.readRecord(filepath.Join(s.imagesDir(), e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // removed while we listed
		}
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, img)
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].Ref < imgs[j].Ref })
	return imgs, nil
}

func (s *Store) readRecord(path string) (*Image, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading image record %s: %w", path, err)
	}
	var img Image
	if err := json.Unmarshal(b, &img); err != nil {
		return nil, fmt.Errorf("decoding image record %s: %w", path, err)
	}
	img.Layers = make([]string, len(img.DiffIDs))
	for i, d := range img.DiffIDs {
		h, ok := strings.CutPrefix(d, "sha256:")
		if !ok || !isHex(h) || len(h) != 64 {
			return nil, fmt.Errorf("decoding image record %s: bad diff ID %q", path, d)
		}
		img.Layers[i] = s.layerDir(h)
	}
	return &img, nil
}

func (s *Store) writeRecord(img *Image) error {
	b, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding image record: %w", err)
	}
	return writeFileAtomic(s.recordPath(img.Name), append(b, '\n'))
}

// Resolve finds a cached image by the reference as given, by its normalized form, or by digest
// ("sha256:" optional; a prefix of at least 12 hex digits is enough if it is unambiguous).
func (s *Store) Resolve(ref string) (*Image, error) {
	imgs, err := s.match(ref)
	if err != nil {
		return nil, err
	}
	return imgs[0], nil
}

// match returns the records ref names: one record for a name, or every record sharing the one
// digest a digest prefix names.
func (s *Store) match(ref string) ([]*Image, error) {
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	for _, img := range all {
		if img.Ref == ref {
			return []*Image{img}, nil
		}
	}
	norm := normalize(ref)
	for _, img := range all {
		if img.Name == norm || normalize(img.Ref) == norm {
			return []*Image{img}, nil
		}
	}
	if prefix, ok := digestPrefix(ref); ok {
		var found []*Image
		digests := map[string]bool{}
		for _, img := range all {
			if strings.HasPrefix(strings.TrimPrefix(img.Digest, "sha256:"), prefix) {
				found = append(found, img)
				digests[img.Digest] = true
			}
		}
		if len(digests) > 1 {
			return nil, fmt.Errorf("digest prefix %q matches %d different images; give more digits", ref, len(digests))
		}
		if len(found) > 0 {
			return found, nil
		}
	}
	return nil, notFound(ref)
}

func notFound(ref string) error {
	if _, ok := digestPrefix(ref); ok {
		return fmt.Errorf("%w: no cached image has digest %s; pull it with: moat image pull REF, or load an archive with: moat image import FILE", ErrNotFound, ref)
	}
	return fmt.Errorf("%w: %q is not in the image cache; get it with: moat image pull %s, or load an archive with: moat image import FILE", ErrNotFound, ref, ref)
}

// digestPrefix reports whether ref looks like a digest or digest prefix, and returns its hex.
// 12 digits: the length `docker images` prints, long enough that collisions need intent.
func digestPrefix(ref string) (string, bool) {
	h := strings.TrimPrefix(ref, "sha256:")
	if len(h) < 12 || len(h) > 64 || !isHex(h) {
		return "", false
	}
	return strings.ToLower(h), true
}

func isHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return s != ""
}

func shortHex(digest string) string {
	h := strings.TrimPrefix(digest, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

// Remove deletes the record(s) ref names (by name: that one; by digest: every name for it) and
// then every layer no remaining image uses. It waits for in-flight imports to finish, because an
// import's layers are unreferenced until its record is written.
//
// Layers are deleted even if a running sandbox has them as overlay lower layers; callers must
// refuse to remove images that sandboxes still use.
func (s *Store) Remove(ref string) error {
	unlock, err := lockFile(context.Background(), filepath.Join(s.root, "lock"), lockExclusive)
	if err != nil {
		return fmt.Errorf("locking image store: %w", err)
	}
	defer unlock()
	imgs, err := s.match(ref)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		if err := os.Remove(s.recordPath(img.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing image record for %s: %w", img.Ref, err)
		}
	}
	return s.collect()
}

// collect deletes layers, layer locks and temp files no image record refers to. The caller holds
// the store lock exclusively, so no import is running and nothing in tmp/ is in use.
func (s *Store) collect() error {
	imgs, err := s.List()
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, img := range imgs {
		for _, d := range img.DiffIDs {
			keep[strings.TrimPrefix(d, "sha256:")] = true
		}
	}
	for _, dir := range []string{s.layersDir(), s.locksDir()} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("collecting unused layers: %w", err)
		}
		for _, e := range ents {
			h, _, _ := strings.Cut(e.Name(), ".")
			if keep[h] {
				continue
			}
			if err := s.removeAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("removing unused layer %s: %w", e.Name(), err)
			}
		}
	}
	ents, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return fmt.Errorf("collecting temp files: %w", err)
	}
	for _, e := range ents {
		if err := s.removeAll(filepath.Join(s.tmpDir(), e.Name())); err != nil {
			return fmt.Errorf("removing temp files: %w", err)
		}
	}
	return nil
}

// writeFileAtomic writes data to path through a temp file and rename, so readers see the old
// contents or the new, never a torn write, even if moat dies midway.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op once renamed
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s into place: %w", path, err)
	}
	return nil
}
