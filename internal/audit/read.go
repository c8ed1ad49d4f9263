package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// followPoll is how often Follow looks for new lines: portable (no inotify)
// and quicker than a person reading a terminal notices.
const followPoll = 200 * time.Millisecond

// maxLineBytes bounds one line in Follow's buffer; records are a few hundred
// bytes, so anything longer is damage, skipped rather than held.
const maxLineBytes = 1 << 20

// Read calls fn for every record of the audit log at path, oldest first,
// until fn returns false: the kept series (path's rotated files, oldest
// first, then path) and the noise series (NoisePath) merged by time. Lines
// that are not records (a line torn by a crash, a final line still being
// written) are skipped. If a rotation happens while Read runs, records may
// be seen twice or missed. It returns an error wrapping fs.ErrNotExist
// when there is no audit file at all.
func Read(path string, fn func(Record) bool) error {
	return ReadLogs([]string{path}, fn)
}

// ReadLogs is Read over several audit logs at once, each of them written
// by one writer: a Docker sandbox's gate container writes one and its port
// forwarder another, and a person wants one story. Every series of every
// log keeps its own order (records within one are nearly in time order,
// and an "end" record carries its connection's start), and the series are
// interleaved by time; a tie goes to the earlier log, then to the kept
// series. A log with no file at all (not even its directory) is no error
// unless none of them has one: then the error wraps fs.ErrNotExist.
func ReadLogs(paths []string, fn func(Record) bool) error {
	var its []*fileIter
	for _, path := range paths {
		for _, p := range []string{path, NoisePath(path)} {
			files, err := rotatedFiles(p)
			if errors.Is(err, fs.ErrNotExist) {
				// No directory: a log never written (a forwarder
				// that never carried a connection).
				its = append(its, &fileIter{})
				continue
			}
			if err != nil {
				return err
			}
			its = append(its, &fileIter{names: append(files, p)})
		}
	}
	// fn may stop the merge, and an error may end it, with a file open.
	defer func() {
		for _, it := range its {
			it.close()
		}
	}()
	heads := make([]Record, len(its))
	live := make([]bool, len(its))
	for i, it := range its {
		var err error
		if heads[i], live[i], err = it.next(); err != nil {
			return err
		}
	}
	for {
		i := earliest(heads, live)
		if i < 0 {
			break
		}
		if !fn(heads[i]) {
			return nil
		}
		var err error
		if heads[i], live[i], err = its[i].next(); err != nil {
			return err
		}
	}
	for _, it := range its {
		if it.found {
			return nil
		}
	}
	return fmt.Errorf("reading audit log: %w", &fs.PathError{Op: "open", Path: paths[0], Err: fs.ErrNotExist})
}

// earliest is the index of the earliest of heads that is live, the lowest
// index on a tie, or -1 when none is.
func earliest(heads []Record, live []bool) int {
	best := -1
	for i := range heads {
		if live[i] && (best < 0 || heads[i].Time.Before(heads[best].Time)) {
			best = i
		}
	}
	return best
}

// fileIter reads the records of a list of files in turn.
type fileIter struct {
	names []string
	f     *os.File
	br    *bufio.Reader
	found bool // a file was there
}

// next returns the next record, false at the end of the last file.
func (it *fileIter) next() (Record, bool, error) {
	for {
		if it.br == nil {
			if len(it.names) == 0 {
				return Record{}, false, nil
			}
			f, err := os.Open(it.names[0])
			it.names = it.names[1:]
			if errors.Is(err, fs.ErrNotExist) {
				continue // rotated away since it was listed, or never made
			}
			if err != nil {
				return Record{}, false, fmt.Errorf("reading audit log: %w", err)
			}
			it.f, it.br, it.found = f, bufio.NewReaderSize(f, 64<<10), true
		}
		line, err := it.br.ReadBytes('\n')
		if err == io.EOF {
			// A last line without "\n" is still being written, or was
			// torn: never a record.
			it.f.Close()
			it.f, it.br = nil, nil
			continue
		}
		if err != nil {
			it.close()
			return Record{}, false, fmt.Errorf("reading audit log: %w", err)
		}
		if r, ok := parseLine(line); ok {
			return r, true, nil
		}
	}
}

// close closes the file being read, if any.
func (it *fileIter) close() {
	if it.f != nil {
		it.f.Close()
		it.f, it.br = nil, nil
	}
}

// rotatedFiles lists path.N, oldest (highest N) first.
func rotatedFiles(path string) ([]string, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading audit log: %w", err)
	}
	type file struct {
		n    int
		name string
	}
	var found []file
	for _, e := range ents {
		suffix, ok := strings.CutPrefix(e.Name(), base+".")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(suffix)
		if err != nil || n < 1 || strconv.Itoa(n) != suffix {
			continue
		}
		found = append(found, file{n, filepath.Join(dir, e.Name())})
	}
	sort.Slice(found, func(i, j int) bool { return found[i].n > found[j].n })
	names := make([]string, len(found))
	for i, f := range found {
		names[i] = f.name
	}
	return names, nil
}

// readFile calls fn for each record in one file and reports whether fn
// wants more.
func readFile(name string, fn func(Record) bool) (bool, error) {
	f, err := os.Open(name)
	if err != nil {
		return false, fmt.Errorf("reading audit log: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			return true, nil // a last line without "\n" is still being written
		}
		if err != nil {
			return false, fmt.Errorf("reading audit log: %w", err)
		}
		r, ok := parseLine(line)
		if ok && !fn(r) {
			return false, nil
		}
	}
}

