package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// layerInfo is layers/<hex>.json. Field names are frozen (see Image).
type layerInfo struct {
	DiffID    string    `json:"diff_id"`
	SizeBytes int64     `json:"size_bytes"` // uncompressed tar bytes
	Unpacked  time.Time `json:"unpacked"`
}

// add unpacks img's layers and writes its record. It holds the store lock shared throughout:
// until the record exists, nothing refers to freshly unpacked layers, and Remove (which takes
// the lock exclusively) would otherwise collect them from under us.
func (s *Store) add(ctx context.Context, img v1.Image, ref, name, digest string, progress io.Writer) (*Image, error) {
	unlock, err := lockFile(ctx, filepath.Join(s.root, "lock"), lockShared)
	if err != nil {
		return nil, fmt.Errorf("locking image store: %w", err)
	}
	defer unlock()

	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading image config: %w", err)
	}
	if cf.OS != "" && (cf.OS != "linux" || cf.Architecture != runtime.GOARCH) {
		progressf(progress, "warning: image is built for %s/%s; this host runs linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("listing layers: %w", err)
	}
	rec := &Image{
		Schema:  recordSchema,
		Ref:     ref,
		Name:    name,
		Digest:  digest,
		DiffIDs: []string{},
		Layers:  []string{},
		Config: Config{
			Env:        cf.Config.Env,
			Entrypoint: cf.Config.Entrypoint,
			Cmd:        cf.Config.Cmd,
			WorkingDir: cf.Config.WorkingDir,
			User:       cf.Config.User,
		},
		Created: time.Now().UTC(),
		Built:   cf.Created.Time,
	}
	for i, l := range layers {
		diffID, size, err := s.unpackLayer(ctx, l, i+1, len(layers), progress)
		if err != nil {
			return nil, err
		}
		rec.DiffIDs = append(rec.DiffIDs, "sha256:"+diffID)
		rec.Layers = append(rec.Layers, s.layerDir(diffID))
		rec.SizeBytes += size
	}
	if err := s.writeRecord(rec); err != nil {
		return nil, err
	}
	progressf(progress, "stored %s (%s, %s)", rec.Ref, shortDigest(rec.Digest), formatSize(rec.SizeBytes))
	return rec, nil
}

// unpackLayer makes sure layer n of total is unpacked under layers/ and returns its diff ID hex
// and uncompressed size.
func (s *Store) unpackLayer(ctx context.Context, l v1.Layer, n, total int, progress io.Writer) (string, int64, error) {
	diffID, err := l.DiffID()
	if err != nil {
		return "", 0, fmt.Errorf("reading diff ID of layer %d: %w", n, err)
	}
	h := diffID.Hex
	if diffID.Algorithm != "sha256" || len(h) != 64 || !isHex(h) || strings.ToLower(h) != h {
		// The hex becomes a directory name, so it must be exactly what it claims to be.
		return "", 0, fmt.Errorf("layer %d has unsupported diff ID %q: %w", n, diffID, ErrUnsafeArchive)
	}
	label := fmt.Sprintf("layer %d/%d sha256:%s…", n, total, h[:12])
	if size, ok := s.unpacked(h); ok {
		progressf(progress, "%s already unpacked", label)
		return h, size, nil
	}
	unlock, err := lockFile(ctx, filepath.Join(s.locksDir(), h+".lock"), lockExclusive)
	if err != nil {
		return "", 0, fmt.Errorf("locking layer %s: %w", diffID, err)
	}
	defer unlock()
	if size, ok := s.unpacked(h); ok { // another import finished it while we waited
		progressf(progress, "%s already unpacked", label)
		return h, size, nil
	}
	progressf(progress, "unpacking %s", label)
	size, err := s.unpackLocked(ctx, l, h)
	if err != nil {
		return "", 0, fmt.Errorf("unpacking layer %s: %w", diffID, err)
	}
	progressf(progress, "unpacked %s (%s)", label, formatSize(size))
	return h, size, nil
}

// unpacked reports whether layer h is in the store. The directory only ever appears by rename
// of a complete extraction, so its existence is the whole test; the size is informational.
func (s *Store) unpacked(h string) (int64, bool) {
	fi, err := os.Lstat(s.layerDir(h))
	if err != nil || !fi.IsDir() {
		return 0, false
	}
	var info layerInfo
	if b, err := os.ReadFile(s.layerDir(h) + ".json"); err == nil {
		_ = json.Unmarshal(b, &info) // a missing size is not worth failing an import over
	}
	return info.SizeBytes, true
}

// unpackLocked extracts layer h into tmp/ and renames it into place: in this process, or for a
// store without root in a child in a user namespace. The caller holds the layer's lock.
func (s *Store) unpackLocked(ctx context.Context, l v1.Layer, h string) (int64, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, fmt.Errorf("reading layer: %w", err)
	}
	defer rc.Close()
	if s.ns != nil {
		return s.ns.unpack(ctx, s.root, h, rc)
	}
	return s.unpackStream(ctx, rc, h)
}

// unpackStream extracts the uncompressed layer tar rc, whose sha256 must be h, into tmp/ and
// renames it into place, returning its size.
func (s *Store) unpackStream(ctx context.Context, rc io.Reader, h string) (size int64, err error) {
	tmp := filepath.Join(s.tmpDir(), "layer-"+h)
	// Left over from a crashed attempt; the lock we hold means no one else is using it.
	if err := os.RemoveAll(tmp); err != nil {
		return 0, fmt.Errorf("removing stale %s: %w", tmp, err)
	}
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return 0, fmt.Errorf("creating %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp) // fail without a trace: no partial layer is ever left behind
		}
	}()
	// 0755 whatever the umask: a layer without a "./" entry leaves this as the image's /.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return 0, fmt.Errorf("setting mode of %s: %w", tmp, err)
	}

	// Hash what we unpack rather than trust the diff ID the image config claims: the diff ID
	// names the shared directory, so a lying image could otherwise plant its files under the
	// name of a popular base layer and have other images run them.
	sum := sha256.New()
	cr := &countingReader{r: rc, ctx: ctx}
	tee := io.TeeReader(cr, sum)
	if err := extractLayer(tee, tmp, s.opaque); err != nil {
		return 0, err
	}
	if _, err := io.Copy(io.Discard, tee); err != nil { // trailing tar blocks count in the digest
		return 0, fmt.Errorf("reading layer: %w", err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != h {
		return 0, fmt.Errorf("content has digest sha256:%s, not the diff ID its image claims: %w", got, ErrUnsafeArchive)
	}

	info, err := json.Marshal(layerInfo{DiffID: "sha256:" + h, SizeBytes: cr.n, Unpacked: time.Now().UTC()})
	if err != nil {
		return 0, fmt.Errorf("encoding layer info: %w", err)
	}
	// Info first, directory second: the directory is the commit point (see unpacked).
	if err := writeFileAtomic(s.layerDir(h)+".json", info); err != nil {
		return 0, err
	}
	if err := s.giveToOwner(s.layerDir(h) + ".json"); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, s.layerDir(h)); err != nil {
		return 0, fmt.Errorf("renaming layer into place: %w", err)
	}
	return cr.n, nil
}

// countingReader counts bytes and stops when ctx is cancelled, so a long local import can be
// interrupted (remote reads already carry the context in their HTTP requests).
type countingReader struct {
	r   io.Reader
	ctx context.Context
	n   int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

func shortDigest(d string) string {
	alg, _, ok := strings.Cut(d, ":")
	if !ok {
		return d
	}
	return alg + ":" + shortHex(d) + "…"
}

// formatSize prints bytes in binary units with one decimal, like "1.2 MiB".
func formatSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
