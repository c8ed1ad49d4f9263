package audit

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults for Options: 128 MiB holds some 400 000 records; 7 days is
// longer than a working week's sandbox usually lives, and long enough to
// look back after a weekend.
const (
	DefaultMaxBytes  = 128 << 20
	DefaultRetention = 7 * 24 * time.Hour
)

// MinMaxBytes is the smallest size bound Options take: each series needs
// a few files of a few reserves' worth of records.
const MinMaxBytes = 1 << 20

// rotatedKeep is how many rotated files each series keeps: with the
// current one, four quarters of its budget.
const rotatedKeep = 3

// queueLen is how many records may wait for the disk before Write drops
// them: enough to ride out a slow fsync elsewhere on the disk while a build
// opens hundreds of connections a second.
const queueLen = 4096

// dropLogEvery bounds how often queue drops are told to the Logger.
const dropLogEvery = 10 * time.Second

// tickEvery is how often the writer looks at the clock when no record
// comes: aggregates are written within this of their interval's end, and
// files past the retention are deleted.
const tickEvery = time.Second

// Options configure a Log.
type Options struct {
	// MaxBytes bounds the audit files together, both series (plus each
	// open file's reserve); 0: DefaultMaxBytes. At least MinMaxBytes.
	MaxBytes int64
	// Retention is how long kept records are kept at least, and files
	// at most; 0: DefaultRetention.
	Retention time.Duration
	// Interval is how long repeated denials are counted before their
	// aggregate is written; 0: DefaultInterval.
	Interval time.Duration
	// Logger hears of records that could not be written (nil: nowhere).
	Logger *slog.Logger
	// Stamp, when set, completes each record before anything else sees
	// it: a log shared by many clients (the gate service's on
	// Kubernetes) adds who each record's client is.
	Stamp func(*Record)

	// For Open and the tests: the size of one file and the number of
	// rotated files, both series alike, instead of shares of MaxBytes.
	fileBytes  int64
	keep       int
	now        func() time.Time
	queued     int
	maxTracked int
}

// Log appends records to the audit files from one writer goroutine, so
// the gate's decision paths never wait on the disk.
type Log struct {
	path string
	o    Options
	log  *slog.Logger

	// queue holds pointers: a channel's buffer is allocated whole, and
	// queueLen records by value would hold the process's largest object
	// from Open on, idle or not; a record waiting costs its own allocation.
	queue   chan *queued
	done    chan struct{} // closed when the writer goroutine has exited
	dropped atomic.Int64  // records Write could not queue, not yet reported
	dropSB  atomic.Pointer[string]
	lost    atomic.Int64 // records never written, since Open
	tap     atomic.Pointer[func(Record)]

	// mu guards closed, and orders Close's close(queue) after every Write
	// that is sending on it.
	mu     sync.RWMutex
	closed bool

	// sortMu guards sort. Write files each record before it is queued, so
	// a flood of repeats is counted on the gate's goroutines and never
	// fills the queue that the records that matter wait in.
	sortMu sync.Mutex
	sort   *sorter

	// failing holds why the log cannot be written now (a full disk, say),
	// from a failed flush until one succeeds again: the gate lets nothing
	// through that it could not record (Failing).
	failing atomic.Pointer[string]
	// full holds why the kept series cannot take more: it is full of
	// records younger than the retention.
	full atomic.Pointer[string]
	// The free space under the log, checked at most every spaceEvery:
	// when it was last checked (unix ns), and why it is too low, or nil.
	spaceAt  atomic.Int64
	spaceErr atomic.Pointer[string]

	// Owned by the writer goroutine until done is closed.
	kept, noise *series
	err         error    // the first error
	why         string   // why a series' last flush or reserve failed; "" when both worked
	unwritten   int64    // records lost to failed writes, not yet reported
	lostWhy     string   // why the first of those was lost
	sb          string   // the sandbox, for the log's own records
	notices     []Record // dropped records waiting for a rotation to finish
	swept       time.Time
	dropLogged  time.Time // when a queue drop was last told to the Logger
	keptOldest  time.Time // mtime of the kept series' path.keep; zero if none
}

// Open opens the audit log at path (the kept series; the noise series
// beside it) with the default bounds, or, when maxBytes and keep are set,
// with files of maxBytes rotated keep times in each series.
func Open(path string, maxBytes int64, keep int) (*Log, error) {
	o := Options{}
	if maxBytes > 0 || keep > 0 {
		o.fileBytes, o.keep = max(maxBytes, 1), max(keep, 1)
	}
	return OpenWith(path, o)
}

