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
	var its [2]*fileIter
	for i, p := range []string{path, NoisePath(path)} {
		files, err := rotatedFiles(p)
		if err != nil {
			return err
		}
		its[i] = &fileIter{names: append(files, p)}
	}
	kept, noise := its[0], its[1]
	// fn may stop the merge, and an error may end it, with a file open.
	defer kept.close()
	defer noise.close()
	rk, okK, err := kept.next()
	if err != nil {
		return err
	}
	rn, okN, err := noise.next()
	if err != nil {
		return err
	}
	for okK || okN {
		// Records within a series are nearly in time order; the merge
		// keeps each series' order and interleaves the two by time.
		it, r := kept, rk
		if !okK || okN && rn.Time.Before(rk.Time) {
			it, r = noise, rn
		}
		if !fn(r) {
			return nil
		}
		var ok bool
		if r, ok, err = it.next(); err != nil {
			return err
		}
		if it == kept {
			rk, okK = r, ok
		} else {
			rn, okN = r, ok
		}
	}
	if !kept.found && !noise.found {
		return fmt.Errorf("reading audit log: %w", &fs.PathError{Op: "open", Path: path, Err: fs.ErrNotExist})
	}
	return nil
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
// is done; it then returns nil. The two series are interleaved as they are
// polled, not by time. It follows the log across rotations: when path is replaced it
// finishes the old file and continues with the new one from its start. It
// waits for path to appear if it does not exist yet. Records already rotated
// away when Follow starts are not delivered; use Read for history.
func Follow(ctx context.Context, path string, fn func(Record)) error {
	kept, noise := tail{fn: fn}, tail{fn: fn}
	defer kept.close()
	defer noise.close()
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	for {
		if err := kept.poll(path); err != nil {
			return err
		}
		if err := noise.poll(NoisePath(path)); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// tail is Follow's state between polls.
type tail struct {
	fn      func(Record)
	f       *os.File
	off     int64  // bytes of f consumed
	pending []byte // the start of a line whose "\n" has not arrived
	skip    bool   // discarding an overlong line up to its "\n"
}

func (t *tail) close() {
	if t.f != nil {
		t.f.Close()
		t.f = nil
	}
}

// poll delivers what has been appended since the last poll and moves to a
// new file if path was rotated.
func (t *tail) poll(path string) error {
	for range 2 { // at most: finish the old file, then start the new one
		if t.f == nil {
			f, err := os.Open(path)
			if errors.Is(err, fs.ErrNotExist) {
				return nil // not created yet, or between rename and create
			}
			if err != nil {
				return fmt.Errorf("following audit log: %w", err)
			}
			t.f, t.off, t.pending, t.skip = f, 0, t.pending[:0], false
		}
		if err := t.drain(); err != nil {
			return err
		}
		cur, err := os.Stat(path)
		if err != nil {
			// Renamed away and the new file not there yet: stay on the old
			// one, which may still be written if rotation failed half way.
			return nil
		}
		held, err := t.f.Stat()
		if err != nil {
			return fmt.Errorf("following audit log: %w", err)
		}
		if os.SameFile(cur, held) {
			if cur.Size() < t.off {
				// Truncated in place (not moat's way, but a person's):
				// start again from the top.
				if _, err := t.f.Seek(0, io.SeekStart); err != nil {
					return fmt.Errorf("following audit log: %w", err)
				}
				t.off, t.pending, t.skip = 0, t.pending[:0], false
			}
			return nil
		}
		// Rotated. The writer flushed the old file before renaming it and
		// writes only to the new one after, so one more drain finishes it.
		if err := t.drain(); err != nil {
			return err
		}
		t.close()
	}
	return nil
}

// drain reads everything available from t.f and delivers complete lines.
func (t *tail) drain() error {
	buf := make([]byte, 64<<10)
	for {
		n, err := t.f.Read(buf)
		t.off += int64(n)
		t.consume(buf[:n])
		if err == io.EOF || n == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("following audit log: %w", err)
		}
	}
}

func (t *tail) consume(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if !t.skip {
				t.pending = append(t.pending, b...)
				if len(t.pending) > maxLineBytes {
					t.pending, t.skip = t.pending[:0], true
				}
			}
			return
		}
		line := b[:i]
		if len(t.pending) > 0 {
			line = append(t.pending, line...)
			t.pending = t.pending[:0]
		}
		if !t.skip {
			if r, ok := parseLine(line); ok {
				t.fn(r)
			}
		}
		t.skip = false
		b = b[i+1:]
	}
}
