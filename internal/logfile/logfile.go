// Package logfile keeps the host-side logs a guest can make grow under a
// size bound.
//
// A sandbox's daemon.log takes the daemon's log and its hooks' output,
// and runsc.log takes the shim's, runsc's and the guest console's: all of
// it at the guest's pace (a hook printing in a loop, a guest root writing
// to its init's stdout). Unbounded, one guest could fill the host's disk
// through them as it could through its writable layer. A
// Writer rotates instead: when a write would take the file past its bound,
// the file becomes NAME.1 (replacing the previous NAME.1) and a new one is
// started, so a log takes at most twice its bound and keeps its most
// recent lines. The alternative, truncating in place, loses the lines
// that led up to the flood, which are the ones worth reading.
package logfile

import (
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Bounds of the sandbox's logs, each: a daemon logs a few KiB per start
// and a line per refused or held connection (rate-limited), so 16 MiB is
// weeks of normal use, and 32 MiB on disk per log is nothing a host
// notices.
const (
	DaemonMaxBytes = 16 << 20
	RunscMaxBytes  = 16 << 20
)

// Writer appends to a file and rotates it at a size. It is safe for
// concurrent use.
type Writer struct {
	path     string
	maxBytes int64
	redirect []int // fds pointed at each new file (the daemon's stdout and stderr)

	mu   sync.Mutex // guards the fields below
	f    *os.File
	size int64
}

// Options for Open.
type Options struct {
	// Truncate starts the file empty (runsc.log is one start's).
	Truncate bool
	// Redirect are fds to point at the current file after each rotation
	// (dup2), so that writes that do not go through the Writer (a Go
	// panic on stderr) land in the current file too. Their writes are
	// counted at the Writer's next write.
	Redirect []int
}

// Open opens path for appending, rotating it first if it is already past
// maxBytes.
func Open(path string, maxBytes int64, o Options) (*Writer, error) {
	w := &Writer{path: path, maxBytes: maxBytes, redirect: o.Redirect}
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if o.Truncate {
		flags |= os.O_TRUNC
		os.Remove(path + ".1")
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	w.f = f
	if err := w.sync(); err != nil {
		return nil, err
	}
	if w.size >= maxBytes {
		if err := w.rotate(); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// sync reads the file's size: writes through the redirected fds count.
func (w *Writer) sync() error {
	fi, err := w.f.Stat()
	if err != nil {
		return fmt.Errorf("reading the size of %s: %w", w.path, err)
	}
	w.size = fi.Size()
	return nil
}

func (w *Writer) rotate() error {
	if err := os.Rename(w.path, w.path+".1"); err != nil {
		return fmt.Errorf("rotating %s: %w", w.path, err)
	}
	f, err := os.OpenFile(w.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("rotating %s: %w", w.path, err)
	}
	for _, fd := range w.redirect {
		unix.Dup2(int(f.Fd()), fd)
	}
	w.f.Close()
	w.f, w.size = f, 0
	return nil
}

// Write appends p, rotating first if p would take the file past its bound.
// A single write longer than the bound keeps only its first maxBytes.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.redirect) > 0 {
		w.sync()
	}
	n := len(p)
	if int64(len(p)) > w.maxBytes {
		p = p[:w.maxBytes]
	}
	if w.size > 0 && w.size+int64(len(p)) > w.maxBytes {
		if err := w.rotate(); err != nil {
			return 0, err
		}
	}
	m, err := w.f.Write(p)
	w.size += int64(m)
	if err != nil {
		return m, err
	}
	return n, nil
}

// Close closes the current file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}

// Drain copies r into w until r ends, and never stops reading before
// that: r is a pipe whose writers (runsc, the guest's console) would block
// if it filled, so what cannot be written (a full disk) is dropped, and
// its count returned.
func Drain(w io.Writer, r io.Reader) (dropped int64) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if m, werr := w.Write(buf[:n]); werr != nil {
				dropped += int64(n - m)
			}
		}
		if err != nil {
			return dropped
		}
	}
}
