package audit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func readAll(t *testing.T, path string) []Record {
	t.Helper()
	var out []Record
	if err := Read(path, func(r Record) bool { out = append(out, r); return true }); err != nil {
		t.Fatal(err)
	}
	return out
}

func rec(i int) Record {
	return Record{Sandbox: "sb", Proto: "tcp", Dst: fmt.Sprintf("192.0.2.1:%d", 1+i%60000), Verdict: Allow, BytesUp: int64(i)}
}

func TestLogWriteSetsSchemaAndTime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	l.Write(Record{Sandbox: "sb", Proto: "dns", Dst: "gateway:53", Verdict: Deny})
	l.Write(Record{Schema: 99, Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)), Verdict: Allow})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, path)
	if len(got) != 2 {
		t.Fatalf("got %d records, want 2", len(got))
	}
	if got[0].Schema != Schema || got[0].Time.Before(before.Add(-time.Second)) || got[0].Time.Location() != time.UTC {
		t.Errorf("first record: schema %d, time %v", got[0].Schema, got[0].Time)
	}
	if want := time.Date(2026, 1, 2, 2, 4, 5, 0, time.UTC); got[1].Schema != Schema || !got[1].Time.Equal(want) {
		t.Errorf("second record: schema %d, time %v, want %v", got[1].Schema, got[1].Time, want)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
}

// Rotation within the retention never deletes a kept record: the kept
// series stops rotating and says so (Failing), and the records still
// coming go to the noise series; once the clock passes the retention, the
// oldest kept file goes, and a dropped record says what was in it.
func TestLogRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	clock := newClock()
	const fileBytes, keep = 1000, 2
	l, err := OpenWith(path, Options{fileBytes: fileBytes, keep: keep, Retention: time.Hour, now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; l.Failing() == nil && n < 200; n++ {
		l.Write(rec(n))
		waitWritten(t, l)
	}
	if l.Failing() == nil {
		t.Fatalf("%d records in %d-byte files, %d rotated: the kept series never said it was full", n, fileBytes, keep)
	}
	t.Logf("full after %d records: %v", n, l.Failing())
	// Decisions already made still get recorded (in the noise series).
	for i := range 5 {
		l.Write(rec(n + i))
	}
	waitWritten(t, l)
	got := bytesUp(readAll(t, path))
	for i := range n + 5 {
		if got[int64(i)] != 1 {
			t.Fatalf("record #%d read %d times, want once", i, got[int64(i)])
		}
	}
	for _, name := range auditFiles(t, dir) {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > fileBytes || fi.Size() == 0 {
			t.Errorf("%s: %d bytes, want 1 to %d", name, fi.Size(), fileBytes)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", name, fi.Mode().Perm())
		}
	}

	// Past the retention, the oldest kept file may go, and is accounted for.
	clock.add(2 * time.Hour)
	for i := range 20 {
		l.Write(rec(1000 + i))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var dropped int64
	kinds := map[string]int64{}
	recs := readAll(t, path)
	for _, r := range recs {
		if r.Verdict == Dropped {
			dropped += r.Dropped
			for k, v := range r.DroppedKinds {
				kinds[k] += v
			}
		}
	}
	got = bytesUp(recs)
	var left int64
	for i := range n + 5 {
		left += got[int64(i)]
	}
	if dropped == 0 || kinds["allow"] != dropped || left+dropped < int64(n+5) {
		t.Fatalf("after the retention: %d of the first %d records left, %d dropped (%v); want the rest dropped, as allow", left, n+5, dropped, kinds)
	}
	if l.Failing() != nil {
		t.Errorf("still failing after the retention freed the kept series: %v", l.Failing())
	}
}

// clock is a settable time for Options.now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

// newClock starts at the real time: files' mtimes, which the retention
// is judged by, are the real clock's.
func newClock() *clock { return &clock{t: time.Now()} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// waitWritten returns once the writer has taken everything queued and
// flushed it.
func waitWritten(t *testing.T, l *Log) {
	t.Helper()
	waitQueued(t, l)
	time.Sleep(20 * time.Millisecond)
}

// waitQueued returns once the writer has taken everything queued.
func waitQueued(t *testing.T, l *Log) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(l.queue) > 0; {
		if time.Now().After(deadline) {
			t.Fatal("the writer did not drain its queue within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

func bytesUp(recs []Record) map[int64]int64 {
	m := map[int64]int64{}
	for _, r := range recs {
		if r.Verdict == Allow {
			m[r.BytesUp]++
		}
	}
	return m
}

// auditFiles lists both series' files in dir.
func auditFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "audit*.jsonl*"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestLogReopenAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	for i := range 3 {
		l, err := Open(path, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		l.Write(rec(i))
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := readAll(t, path); len(got) != 3 || got[2].BytesUp != 2 {
		t.Fatalf("got %+v", got)
	}
}

func TestLogAfterTornLine(t *testing.T) {
	// moat died in the middle of a line: only that line is lost.
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(path, []byte(`{"schema":1,"verdict":"allow","bytes_up":7}`+"\n"+`{"schema":1,"verd`), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	l.Write(rec(8))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, path)
	if len(got) != 2 || got[0].BytesUp != 7 || got[1].BytesUp != 8 {
		t.Fatalf("got %+v", got)
	}
}

func TestLogConcurrentWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, 16<<10, 50) // keep everything, rotate often
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				l.Write(rec(w*each + i))
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	seen := make(map[int64]bool)
	var dropped int64
	for _, r := range readAll(t, path) {
		if r.Verdict == Dropped {
			dropped += r.Dropped
			continue
		}
		if seen[r.BytesUp] {
			t.Fatalf("record #%d twice", r.BytesUp)
		}
		seen[r.BytesUp] = true
	}
	if int64(len(seen))+dropped != writers*each {
		t.Fatalf("%d records and %d dropped, want %d in all", len(seen), dropped, writers*each)
	}
}

func TestLogDropsWhenFullAndSaysSo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := newLog(path, Options{queued: 2}) // writer not started yet: a stalled disk
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r := rec(i)
		r.Sandbox = "stalled"
		l.Write(r) // must not block
	}
	go l.run()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, path)
	if len(got) != 3 {
		t.Fatalf("got %d records, want 2 and a dropped record: %+v", len(got), got)
	}
	d := got[len(got)-1]
	if d.Verdict != Dropped || d.Dropped != 3 || d.Sandbox != "stalled" || d.Schema != Schema || d.Time.IsZero() {
		t.Fatalf("dropped record %+v", d)
	}
}

// An open log's queue holds pointers, not records: a channel's buffer is
// allocated whole, and an idle gate process would carry queueLen records.
func TestOpenDoesNotAllocateTheQueuedRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	l, err := newLog(path, Options{})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { go l.run(); l.Close() }()
	got, whole := after.TotalAlloc-before.TotalAlloc, uint64(queueLen)*uint64(unsafe.Sizeof(Record{}))
	if got >= whole/4 {
		t.Fatalf("opening a log allocated %d bytes; %d records by value are %d", got, queueLen, whole)
	}
}

func TestLogCloseTwiceAndWriteAfterClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	l.Write(rec(1))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.Write(rec(2)) // no panic, no effect
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, path); len(got) != 1 {
		t.Fatalf("got %d records, want 1", len(got))
	}
}

