package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults for Open: 16 MiB × (1 + 3) bounds a sandbox's audit to 64 MiB,
// which at ~300 bytes a record is some 200 000 decisions of history.
const (
	DefaultMaxBytes = 16 << 20
	DefaultKeep     = 3
)

// queueLen is how many records may wait for the disk before Write drops
// them: enough to ride out a slow fsync elsewhere on the disk while a build
// opens hundreds of connections a second.
const queueLen = 4096

// Log appends records to an audit file from one writer goroutine, so the
// gate's decision paths never wait on the disk.
type Log struct {
	path     string
	maxBytes int64
	keep     int

	queue   chan Record
	done    chan struct{} // closed when the writer goroutine has exited
	dropped atomic.Int64  // records Write could not queue, not yet reported
	dropSB  atomic.Pointer[string]
	tap     atomic.Pointer[func(Record)]

	// mu guards closed, and orders Close's close(queue) after every Write
	// that is sending on it.
	mu     sync.RWMutex
	closed bool

	// failing holds why the log cannot be written now (a full disk, say),
	// from a failed flush until one succeeds again: the gate lets nothing
	// through that it could not record (Failing).
	failing atomic.Pointer[string]
	// The free space under the log, checked at most every spaceEvery:
	// when it was last checked (unix ns), and why it is too low, or nil.
	spaceAt  atomic.Int64
	spaceErr atomic.Pointer[string]

	// Owned by the writer goroutine until done is closed.
	f      *os.File
	w      *bufio.Writer
	size   int64
	err    error // the first write or rotation error
	reopen bool  // a flush failed and f was closed: open it again before the next write
}

// Open opens (creating it 0600 if need be) the audit file at path for
// appending. The file is rotated to path.1 … path.keep when the next record
// would take it past maxBytes; maxBytes ≤ 0 means DefaultMaxBytes, keep ≤ 0
// DefaultKeep.
func Open(path string, maxBytes int64, keep int) (*Log, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if keep <= 0 {
		keep = DefaultKeep
	}
	l, err := newLog(path, maxBytes, keep, queueLen)
	if err != nil {
		return nil, err
	}
	go l.run()
	return l, nil
}

// newLog opens the file; the caller starts the writer goroutine.
func newLog(path string, maxBytes int64, keep, queued int) (*Log, error) {
	l := &Log{
		path:     path,
		maxBytes: maxBytes,
		keep:     keep,
		queue:    make(chan Record, queued),
		done:     make(chan struct{}),
	}
	if err := l.openFile(); err != nil {
		return nil, err
	}
	return l, nil
}

// openFile opens l.path for appending. A file that does not end in a newline
// (moat died in the middle of a line) gets one, so the next record starts on
// a line of its own and only the torn one is lost.
func (l *Log) openFile() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening audit log: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("opening audit log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("opening audit log: %w", err)
	}
	size := fi.Size()
	if size > 0 {
		last := make([]byte, 1)
		r, err := os.Open(l.path)
		if err == nil {
			_, err = r.ReadAt(last, size-1)
			r.Close()
		}
		if err != nil {
			f.Close()
			return fmt.Errorf("opening audit log: %w", err)
		}
		if last[0] != '\n' {
			if _, err := f.Write([]byte{'\n'}); err != nil {
				f.Close()
				return fmt.Errorf("opening audit log: %w", err)
			}
			size++
		}
	}
	l.f, l.w, l.size = f, bufio.NewWriterSize(f, 64<<10), size
	return nil
}

// Write queues r for the log and returns at once. It sets r.Schema, and
// r.Time when it is zero. When the queue is full the record is dropped and
// counted; the count is written later as a dropped record. Write after
// Close does nothing. Safe for concurrent use.
func (l *Log) Write(r Record) {
	r.Schema = Schema
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	if tap := l.tap.Load(); tap != nil {
		(*tap)(r)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return
	}
	select {
	case l.queue <- r:
	default:
		l.dropped.Add(1)
		sb := r.Sandbox
		l.dropSB.Store(&sb)
	}
}

// Tap makes Write hand every record to fn as well (the interactive gate's
// watchers see each decision as it is made); nil stops it. fn runs on the
// writer's goroutine, the gate's, so it must not block.
func (l *Log) Tap(fn func(Record)) {
	if fn == nil {
		l.tap.Store(nil)
		return
	}
	l.tap.Store(&fn)
}

// Failing is why records cannot be written now, or nil: when a write to
// the file failed (a full disk, an I/O error) and no later one succeeded
// yet, or when the filesystem under it has less than MinFree left, so
// that the gate stops before a record is lost rather than after.
func (l *Log) Failing() error {
	if p := l.failing.Load(); p != nil {
		return errors.New(*p)
	}
	return l.lowSpace()
}

// MinFree is the free space, in bytes, under which the audit log counts
// as failing: a few buffers' worth of records.
const MinFree = 256 << 10

// minFree is MinFree; the tests set it to 0 to see failed writes alone.
var minFree uint64 = MinFree

