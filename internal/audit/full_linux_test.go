package audit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/testfs"
)

// threat model 28, a full disk: when records cannot be written, or the disk is
// about to refuse them, the log says so (Failing), for as long as that
// lasts, and recovers on its own once there is room again. On a real
// filesystem that fills: a 2 MiB tmpfs.
func TestFailingOnFullDisk(t *testing.T) {
	t.Run("low_space", func(t *testing.T) { testFailingOnFullDisk(t, false) })
	// With no reserve, only the failed writes tell.
	t.Run("failed_writes", func(t *testing.T) {
		defer func(m uint64) { minFree = m }(minFree)
		minFree = 0
		testFailingOnFullDisk(t, true)
	})
}

func testFailingOnFullDisk(t *testing.T, wantWriteErr bool) {
	dir := testfs.Small(t, "2m")
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rec := func(name string) Record {
		return Record{Proto: "tcp", Dst: "198.51.100.1:443", Name: name, Verdict: Allow}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s within 5 s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	l.Write(rec("before.test"))
	time.Sleep(100 * time.Millisecond)
	if err := l.Failing(); err != nil {
		t.Fatalf("failing with room on the disk: %v", err)
	}

	filler := testfs.Fill(t, dir)
	// Records now fail to reach the disk; the log says so, and keeps saying
	// so while it stays full.
	for i := 0; l.Failing() == nil && i < 500; i++ {
		l.Write(rec("during.test"))
		time.Sleep(10 * time.Millisecond)
	}
	err = l.Failing()
	if err == nil {
		t.Fatal("the log did not report failing on a full disk")
	}
	t.Logf("failing: %v", err)
	l.Write(rec("still-full.test"))
	time.Sleep(100 * time.Millisecond)
	if l.Failing() == nil {
		t.Fatal("the log stopped failing while the disk is still full")
	}

	// Room again: the next record goes through and the log recovers.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor("the log recovering once there is room", func() bool {
		l.Write(rec("after.test"))
		time.Sleep(10 * time.Millisecond)
		return l.Failing() == nil
	})
	if err := l.Close(); wantWriteErr && err == nil {
		t.Error("Close reported no error for a log whose writes failed")
	}
	names := map[string]int{}
	if err := Read(path, func(r Record) bool { names[r.Name]++; return true }); err != nil {
		t.Fatal(err)
	}
	if names["before.test"] != 1 || names["after.test"] == 0 {
		t.Errorf("records read back: %v (want before.test once and after.test)", names)
	}
}

// On a disk that fills up, a record is written whole or not at all: once
// the reserve is used up, a write the disk cuts short is cut back to the
// last whole line, the records lost are counted (Lost), and a dropped
// record says so once there is room again. A 2 MiB tmpfs, filled.
func TestWholeRecordsOnFullDisk(t *testing.T) {
	defer func(m uint64) { minFree = m }(minFree)
	minFree = 0 // see the writes fail, not the free-space check
	dir := testfs.Small(t, "2m")
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	big := Reason(strings.Repeat("x", 10<<10)) // a few records outlast the reserve
	l.Write(Record{Proto: "tcp", Dst: "198.51.100.1:443", Name: "before.test", Verdict: Allow})
	waitWritten(t, l)
	filler := testfs.Fill(t, dir)
	for i := 0; l.Lost() == 0 && i < 100; i++ {
		l.Write(Record{Proto: "tcp", Dst: "198.51.100.1:443", Name: "during.test", Verdict: Allow, Reason: big})
		waitWritten(t, l)
	}
	lost := l.Lost()
	if lost == 0 {
		t.Fatal("no record was lost on a full disk: the test did not reach the end of the reserve")
	}
	if l.Failing() == nil {
		t.Error("records are lost and the log does not say it is failing")
	}
	checkWholeLines(t, path)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); l.Failing() != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("still failing with room on the disk: %v", l.Failing())
		}
		l.Write(Record{Proto: "tcp", Dst: "198.51.100.1:443", Name: "after.test", Verdict: Allow})
		waitWritten(t, l)
	}
	l.Close()
	checkWholeLines(t, path)
	var told int64
	if err := Read(path, func(r Record) bool {
		if r.Verdict == Dropped {
			told += r.Dropped
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if told != lost {
		t.Fatalf("dropped records tell of %d lost records, Lost says %d", told, lost)
	}
}

// checkWholeLines fails unless every line of the file is a whole record
// ending in "\n".
func checkWholeLines(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		t.Errorf("%s ends in part of a line: %.60q", path, data[max(0, len(data)-60):])
	}
	for i, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("%s line %d is not a whole record: %.60q", path, i+1, line)
		}
	}
}