func TestOpenFails(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "missing", "audit.jsonl"), 0, 0)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want ErrNotExist", err)
	}
}

func TestReadMissing(t *testing.T) {
	err := Read(filepath.Join(t.TempDir(), "audit.jsonl"), func(Record) bool { return true })
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want ErrNotExist", err)
	}
}

func TestReadOrderStopAndDamage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	line := func(i int) string { return fmt.Sprintf(`{"schema":1,"verdict":"allow","bytes_up":%d}`+"\n", i) }
	files := map[string]string{
		path + ".10": line(0),
		path + ".2":  line(1) + "not json\n\n" + line(2),
		path + ".1":  line(3),
		path:         line(4) + `{"schema":1,"verdict":"all`, // still being written
		path + ".x":  line(99),                               // not ours
		path + ".01": line(99),
		path + ".0":  line(99),
	}
	for name, s := range files {
		if err := os.WriteFile(name, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var got []int64
	if err := Read(path, func(r Record) bool { got = append(got, r.BytesUp); return true }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[0 1 2 3 4]" {
		t.Fatalf("got %v, want [0 1 2 3 4]", got)
	}
	got = nil
	if err := Read(path, func(r Record) bool { got = append(got, r.BytesUp); return len(got) < 2 }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[0 1]" {
		t.Fatalf("stopping: got %v, want [0 1]", got)
	}
}

// follower follows one log: Follow is FollowLogs of one path.
func follower(t *testing.T, path string) <-chan Record {
	t.Helper()
	return logsFollower(t, path)
}

func expect(t *testing.T, ch <-chan Record, want int64) {
	t.Helper()
	select {
	case r := <-ch:
		if r.BytesUp != want {
			t.Fatalf("followed record #%d, want #%d", r.BytesUp, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("record #%d not followed within 5 s", want)
	}
}

func TestFollowAcrossRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	ch := follower(t, path) // before the file exists: it waits
	time.Sleep(2 * followPoll)
	l, err := Open(path, 400, 5) // a record is ~150 bytes: rotates every 2–3
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 12 {
		l.Write(rec(i))
		expect(t, ch, int64(i))
	}
	if names, _ := filepath.Glob(path + ".*"); len(names) < 3 {
		t.Fatalf("only %v: the test did not rotate", names)
	}
	// A burst between polls, within one file's worth.
	l.Write(rec(12))
	l.Write(rec(13))
	expect(t, ch, 12)
	expect(t, ch, 13)
}

func TestFollowStartsAtTopAndWaitsForWholeLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(path, []byte(`{"schema":1,"bytes_up":0}`+"\n"+`{"schema":1,"by`), 0o600); err != nil {
		t.Fatal(err)
	}
	ch := follower(t, path)
	expect(t, ch, 0)
	time.Sleep(2 * followPoll)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(`tes_up":1}` + "\n"); err != nil {
		t.Fatal(err)
	}
	expect(t, ch, 1)
	// Truncated in place: followed again from the top.
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * followPoll)
	if _, err := f.WriteString(`{"schema":1,"bytes_up":2}` + "\n"); err != nil {
		t.Fatal(err)
	}
	expect(t, ch, 2)
}
