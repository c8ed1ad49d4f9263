package audit

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestSorterRoutes(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	deny := func(s int, dst string) Record {
		return Record{Time: at(s), Proto: "udp", Dst: dst, Verdict: Deny, Reason: "UDP other than DNS"}
	}
	s := newSorter(time.Hour, 10*time.Second, 2)
	type step struct {
		name string
		r    Record
		want route
	}
	steps := []step{
		{"allow", Record{Time: at(0), Proto: "tcp", Dst: "192.0.2.1:443", Verdict: Allow}, toKept},
		{"would_deny", Record{Time: at(0), Proto: "tcp", Dst: "192.0.2.1:443", Verdict: WouldDeny}, toKept},
		{"secret use refused", Record{Time: at(0), Proto: "http", Dst: "192.0.2.1:443", Verdict: Deny, Transforms: []string{"K"}}, toKept},
		{"dropped", Record{Time: at(0), Verdict: Dropped, Dropped: 3}, toKept},
		{"first denial", deny(1, "192.0.2.1:443"), toKept},
	}
	for range burst {
		steps = append(steps, step{"a repeat within the burst", deny(2, "192.0.2.1:443"), toNoise})
	}
	steps = append(steps,
		step{"a repeat past the burst", deny(2, "192.0.2.1:443"), toNone},
		step{"another reason is another refusal", Record{Time: at(2), Proto: "udp", Dst: "192.0.2.1:443", Verdict: Deny, Reason: "x"}, toKept},
		step{"set full: untracked", deny(3, "192.0.2.2:443"), toNoise},
		step{"aggregates full: counted beyond", deny(6, "192.0.2.3:443"), toNone},
		step{"past the retention, tracked afresh", deny(3601, "192.0.2.1:443"), toKept},
	)
	for _, st := range steps {
		if got := s.route(st.r); got != st.want {
			t.Errorf("%s: route %d, want %d", st.name, got, st.want)
		}
	}
}

func TestSorterAggregates(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	s := newSorter(time.Hour, 10*time.Second, 100)
	got := map[route]int{}
	for i := range 1000 {
		r := Record{Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Sandbox: "sb", Proto: "tcp",
			Dst: fmt.Sprintf("192.0.2.%d:22", i%3), Verdict: Deny, Reason: "no rule"}
		got[s.route(r)]++
	}
	if got[toKept] != 3 || got[toNoise] != 3*burst {
		t.Fatalf("routes %v; want 3 kept (one per destination) and %d one by one", got, 3*burst)
	}
	if !s.due(t0.Add(10 * time.Second)) {
		t.Fatal("the interval is not due after 10 s")
	}
	noise, beyond := s.flush(t0.Add(10 * time.Second))
	if len(beyond) != 0 || len(noise) != 3 {
		t.Fatalf("flush: %d aggregates, %d beyond; want 3 and 0", len(noise), len(beyond))
	}
	var total int64
	for _, r := range noise {
		total += r.Count
		if r.Count == 0 || r.Last.Before(r.Time) || r.Verdict != Deny || r.Reason != "no rule" || r.Sandbox != "sb" {
			t.Errorf("aggregate %+v", r)
		}
	}
	if want := int64(1000 - 3 - 3*burst); total != want {
		t.Fatalf("aggregates count %d, want %d (every denial not written one by one)", total, want)
	}
	if s.due(t0.Add(time.Hour)) {
		t.Fatal("an interval is due with nothing counted")
	}
	// The next interval writes a few one by one again.
	if r := s.route(Record{Time: t0.Add(11 * time.Second), Proto: "tcp", Dst: "192.0.2.0:22", Verdict: Deny, Reason: "no rule"}); r != toNoise {
		t.Fatalf("the first repeat of a new interval: route %d, want noise", r)
	}
}

// A guest making up destinations: the kept series gets at most the
// tracked number of them, and the rest is counted.
func TestSorterManyDestinations(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const max = 8
	s := newSorter(time.Hour, 10*time.Second, max)
	got := map[route]int{}
	for i := range 100 {
		got[s.route(Record{Time: t0, Proto: "udp", Dst: fmt.Sprintf("198.51.100.%d:%d", i, 1000+i), Verdict: Deny})]++
	}
	if got[toKept] != max || got[toNoise] != max || got[toNone] != 100-2*max {
		t.Fatalf("routes %v; want %d kept, %d noise, the rest counted", got, max, max)
	}
	_, beyond := s.flush(t0.Add(time.Minute))
	if len(beyond) != 1 || beyond[0].Count != 100-2*max {
		t.Fatalf("beyond: %+v; want one record counting %d", beyond, 100-2*max)
	}
}

