package lists

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"moat.dev/moat/internal/state"
)

// MaxBytes bounds a list: 64 MiB is several times the largest public
// blocklists (about 2 million names), and small enough that a source
// that streams forever cannot fill the disk or the daemon's memory.
const MaxBytes = 64 << 20

// FetchTimeout bounds one fetch, connection to last byte: a stalled
// server must not hold a refresh (or a sandbox's start) for long.
const FetchTimeout = 60 * time.Second

// MetaSchema is the version of a cache entry's metadata file.
const MetaSchema = 1

// Meta is what the cache knows about a fetched list, in NAME.json beside
// the list. Field names are persisted: frozen.
type Meta struct {
	Schema       int       `json:"schema"`
	Source       string    `json:"source"`
	ETag         string    `json:"etag,omitempty"`
	LastModified string    `json:"last_modified,omitempty"`
	Fetched      time.Time `json:"fetched"` // last time the server answered 200 or 304
	Bytes        int64     `json:"bytes"`
	// Checked and LastError are the last attempt, when it failed.
	Checked   time.Time `json:"checked,omitzero"`
	LastError string    `json:"last_error,omitempty"`
}

// Cache keeps fetched lists in Dir, one pair of files per source: the
// list as served, and its Meta.
type Cache struct {
	Dir    string
	Client *http.Client     // nil: a client with FetchTimeout
	Now    func() time.Time // nil: time.Now
}

// CacheDir is where the lists of a moat home are cached.
func CacheDir(d state.Dirs) string { return filepath.Join(d.Cache, "policies") }

// IsURL reports whether a source is fetched (http, https) rather than
// read from a file.
func IsURL(source string) bool {
	return strings.HasPrefix(source, "http://") || strings.HasPrefix(source, "https://")
}

// key names a source's files: a hash, because URLs hold characters no
// file name should, and two policies naming one source share one copy.
func key(source string) string {
	h := sha256.Sum256([]byte(source))
	return hex.EncodeToString(h[:12])
}

func (c *Cache) paths(source string) (list, meta string) {
	k := key(source)
	return filepath.Join(c.Dir, k+".list"), filepath.Join(c.Dir, k+".json")
}

func (c *Cache) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// ErrNeverFetched is returned for a source the cache holds no copy of.
var ErrNeverFetched = errors.New("never fetched")

// Meta returns the metadata of the cached copy of source.
func (c *Cache) Meta(source string) (Meta, error) {
	_, mp := c.paths(source)
	b, err := os.ReadFile(mp)
	if errors.Is(err, fs.ErrNotExist) {
		return Meta{}, ErrNeverFetched
	}
	if err != nil {
		return Meta{}, fmt.Errorf("reading the cached list's metadata: %w", err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, fmt.Errorf("reading the cached list's metadata %s: %w; remove it with: moat policy rm NAME", mp, err)
	}
	return m, nil
}

// Read returns the cached copy of source and its metadata, or
// ErrNeverFetched.
func (c *Cache) Read(source string) ([]byte, Meta, error) {
	m, err := c.Meta(source)
	if err != nil {
		return nil, m, err
	}
	lp, _ := c.paths(source)
	data, err := readBounded(lp)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Meta{}, ErrNeverFetched
	}
	return data, m, err
}

// Remove deletes the cached copy of source; a source never fetched is
// not an error.
func (c *Cache) Remove(source string) error {
	lp, mp := c.paths(source)
	for _, p := range []string{mp, lp} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the cached list: %w", err)
		}
	}
	return nil
}

// Refresh fetches source now, conditionally when the cache has a copy
// (If-None-Match, If-Modified-Since): a 304 keeps the copy and only
// moves Fetched. It reports whether the list changed. On failure the
// copy, if any, stays as it was, and the failure is noted in its Meta.
func (c *Cache) Refresh(ctx context.Context, source string) (changed bool, err error) {
	if !IsURL(source) {
		return false, fmt.Errorf("%s is a file, not a URL: it is read as it is, never cached", source)
	}
	old, merr := c.Meta(source)
	have := merr == nil
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return false, fmt.Errorf("creating the list cache: %w", err)
	}
	m, data, err := c.fetch(ctx, source, old, have)
	if err != nil {
		if have {
			old.Checked, old.LastError = c.now(), err.Error()
			c.writeMeta(source, old)
		}
		return false, err
	}
	lp, _ := c.paths(source)
	if data != nil {
		// The list first, then its validators: a crash in between
		// leaves new data under old validators, which at worst costs a
		// full fetch next time, never a stale copy taken for new.
		if err := state.WriteAtomic(lp, data, 0o600); err != nil {
			return false, fmt.Errorf("caching the list: %w", err)
		}
	}
	if err := c.writeMeta(source, m); err != nil {
		return false, err
	}
	return data != nil, nil
}

func (c *Cache) writeMeta(source string, m Meta) error {
	_, mp := c.paths(source)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := state.WriteAtomic(mp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("caching the list's metadata: %w", err)
	}
	return nil
}

// fetch GETs source. data is nil on 304.
func (c *Cache) fetch(ctx context.Context, source string, old Meta, have bool) (Meta, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, FetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, source, nil)
	if err != nil {
		return Meta{}, nil, fmt.Errorf("fetching %s: %w", Redact(source), err)
	}
	if have {
		if old.ETag != "" {
			req.Header.Set("If-None-Match", old.ETag)
		}
		if old.LastModified != "" {
			req.Header.Set("If-Modified-Since", old.LastModified)
		}
	}
	client := c.Client
	if client == nil {
		client = &http.Client{Timeout: FetchTimeout}
	}
	resp, err := client.Do(req)
	if err != nil {
		// The client's error repeats the URL, which may carry a token.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return Meta{}, nil, fmt.Errorf("fetching %s: %w", Redact(source), err)
	}
	defer resp.Body.Close()
	now := c.now()
	switch {
	case resp.StatusCode == http.StatusNotModified && have:
		old.Fetched, old.Checked, old.LastError = now, time.Time{}, ""
		return old, nil, nil
	case resp.StatusCode != http.StatusOK:
		return Meta{}, nil, fmt.Errorf("fetching %s: the server answered %s", Redact(source), resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxBytes+1))
	if err != nil {
		return Meta{}, nil, fmt.Errorf("fetching %s: %w", Redact(source), err)
	}
	if len(data) > MaxBytes {
		return Meta{}, nil, fmt.Errorf("fetching %s: the list is larger than %d MiB; use a smaller list", Redact(source), MaxBytes>>20)
	}
	return Meta{
		Schema: MetaSchema, Source: source, Fetched: now, Bytes: int64(len(data)),
		ETag: resp.Header.Get("ETag"), LastModified: resp.Header.Get("Last-Modified"),
	}, data, nil
}

// ReadFile reads a list kept in a file, bounded like a fetch.
func ReadFile(path string) ([]byte, error) {
	data, err := readBounded(path)
	if err != nil {
		return nil, fmt.Errorf("reading the list %s: %w", path, unwrapPath(err))
	}
	return data, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("larger than %d MiB; use a smaller list", MaxBytes>>20)
	}
	return data, nil
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Redact hides the user info and query of a URL, which may carry a
// token, for messages and status lines.
func Redact(source string) string {
	u, err := url.Parse(source)
	if err != nil || u.Host == "" {
		return source
	}
	if u.User != nil {
		u.User = url.User("xxxxx")
	}
	if u.RawQuery != "" {
		u.RawQuery = "xxxxx"
	}
	return u.String()
}
