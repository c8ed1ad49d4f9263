package audit

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestRecordsGolden writes the records the audit log writes of its own
// (aggregates, the count of denials beyond the tracked set, the dropped
// records) through the code that writes them, and compares their JSON to
// testdata/records.golden byte for byte: the audit's JSON is frozen. The
// gate's records have their own golden file in internal/gate. Run with
// -update to rewrite the file after a deliberate addition.
func TestRecordsGolden(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	var got bytes.Buffer
	put := func(name string, r Record) {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got.WriteString(name + " " + string(b) + "\n")
	}

	// A flood: one destination's repeats, then more destinations than
	// the interval has aggregates for.
	s := newSorter(time.Hour, 10*time.Second, 2)
	denied := func(i int, dst string) Record {
		return Record{Schema: Schema, Time: t0.Add(time.Duration(i) * time.Millisecond), Sandbox: "sb", Proto: "tcp",
			Dst: dst, Name: "evil.test", NameFrom: "sni", Verdict: Deny, Reason: "no rule allows it"}
	}
	for i := range burst + 5 {
		s.route(denied(i, "198.51.100.1:443"))
	}
	for i := range 6 {
		s.route(denied(100+i, "198.51.100.2:"+string(rune('0'+i))))
	}
	noise, kept := s.flush(t0.Add(10 * time.Second))
	for _, r := range noise {
		put("aggregate", r)
	}
	for _, r := range kept {
		put("beyond-tracked", r)
	}

	clock := &clock{t: t0}
	dir := t.TempDir()

	// The queue was full.
	path := filepath.Join(dir, "queue", "audit.jsonl")
	os.MkdirAll(filepath.Dir(path), 0o700)
	l, err := newLog(path, Options{queued: 1, now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		l.Write(Record{Time: t0, Sandbox: "sb", Proto: "tcp", Dst: "192.0.2.1:443", Verdict: Allow, BytesUp: int64(i)})
	}
	go l.run()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, r := range readAll(t, path) {
		if r.Verdict == Dropped {
			put("dropped-queue", r)
		}
	}

	// Records the disk refused, told once it takes them again.
	path = filepath.Join(dir, "disk", "audit.jsonl")
	os.MkdirAll(filepath.Dir(path), 0o700)
	l, err = newLog(path, Options{now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	l.sb, l.unwritten, l.lostWhy = "sb", 3, "write audit.jsonl: no space left on device"
	l.flush()
	l.kept.close()
	l.noise.close()
	for _, r := range readAll(t, path) {
		put("dropped-unwritten", r)
	}

	// A file deleted for the retention, with a record of every kind.
	path = filepath.Join(dir, "retention", "audit.jsonl")
	os.MkdirAll(filepath.Dir(path), 0o700)
	l, err = newLog(path, Options{now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	old := path + ".3"
	var lines bytes.Buffer
	for _, r := range []Record{
		{Verdict: Allow}, {Verdict: WouldDeny}, {Verdict: Allow, Transforms: []string{"API_KEY:header:authorization"}},
		{Verdict: Deny}, {Verdict: Deny, Count: 7}, {Verdict: Dropped, Dropped: 2},
		{Verdict: Dropped, Dropped: 3, DroppedKinds: map[string]int64{"allow": 2, "deny": 1}},
	} {
		r.Schema, r.Time, r.Sandbox = Schema, t0, "sb"
		b, _ := json.Marshal(r)
		lines.Write(append(b, '\n'))
	}
	if err := os.WriteFile(old, lines.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	l.sb = "sb"
	l.dropFile(old, "retention of 168h0m0s")
	for _, r := range l.notices {
		put("dropped-deleted", r)
	}
	l.kept.close()
	l.noise.close()

	compareGolden(t, filepath.Join("testdata", "records.golden"), got.Bytes())
}

// compareGolden compares got with the golden file at path, or rewrites
// the file with -update.
func compareGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the golden file (write it with go test -run %s -update): %v", t.Name(), err)
	}
	if bytes.Equal(got, want) {
		return
	}
	gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Errorf("%s line %d:\n got  %s\n want %s", path, i+1, g, w)
		}
	}
}