// Through the log: a flood of one refusal is one kept record and
// aggregates with counts, in the noise series; the allowed records stay.
func TestLogAggregatesFlood(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := OpenWith(path, Options{MaxBytes: MinMaxBytes, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l.Write(Record{Sandbox: "sb", Proto: "tcp", Dst: "192.0.2.9:443", Name: "api.test", Verdict: Allow, Transforms: []string{"KEY"}})
	const n = 20000
	for i := range n {
		l.Write(Record{Sandbox: "sb", Proto: "udp", Dst: "203.0.113.1:443", Verdict: Deny, Reason: "UDP other than DNS"})
		if i%1000 == 0 {
			time.Sleep(20 * time.Millisecond) // let intervals pass
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var single, aggregates, secret int
	var counted int64
	for _, r := range readAll(t, path) {
		switch {
		case r.Verdict == Dropped:
			counted += r.Dropped // queue drops: the flood outran the writer
		case len(r.Transforms) > 0:
			secret++
		case r.Count > 0:
			aggregates++
			counted += r.Count
		case r.Verdict == Deny:
			single++
			counted++
		}
	}
	if secret != 1 || aggregates < 2 || counted != n {
		t.Fatalf("secret %d, aggregates %d; %d denials accounted for; want 1, several, %d", secret, aggregates, counted, n)
	}
	if single+aggregates > n/100 {
		t.Fatalf("%d records one by one and %d aggregates for %d denials: not aggregated", single, aggregates, n)
	}
}

// A guest making up destinations fills the noise series, which rotates
// within its budget; the kept records stay, the files stay under the
// bound, and the kept series says what the noise series lost.
func TestLogNoiseRotatesKeptStays(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	clock := newClock()
	l, err := OpenWith(path, Options{MaxBytes: MinMaxBytes, now: clock.now, maxTracked: 4})
	if err != nil {
		t.Fatal(err)
	}
	const allows = 50
	for i := range allows {
		l.Write(rec(i))
	}
	const n = 20000
	for i := range n {
		l.Write(Record{Sandbox: "sb", Proto: "tcp", Dst: fmt.Sprintf("198.51.%d.%d:%d", i>>8&255, i&255, 1+i%60000), Verdict: Deny, Reason: "no rule"})
		if i%8 == 7 {
			clock.add(DefaultInterval) // a new interval every 8 denials
		}
		if i%1024 == 0 {
			waitQueued(t, l) // no queue drops: every denial is accounted for
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, path)
	if got := bytesUp(recs); len(got) != allows {
		t.Fatalf("%d of %d allowed records left", len(got), allows)
	}
	var dropped int64
	for _, r := range recs {
		if r.Verdict == Dropped && r.DroppedKinds["deny"] > 0 {
			dropped += r.Dropped
		}
	}
	if dropped == 0 {
		t.Fatal("no dropped record tells of the denials the noise series rotated away")
	}
	var total int64
	for _, name := range auditFiles(t, dir) {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
	}
	if total > MinMaxBytes {
		t.Fatalf("the audit files hold %d bytes, over their bound of %d", total, MinMaxBytes)
	}
	t.Logf("%d bytes in %d files; %d denials' records rotated away", total, len(auditFiles(t, dir)), dropped)
}

// A flood of one refusal is counted before the queue: it cannot crowd out
// the records that matter while the disk is slow (the writer not running
// here).
func TestFloodDoesNotCrowdTheQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := newLog(path, Options{queued: 2 + 1 + burst + 1})
	if err != nil {
		t.Fatal(err)
	}
	l.Write(rec(1))
	for range 10000 {
		l.Write(Record{Sandbox: "sb", Proto: "udp", Dst: "203.0.113.1:443", Verdict: Deny, Reason: "UDP other than DNS"})
	}
	l.Write(rec(2))
	go l.run()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var counted int64
	for _, r := range readAll(t, path) {
		if r.Verdict == Deny {
			counted += max(r.Count, 1)
		}
	}
	if got := bytesUp(readAll(t, path)); got[1] != 1 || got[2] != 1 || l.Lost() != 0 || counted != 10000 {
		t.Fatalf("allows %v, %d lost, %d denials accounted for; want both allows, none lost, 10000", got, l.Lost(), counted)
	}
}
