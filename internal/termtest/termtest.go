// Package termtest is what tests read output with as it is written: a
// screen that collects what a pty (or a TUI writing to one), a log or a
// session's stream shows, safe for the writer's goroutine and the test's,
// and bounded waits for text on it.
package termtest

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// Screen collects what a terminal shows. Safe for one writer and any
// number of readers.
type Screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Read returns a screen that collects what r (a pty's master) gives until
// it fails.
func Read(r io.Reader) *Screen {
	s := &Screen{}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			s.Write(b[:n])
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (s *Screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

// Shown is everything shown so far.
func (s *Screen) Shown() string { return s.Since(0) }

// String is Shown, for a screen used as a log's writer.
func (s *Screen) String() string { return s.Shown() }

// Len is how many bytes were shown so far: a mark for Since and WaitAfter.
func (s *Screen) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Len()
}

// Since is what was shown after mark.
func (s *Screen) Since(mark int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buf.Bytes()
	if mark > len(b) {
		return ""
	}
	return string(b[mark:])
}

// WaitFor waits until the screen shows want, for at most within, and
// fails the test with the screen's end if it never does. It returns
// what was shown then.
func (s *Screen) WaitFor(t testing.TB, want string, within time.Duration) string {
	t.Helper()
	return s.WaitAfter(t, 0, want, within)
}

// WaitAfter is WaitFor for what is shown after mark.
func (s *Screen) WaitAfter(t testing.TB, mark int, want string, within time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if shown := s.Since(mark); strings.Contains(shown, want) {
			return shown
		}
	}
	s.fail(t, want, within)
	return ""
}

// SendUntil writes send to w (the terminal), again every second, until the
// screen shows want, for at most within. For what a loaded host may let
// race: a window change that reaches the guest after the command that
// reads the size, a Ctrl-C typed before the command it is meant for
// started.
func (s *Screen) SendUntil(t testing.TB, w io.Writer, send []byte, want string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); {
		w.Write(send)
		for next := time.Now().Add(time.Second); time.Now().Before(next); time.Sleep(20 * time.Millisecond) {
			if strings.Contains(s.Shown(), want) {
				return
			}
		}
	}
	s.fail(t, want, within)
}

// fail ends the test with the last 4,000 bytes shown, quoted: a TUI's
// escapes stay visible.
func (s *Screen) fail(t testing.TB, want string, within time.Duration) {
	t.Helper()
	shown := s.Shown()
	if len(shown) > 4000 {
		shown = "..." + shown[len(shown)-4000:]
	}
	t.Fatalf("the terminal never showed %q within %v; it showed:\n%q", want, within, shown)
}
