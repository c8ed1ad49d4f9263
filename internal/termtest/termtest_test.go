package termtest

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatal records a Fatalf and ends the goroutine, as testing's does.
type fatal struct {
	testing.TB
	msg string
}

func (f *fatal) Helper() {}
func (f *fatal) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn with a TB whose Fatalf is recorded; it returns the message.
func run(t *testing.T, fn func(tb testing.TB)) string {
	f := &fatal{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
	return f.msg
}

func TestWaitAfterMark(t *testing.T) {
	r, w := io.Pipe()
	s := Read(r)
	w.Write([]byte("ready\n"))
	s.WaitFor(t, "ready", 5*time.Second)
	mark := s.Len()
	msg := run(t, func(tb testing.TB) { s.WaitAfter(tb, mark, "ready", 100*time.Millisecond) })
	if !strings.Contains(msg, `never showed "ready" within 100ms`) {
		t.Errorf("text shown before the mark was found after it: %q", msg)
	}
	go w.Write([]byte("again ready\n"))
	s.WaitAfter(t, mark, "again ready", 5*time.Second)
	w.Close()
}

// echo answers each write with the n-th answer once n writes came.
type echo struct {
	s      *Screen
	writes atomic.Int32
	answer int32
}

func (e *echo) Write(p []byte) (int, error) {
	if e.writes.Add(1) == e.answer {
		e.s.Write([]byte("ANSWER\n"))
	}
	return len(p), nil
}

func TestSendUntilSendsAgain(t *testing.T) {
	s := &Screen{}
	e := &echo{s: s, answer: 2}
	s.SendUntil(t, e, []byte("x"), "ANSWER", 5*time.Second)
	if n := e.writes.Load(); n != 2 {
		t.Errorf("sent %d times, want 2: the first went unanswered, the second was answered", n)
	}

	never := &echo{s: &Screen{}, answer: -1}
	msg := run(t, func(tb testing.TB) { never.s.SendUntil(tb, never, []byte("x"), "ANSWER", 2500*time.Millisecond) })
	if !strings.Contains(msg, "never showed") || never.writes.Load() != 3 {
		t.Errorf("an answer that never came: %q after %d sends, want a failure after 3", msg, never.writes.Load())
	}
}
