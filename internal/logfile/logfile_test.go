package logfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func size(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestWriterBoundsAndKeepsTheLatest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "daemon.log")
	const max = 1000
	w, err := Open(path, max, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		if _, err := w.Write([]byte(strings.Repeat("x", 30) + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	w.Write([]byte("last line\n"))
	w.Close()
	if got := size(t, path) + size(t, path+".1"); got > 2*max {
		t.Errorf("%d bytes on disk, want at most %d", got, 2*max)
	}
	b, _ := os.ReadFile(path)
	if !strings.HasSuffix(string(b), "last line\n") {
		t.Errorf("the newest line is not at the end of the current file: %q", b)
	}
	// A line never straddles two files.
	b1, _ := os.ReadFile(path + ".1")
	if !strings.HasSuffix(string(b1), "\n") || !strings.HasPrefix(string(b), "x") {
		t.Errorf("rotation cut a line: .1 ends %q, current starts %q", b1[len(b1)-3:], b[:3])
	}
}

func TestWriterHugeWriteAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runsc.log")
	w, err := Open(path, 100, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.Write(bytes.Repeat([]byte("y"), 10000)); n != 10000 || err != nil {
		t.Errorf("Write = %d, %v", n, err)
	}
	w.Close()
	if got := size(t, path); got != 100 {
		t.Errorf("a write past the bound left %d bytes, want 100", got)
	}
	// Opened again past its bound: rotated at once.
	w, err = Open(path, 100, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if size(t, path) != 0 || size(t, path+".1") != 100 {
		t.Errorf("reopened: %d and %d bytes", size(t, path), size(t, path+".1"))
	}
	// Truncate starts afresh, without the previous start's .1.
	w, err = Open(path, 100, Options{Truncate: true})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if size(t, path) != 0 || size(t, path+".1") != 0 {
		t.Errorf("truncated: %d and %d bytes", size(t, path), size(t, path+".1"))
	}
}

// failing fails every write, as a full disk does.
type failing struct{}

func (failing) Write(p []byte) (int, error) { return 0, errors.New("no space left on device") }

func TestDrainNeverStopsReading(t *testing.T) {
	in := bytes.Repeat([]byte("z"), 1<<20)
	r := bytes.NewReader(in)
	if dropped := Drain(failing{}, r); dropped != int64(len(in)) {
		t.Errorf("dropped %d, want %d", dropped, len(in))
	}
	if r.Len() != 0 {
		t.Errorf("%d bytes left unread", r.Len())
	}
}