func parseLine(line []byte) (Record, bool) {
	var r Record
	line = bytes.TrimSpace(line)
	if len(line) == 0 || json.Unmarshal(line, &r) != nil {
		return Record{}, false
	}
	return r, true
}

// Follow calls fn for every record in path and NoisePath(path), from the
// start of the files, and then for each record appended to them, until ctx
// is done; it then returns nil. What one poll finds in the two series is
// merged by time, as Read merges them; records found by different polls
// are delivered in the order they were found. It follows the log across
// rotations: when path is replaced it finishes the old file and continues
// with the new one from its start. It waits for path to appear if it does
// not exist yet. Records already rotated away when Follow starts are not
// delivered; use Read for history.
func Follow(ctx context.Context, path string, fn func(Record)) error {
	return FollowLogs(ctx, []string{path}, fn)
}

// FollowLogs is Follow over several audit logs at once (ReadLogs's). One
// loop polls them all, so the first poll delivers what their files hold
// merged by time, and each later one what was appended since, merged the
// same way. Each file is read a chunk at a time as the merge needs it, so
// a long log costs no more memory than a short one. A log whose file
// never appears is waited for, never an error.
func FollowLogs(ctx context.Context, paths []string, fn func(Record)) error {
	var tails []*tail
	for _, path := range paths {
		tails = append(tails, &tail{path: path}, &tail{path: NoisePath(path)})
	}
	defer func() {
		for _, t := range tails {
			t.close()
		}
	}()
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	heads := make([]Record, len(tails))
	live := make([]bool, len(tails))
	for {
		for i, t := range tails {
			var err error
			if heads[i], live[i], err = t.next(); err != nil {
				return err
			}
		}
		// A tail with nothing new sits this poll out: the merge is over
		// what has arrived, and what arrives later comes after it.
		for i := earliest(heads, live); i >= 0; i = earliest(heads, live) {
			fn(heads[i])
			var err error
			if heads[i], live[i], err = tails[i].next(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// followChunk is how much of a file a tail reads at a time.
const followChunk = 64 << 10

// tail is FollowLogs' reader of one series, kept between polls.
type tail struct {
	path    string
	f       *os.File
	off     int64  // bytes of f read
	buf     []byte // bytes read, not yet delivered: buf[start:]
	start   int
	skip    bool // discarding an overlong line up to its "\n"
	rotated bool // path is another file now: f ends at its next EOF
}

func (t *tail) close() {
	if t.f != nil {
		t.f.Close()
		t.f = nil
	}
}

// next returns the next whole record appended to the series, false when
// none has arrived yet.
func (t *tail) next() (Record, bool, error) {
	for {
		rest := t.buf[t.start:]
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			t.start += i + 1
			if t.skip {
				t.skip = false
				continue
			}
			if r, ok := parseLine(rest[:i]); ok {
				return r, true, nil
			}
			continue
		}
		if len(rest) > maxLineBytes {
			// Records are a few hundred bytes: this is damage,
			// skipped rather than held.
			t.start, t.skip = len(t.buf), true
		}
		more, err := t.read()
		if err != nil || !more {
			return Record{}, false, err
		}
	}
}

// read appends to buf what the file has beyond what was read, moving to a
// new file when path was rotated, and says whether it read anything.
func (t *tail) read() (bool, error) {
	// At most: see the rotation, finish the old file, start the new one.
	for range 3 {
		if t.f == nil {
			f, err := os.Open(t.path)
			if errors.Is(err, fs.ErrNotExist) {
				return false, nil // not created yet, or between rename and create
			}
			if err != nil {
				return false, fmt.Errorf("following audit log: %w", err)
			}
			// A line the old file left unfinished never gets its end.
			t.f, t.off, t.buf, t.start, t.skip, t.rotated = f, 0, t.buf[:0], 0, false, false
		}
		t.buf = t.buf[:copy(t.buf, t.buf[t.start:])]
		t.start = 0
		if cap(t.buf)-len(t.buf) < followChunk {
			t.buf = slices.Grow(t.buf, followChunk)
		}
		n, err := t.f.Read(t.buf[len(t.buf):cap(t.buf)])
		t.buf, t.off = t.buf[:len(t.buf)+n], t.off+int64(n)
		if n > 0 {
			return true, nil
		}
		if err != nil && err != io.EOF {
			return false, fmt.Errorf("following audit log: %w", err)
		}
		if t.rotated {
			// The writer flushed the old file before renaming it and
			// writes only to the new one after: it is finished.
			t.close()
			continue
		}
		cur, err := os.Stat(t.path)
		if err != nil {
			// Renamed away and the new file not there yet: stay on the old
			// one, which may still be written if rotation failed half way.
			return false, nil
		}
		held, err := t.f.Stat()
		if err != nil {
			return false, fmt.Errorf("following audit log: %w", err)
		}
		if !os.SameFile(cur, held) {
			// Rotated: what was written to the old file before the
			// rename is read first.
			t.rotated = true
			continue
		}
		if cur.Size() < t.off {
			// Truncated in place (not moat's way, but a person's): start
			// again from the top.
			if _, err := t.f.Seek(0, io.SeekStart); err != nil {
				return false, fmt.Errorf("following audit log: %w", err)
			}
			t.off, t.buf, t.start, t.skip = 0, t.buf[:0], 0, false
		}
		return false, nil
	}
	return false, nil
}