// spaceEvery bounds how often Failing asks the filesystem (statfs).
const spaceEvery = 100 * time.Millisecond

// lowSpace is why the log's filesystem has too little room, or nil; it
// asks at most every spaceEvery and answers from the last look between.
// A filesystem that cannot be asked counts as roomy: the writes will tell.
func (l *Log) lowSpace() error {
	now := time.Now().UnixNano()
	if last := l.spaceAt.Load(); now-last >= int64(spaceEvery) && l.spaceAt.CompareAndSwap(last, now) {
		var st unix.Statfs_t
		dir := filepath.Dir(l.path)
		// Bfree, not Bavail: moat runs as root, which may use the blocks
		// a filesystem keeps back from everyone else.
		if err := unix.Statfs(dir, &st); err == nil && st.Bfree*uint64(st.Bsize) < minFree {
			msg := fmt.Sprintf("%s has %d KiB free, under the %d KiB the audit log keeps in reserve", dir, st.Bfree*uint64(st.Bsize)>>10, minFree>>10)
			l.spaceErr.Store(&msg)
		} else {
			l.spaceErr.Store(nil)
		}
	}
	if p := l.spaceErr.Load(); p != nil {
		return errors.New(*p)
	}
	return nil
}

// Close writes what is queued, closes the file and returns the first error
// the log met since Open. It may be called more than once.
func (l *Log) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.queue)
	}
	l.mu.Unlock()
	<-l.done
	return l.err
}

// run is the writer goroutine: it writes queued records in order and
// flushes whenever the queue runs empty, so a follower sees a record about
// as soon as it is written, yet a burst costs one write(2), not one per line.
func (l *Log) run() {
	defer close(l.done)
	defer func() {
		if !l.reopen {
			l.fail(l.w.Flush())
			l.fail(l.f.Close())
		}
	}()
	written := 0
	for r := range l.queue {
		l.write(r)
		written++
		// Report drops once the records queued before them are written
		// (the queue ran empty), or after a queue's worth under load that
		// never lets up, so that a follower learns of them in time.
		if len(l.queue) == 0 || written >= cap(l.queue) {
			written = 0
			l.writeDropped()
		}
		if len(l.queue) == 0 {
			l.flush()
		}
	}
}

// flush writes what is buffered. A failure marks the log failing and closes
// the file: the buffered records are lost, and the next write opens the
// file again (openFile ends a torn last line first). A success clears it.
func (l *Log) flush() {
	if l.reopen {
		return
	}
	if err := l.w.Flush(); err != nil {
		l.failed(err)
		l.f.Close()
		l.reopen = true
		return
	}
	l.failing.Store(nil)
}

// failed records err as the first error and as why the log fails now.
func (l *Log) failed(err error) {
	l.fail(err)
	msg := err.Error()
	l.failing.Store(&msg)
}

// writeDropped writes a dropped record if Write has dropped any since the
// last one.
func (l *Log) writeDropped() {
	n := l.dropped.Swap(0)
	if n == 0 {
		return
	}
	var sb string
	if p := l.dropSB.Load(); p != nil {
		sb = *p
	}
	l.write(Record{Schema: Schema, Time: time.Now().UTC(), Sandbox: sb, Verdict: Dropped,
		Reason: fmt.Sprintf("audit queue full: %d records lost", n), Dropped: n})
}

// write appends one record, rotating first if it would not fit.
func (l *Log) write(r Record) {
	line, err := json.Marshal(r)
	if err != nil {
		l.fail(fmt.Errorf("encoding audit record: %w", err))
		return
	}
	line = append(line, '\n')
	if l.reopen {
		if err := l.openFile(); err != nil {
			l.failed(err)
			return
		}
		l.reopen = false
	}
	if l.size > 0 && l.size+int64(len(line)) > l.maxBytes {
		if err := l.rotate(); err != nil {
			// Keep appending to the file we have: an audit file over its
			// size is better than a lost record.
			l.fail(err)
		}
	}
	n, err := l.w.Write(line)
	l.size += int64(n)
	l.fail(err)
}

// rotate shifts path.(keep-1) … path.1, path up by one, dropping path.keep,
// and starts a new, empty path.
func (l *Log) rotate() error {
	if err := l.w.Flush(); err != nil {
		return fmt.Errorf("rotating audit log: %w", err)
	}
	for i := l.keep - 1; i >= 1; i-- {
		err := os.Rename(l.rotated(i), l.rotated(i+1))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotating audit log: %w", err)
		}
	}
	if err := os.Rename(l.path, l.rotated(1)); err != nil {
		return fmt.Errorf("rotating audit log: %w", err)
	}
	old := l.f
	if err := l.openFile(); err != nil {
		return err
	}
	old.Close()
	return nil
}

func (l *Log) rotated(i int) string { return l.path + "." + strconv.Itoa(i) }

func (l *Log) fail(err error) {
	if err != nil && l.err == nil {
		l.err = err
	}
}