// OpenWith opens (creating them 0600 if need be) the audit files at path
// and NoisePath(path) for appending and starts the writer.
func OpenWith(path string, o Options) (*Log, error) {
	l, err := newLog(path, o)
	if err != nil {
		return nil, err
	}
	go l.run()
	return l, nil
}

// NoisePath is the noise series' file beside the audit log at path.
func NoisePath(path string) string {
	dir, base := filepath.Split(path)
	if b, ok := strings.CutSuffix(base, ".jsonl"); ok {
		return filepath.Join(dir, b+"-noise.jsonl")
	}
	return filepath.Join(dir, base+"-noise")
}

// newLog opens the files; the caller starts the writer goroutine.
func newLog(path string, o Options) (*Log, error) {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxBytes < MinMaxBytes && o.fileBytes == 0 {
		return nil, fmt.Errorf("opening audit log: a size bound of %d bytes is under the minimum of %d", o.MaxBytes, MinMaxBytes)
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.queued <= 0 {
		o.queued = queueLen
	}
	keptFile, noiseFile, keep := o.fileBytes, o.fileBytes, o.keep
	if o.fileBytes > 0 {
		o.MaxBytes = 2 * o.fileBytes * int64(keep+1)
	} else {
		// A quarter of the bound for noise, the rest kept; each series
		// is its current file and rotatedKeep rotated ones.
		noise := o.MaxBytes / 4
		keptFile, noiseFile, keep = (o.MaxBytes-noise)/(rotatedKeep+1), noise/(rotatedKeep+1), rotatedKeep
	}
	if o.maxTracked <= 0 {
		// First denials may take a quarter of the kept series at most
		// (a record is some 250 bytes), so that made-up destinations
		// cannot fill it under a small bound either.
		o.maxTracked = int(min(maxTracked, max(64, keptFile*int64(keep+1)/(4*256))))
	}
	kept, err := openSeries(path, keptFile, keep)
	if err != nil {
		return nil, err
	}
	noise, err := openSeries(NoisePath(path), noiseFile, keep)
	if err != nil {
		kept.close()
		return nil, err
	}
	l := &Log{
		path:  path,
		o:     o,
		log:   o.Logger,
		queue: make(chan *queued, o.queued),
		done:  make(chan struct{}),
		kept:  kept,
		noise: noise,
		sort:  newSorter(o.Retention, o.Interval, o.maxTracked),
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.keptOldest = mtime(kept.rotated(kept.keep))
	return l, nil
}

// Write files r and queues it for the log, and returns at once. It sets
// r.Schema, and r.Time when it is zero. A repeated denial past the burst
// is only counted, for its interval's aggregate, and never takes a place
// in the queue. When the queue is full the record is dropped and counted;
// the count is written later as a dropped record. Write after Close does
// nothing. Safe for concurrent use.
func (l *Log) Write(r Record) {
	if l.o.Stamp != nil {
		l.o.Stamp(&r)
	}
	r.Schema = Schema
	if r.Time.IsZero() {
		r.Time = l.o.now()
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
	if !denial(r) {
		// Kept as it is: only denials are aggregated, and the writer's
		// tick ends intervals, so the gate's other records take no lock.
		l.enqueue(queued{r, false})
		return
	}
	l.sortMu.Lock()
	var ended []queued
	if l.sort.due(r.Time) {
		noise, kept := l.sort.flush(r.Time)
		for _, a := range noise {
			ended = append(ended, queued{a, true})
		}
		for _, a := range kept {
			ended = append(ended, queued{a, false})
		}
	}
	rt := l.sort.route(r)
	l.sortMu.Unlock()
	for _, q := range ended {
		l.enqueue(q)
	}
	if rt != toNone { // else counted, for the interval's aggregate
		l.enqueue(queued{r, rt == toNoise})
	}
}

// enqueue hands q to the writer, or drops and counts it when the queue is
// full. The caller holds mu for reading.
func (l *Log) enqueue(q queued) {
	select {
	case l.queue <- &q:
	default:
		l.dropped.Add(1)
		l.lost.Add(1)
		sb := q.r.Sandbox
		l.dropSB.Store(&sb)
	}
}

// Lost is how many records were never written since Open: dropped from a
// full queue, or refused by the disk. Each loss is also recorded in the
// log itself once it can be written, and told to the Logger.
func (l *Log) Lost() int64 { return l.lost.Load() }

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
// the files failed (a full disk, an I/O error), or the disk has no room
// for their reserve, and no later one succeeded yet; when the filesystem
// under them has less than MinFree left; or when the kept series is full
// of records younger than the retention. The gate then stops before a
// record is lost rather than after.
func (l *Log) Failing() error {
	if p := l.failing.Load(); p != nil {
		return errors.New(*p)
	}
	if p := l.full.Load(); p != nil {
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

// Close writes what is queued and what is being counted, closes the files
// and returns the first error the log met since Open. It may be called
// more than once.
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
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	written := 0
	for {
		select {
		case q, ok := <-l.queue:
			if !ok {
				l.finish()
				return
			}
			l.write(*q)
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
		case <-tick.C:
			l.tick()
			l.flush()
		}
	}
}

// finish ends the last interval and closes the files.
func (l *Log) finish() {
	l.endInterval(l.o.now(), true)
	l.writeDropped()
	l.flush()
	l.fail(l.kept.close())
	l.fail(l.noise.close())
}

// tick ends an interval that is over when no denial came to end it
// (Write ends it otherwise) and deletes files past the retention.
func (l *Log) tick() {
	now := l.o.now()
	l.endInterval(now, false)
	if now.Sub(l.swept) >= l.o.Interval {
		l.swept = now
		l.expire(now)
	}
	l.checkFull()
}

// endInterval writes the aggregates of an interval that is over, or of
// the current one when all is set (Close).
func (l *Log) endInterval(now time.Time, all bool) {
	l.sortMu.Lock()
	var noise, kept []Record
	if all || l.sort.due(now) {
		noise, kept = l.sort.flush(now)
	}
	l.sortMu.Unlock()
	for _, r := range noise {
		l.put(l.noise, r)
	}
	for _, r := range kept {
		l.put(l.kept, r)
	}
}

// queued is a record on its way to the writer, filed by Write.
type queued struct {
	r     Record
	noise bool // for the noise series; else the kept one
}

// write writes one filed record.
func (l *Log) write(q queued) {
	if q.r.Sandbox != "" {
		l.sb = q.r.Sandbox
	}
	if q.noise {
		l.put(l.noise, q.r)
	} else {
		l.put(l.kept, q.r)
	}
}

// put appends r to s, rotating s first if r would not fit. A kept series
// that cannot rotate (full within the retention) passes r to the noise
// series: a record of a decision already made is better there than lost.
func (l *Log) put(s *series, r Record) {
	line, err := json.Marshal(r)
	if err != nil {
		l.fail(fmt.Errorf("encoding audit record: %w", err))
		return
	}
	line = append(line, '\n')
	if !s.fits(line) && !l.rotate(s) && s == l.kept {
		s = l.noise
		if !s.fits(line) {
			l.rotate(s)
		}
	}
	s.add(line)
	if s == l.kept {
		l.checkFull()
	}
	l.putNotices()
}

// putNotices writes the dropped records of the rotations just done.
func (l *Log) putNotices() {
	for len(l.notices) > 0 {
		n := l.notices[0]
		l.notices = l.notices[1:]
		l.put(l.kept, n)
	}
}

// rotate starts a new file in s, deleting its oldest if need be. The kept
// series deletes its oldest file only once that file is past the
// retention; otherwise it does not rotate and rotate reports false.
func (l *Log) rotate(s *series) bool {
	l.flushSeries(s)
	oldest := s.rotated(s.keep)
	if t := mtime(oldest); !t.IsZero() {
		if s == l.kept && l.o.now().Sub(t) < l.o.Retention {
			return false
		}
		l.dropFile(oldest, "size bound")
	}
	if err := s.rotate(); err != nil {
		// Keep appending to the file we have: an audit file over its
		// size is better than a lost record.
		l.fail(err)
	}
	if s == l.kept {
		l.keptOldest = mtime(s.rotated(s.keep))
	}
	return true
}

// expire deletes the rotated files of both series whose last record is
// older than the retention.
func (l *Log) expire(now time.Time) {
	for _, s := range []*series{l.kept, l.noise} {
		for i := s.keep; i >= 1; i-- {
			name := s.rotated(i)
			if t := mtime(name); !t.IsZero() && now.Sub(t) >= l.o.Retention {
				l.dropFile(name, "retention of "+l.o.Retention.String())
			}
		}
	}
	l.keptOldest = mtime(l.kept.rotated(l.kept.keep))
	l.putNotices()
}

// checkFull says whether the kept series is about to be full of records
// younger than the retention: its current file is within a reserve of its
// size and its oldest file may not be deleted yet. The gate stops then,
// with room left for the records of connections still open.
func (l *Log) checkFull() {
	s := l.kept
	margin := min(int64(reserveBytes), s.fileBytes/8)
	if s.size+int64(len(s.buf))+margin < s.fileBytes || l.keptOldest.IsZero() || l.o.now().Sub(l.keptOldest) >= l.o.Retention {
		if l.full.Load() != nil {
			l.full.Store(nil)
			l.log.Info("the kept audit series has room again")
		}
		return
	}
	if l.full.Load() == nil {
		msg := fmt.Sprintf("the audit log is full of records younger than its retention (%s) within its size bound (%d KiB): raise [audit] max_size or lower [audit] retention",
			l.o.Retention, l.o.MaxBytes>>10)
		l.full.Store(&msg)
		l.log.Error(msg)
	}
}

// dropFile deletes name and queues a dropped record saying what was in it.
func (l *Log) dropFile(name, why string) {
	kinds := map[string]int64{}
	var n int64
	readFile(name, func(r Record) bool {
		if r.Verdict == Dropped {
			// A notice deleted in turn passes on what it counted, so the
			// newest notices add up to everything ever dropped.
			n += r.Dropped
			for k, v := range r.DroppedKinds {
				kinds[k] += v
			}
			if r.DroppedKinds == nil {
				kinds["lost"] += r.Dropped
			}
			return true
		}
		kinds[kindOf(r)]++
		n++
		return true
	})
	if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.fail(fmt.Errorf("deleting audit file: %w", err))
		return
	}
	if n == 0 {
		return
	}
	l.notices = append(l.notices, Record{Schema: Schema, Time: l.o.now().UTC(), Sandbox: l.sb, Verdict: Dropped,
		Reason: DeletedFile(filepath.Base(name), n, why), Dropped: n, DroppedKinds: kinds})
}

// kindOf is a record's kind in a dropped record's dropped_kinds.
func kindOf(r Record) string {
	switch {
	case r.Count > 0:
		return "aggregate"
	case len(r.Transforms) > 0:
		return "secret"
	case r.Verdict == Allow || r.Verdict == WouldDeny:
		return "allow"
	case r.Verdict == Deny:
		return "deny"
	}
	return "other"
}

func mtime(name string) time.Time {
	fi, err := os.Stat(name)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// flush writes what both series hold. A failure marks the log failing and
// counts the records lost; the first success after it writes a dropped
// record saying how many were lost and why.
func (l *Log) flush() {
	l.flushSeries(l.kept)
	l.flushSeries(l.noise)
	if l.why == "" && l.unwritten > 0 {
		n := l.unwritten
		l.unwritten = 0
		l.log.Warn("audit records were lost while the log could not be written", "lost", n, "why", l.lostWhy)
		l.put(l.kept, Record{Schema: Schema, Time: l.o.now().UTC(), Sandbox: l.sb, Verdict: Dropped, Dropped: n,
			Reason: Unwritten(n, l.lostWhy)})
		l.flushSeries(l.kept)
		l.flushSeries(l.noise)
	}
}

func (l *Log) flushSeries(s *series) {
	lost, err := s.flush()
	if err == nil {
		err = s.reserve()
	} else if lost > 0 {
		l.lost.Add(int64(lost))
		if l.unwritten == 0 {
			// Once an episode: the disk may refuse every flush for a
			// while, and the daemon's log is on it too. Its end is
			// logged with the total (flush).
			l.lostWhy = err.Error()
			l.log.Error("audit records could not be written", "lost", lost, "err", err)
		}
		l.unwritten += int64(lost)
	}
	s.why = ""
	if err != nil {
		l.fail(err)
		s.why = err.Error()
	}
	// Failing until both series work again.
	switch why := cmp.Or(l.kept.why, l.noise.why); {
	case why != "" && why != l.why:
		l.failing.Store(&why)
	case why == "" && l.why != "":
		l.failing.Store(nil)
	}
	l.why = cmp.Or(l.kept.why, l.noise.why)
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
	if now := time.Now(); now.Sub(l.dropLogged) >= dropLogEvery {
		// Rate-limited: under load that never lets up this comes after
		// every queue's worth. The log has every count.
		l.dropLogged = now
		l.log.Warn("audit records were dropped: the gate decided faster than they could be written", "lost", n, "lost_since_start", l.lost.Load())
	}
	l.put(l.kept, Record{Schema: Schema, Time: l.o.now().UTC(), Sandbox: sb, Verdict: Dropped,
		Reason: QueueFull(n), Dropped: n})
}

func (l *Log) fail(err error) {
	if err != nil && l.err == nil {
		l.err = err
	}
}
