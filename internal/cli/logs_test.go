package cli

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"moat.dev/moat/internal/logfile"
	"moat.dev/moat/internal/termtest"
)

// TestPrintLogFollowsRotation: `moat logs -f` prints every line, also
// those written after the log rotated under it.
func TestPrintLogFollowsRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "daemon.log")
	w, err := logfile.Open(path, 100, logfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var alive atomic.Bool
	alive.Store(true)
	var out termtest.Screen
	done := make(chan error, 1)
	go func() { done <- printLog(&out, path, true, alive.Load) }()
	const lines = 12 // 30 bytes each: three rotations
	for i := 0; i < lines; i++ {
		fmt.Fprintf(w, "line %02d %s\n", i, strings.Repeat(".", 21))
		// Slower than the follower's polls, so no file is rotated away
		// twice before it looks.
		time.Sleep(250 * time.Millisecond)
	}
	alive.Store(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("printLog did not return after the writer died")
	}
	for i := 0; i < lines; i++ {
		if want := fmt.Sprintf("line %02d ", i); strings.Count(out.String(), want) != 1 {
			t.Errorf("%q printed %d times, want once; output:\n%s", want, strings.Count(out.String(), want), out.String())
		}
	}
}
