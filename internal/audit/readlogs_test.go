package audit

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeLines writes records to name, one JSON line each, appending.
func writeLines(t *testing.T, name string, recs ...string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, r := range recs {
		if _, err := f.WriteString(r + "\n"); err != nil {
			t.Fatal(err)
		}
	}
}

// at is a record numbered n (in bytes_up) at second sec of a fixed day.
func at(n, sec int) string {
	return fmt.Sprintf(`{"schema":1,"time":"2026-01-02T03:04:%02dZ","verdict":"allow","bytes_up":%d}`, sec, n)
}

func TestReadLogsMergesByTime(t *testing.T) {
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate", "audit.jsonl")
	fwd := filepath.Join(dir, "fwd", "forward.jsonl")
	// Each series' order is kept even where a time goes back (#4 after
	// #5 in the gate's kept series: an "end" carries its start); the
	// series are interleaved by time; a tie goes to the earlier log.
	writeLines(t, gate+".1", at(1, 1))
	writeLines(t, gate, at(3, 3), at(5, 6), at(4, 4), at(8, 9))
	writeLines(t, NoisePath(gate), at(2, 2))
	writeLines(t, fwd, at(6, 6), at(7, 7))
	writeLines(t, NoisePath(fwd), at(9, 10))
	missing := filepath.Join(dir, "never", "x.jsonl")
	for _, tc := range []struct {
		paths []string
		want  string
	}{
		{[]string{gate, fwd}, "[1 2 3 5 4 6 7 8 9]"},
		{[]string{fwd, gate}, "[1 2 3 6 5 4 7 8 9]"},
		{[]string{gate, missing}, "[1 2 3 5 4 8]"},
		{[]string{missing, fwd}, "[6 7 9]"},
	} {
		var got []int64
		if err := ReadLogs(tc.paths, func(r Record) bool { got = append(got, r.BytesUp); return true }); err != nil {
			t.Fatalf("ReadLogs(%v): %v", tc.paths, err)
		}
		if fmt.Sprint(got) != tc.want {
			t.Errorf("ReadLogs(%v): got %v, want %s", tc.paths, got, tc.want)
		}
	}
	var got []int64
	if err := ReadLogs([]string{gate, fwd}, func(r Record) bool { got = append(got, r.BytesUp); return len(got) < 3 }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("stopping: got %v, want [1 2 3]", got)
	}
	err := ReadLogs([]string{missing, filepath.Join(dir, "x.jsonl")}, func(Record) bool { return true })
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no log at all: got %v, want ErrNotExist", err)
	}
}

// logsFollower runs FollowLogs and hands records to the test.
func logsFollower(t *testing.T, paths ...string) <-chan Record {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan Record, 1000)
	done := make(chan error, 1)
	go func() { done <- FollowLogs(ctx, paths, func(r Record) { ch <- r }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("FollowLogs: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("FollowLogs did not return after cancel")
		}
	})
	return ch
}

func TestFollowLogsMergesAndFollowsEach(t *testing.T) {
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate", "audit.jsonl")
	fwd := filepath.Join(dir, "fwd", "forward.jsonl") // its directory comes later
	writeLines(t, gate, at(1, 1), at(3, 3))
	writeLines(t, NoisePath(gate), at(2, 2))
	ch := logsFollower(t, gate, fwd)
	// What the files hold when it starts: merged by time.
	for _, want := range []int64{1, 2, 3} {
		expect(t, ch, want)
	}
	time.Sleep(2 * followPoll)
	writeLines(t, fwd, at(4, 4))
	expect(t, ch, 4)
	writeLines(t, gate, at(5, 5))
	expect(t, ch, 5)
	writeLines(t, NoisePath(fwd), at(6, 6))
	expect(t, ch, 6)
	select {
	case r := <-ch:
		t.Errorf("followed #%d, which nobody wrote", r.BytesUp)
	case <-time.After(2 * followPoll):
	}
}

func TestFollowLongAndOverlongLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	// Longer than a read (followChunk): whole. Longer than maxLineBytes:
	// skipped, and the record after it is not.
	long := fmt.Sprintf(`{"schema":1,"bytes_up":1,"name":%q}`, strings.Repeat("a", 3*followChunk))
	overlong := fmt.Sprintf(`{"schema":1,"bytes_up":99,"name":%q}`, strings.Repeat("b", maxLineBytes+followChunk))
	writeLines(t, path, at(0, 0), long, overlong, at(2, 2))
	ch := logsFollower(t, path)
	expect(t, ch, 0)
	select {
	case r := <-ch:
		if r.BytesUp != 1 || len(r.Name) != 3*followChunk {
			t.Fatalf("followed #%d with a name of %d bytes, want #1 with %d", r.BytesUp, len(r.Name), 3*followChunk)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the long record not followed within 5 s")
	}
	expect(t, ch, 2)
}
