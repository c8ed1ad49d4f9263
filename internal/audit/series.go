package audit

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// reserveBytes is the room each open audit file keeps preallocated past
// its end (fallocate, FALLOC_FL_KEEP_SIZE): appends into it need no new
// blocks, so once the disk is full the records of decisions already made
// (the ends of connections in flight, the denials the gate then makes)
// still fit. 64 KiB: some two hundred records.
const reserveBytes = 64 << 10

// series is one rotated sequence of audit files: path, then path.1 …
// path.keep, newer to older. It writes whole lines or nothing. Owned by
// the writer goroutine.
type series struct {
	path      string
	fileBytes int64 // a file is rotated before the next lines would take it past this
	keep      int   // rotated files at most

	f          *os.File // nil after a failure closed it: opened again at the next flush
	size       int64    // of f: always the end of a whole line
	reservedTo int64    // the preallocated reserve reaches this offset
	buf        []byte   // whole lines waiting for the next flush
	n          int      // lines in buf
	short      bool     // the last reserve could not be had: try again at every flush
	why        string   // why the last flush or reserve failed; "" when it worked
}

func openSeries(path string, fileBytes int64, keep int) (*series, error) {
	s := &series{path: path, fileBytes: fileBytes, keep: keep}
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

// open opens path for appending (creating it 0600). A file that does not
// end in a newline (moat died in the middle of a line, or a cut-back
// failed) gets one, so the next record starts on a line of its own and
// the torn one reads as damage, never as a record.
func (s *series) open() error {
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening audit log: %w", err)
	}
	if err := s.adopt(f); err != nil {
		f.Close()
		return fmt.Errorf("opening audit log: %w", err)
	}
	return nil
}

func (s *series) adopt(f *os.File) error {
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if size > 0 {
		last := make([]byte, 1)
		r, err := os.Open(s.path)
		if err == nil {
			_, err = r.ReadAt(last, size-1)
			r.Close()
		}
		if err != nil {
			return err
		}
		if last[0] != '\n' {
			if _, err := f.Write([]byte{'\n'}); err != nil {
				return err
			}
			size++
		}
	}
	s.f, s.size, s.reservedTo = f, size, 0
	return nil
}

// fits reports whether line can join this file without rotating it.
func (s *series) fits(line []byte) bool {
	have := s.size + int64(len(s.buf))
	return have == 0 || have+int64(len(line)) <= s.fileBytes
}

func (s *series) add(line []byte) {
	s.buf = append(s.buf, line...)
	s.n++
}

// flush writes the buffered lines. A write that fails part way is cut
// back to its last whole line, so no reader ever sees part of a record;
// it returns how many records were lost and why.
func (s *series) flush() (lost int, err error) {
	if len(s.buf) == 0 {
		return 0, nil
	}
	buf, n := s.buf, s.n
	s.buf, s.n = s.buf[:0], 0
	if s.f == nil {
		if err := s.open(); err != nil {
			return n, err
		}
	}
	w, err := s.f.Write(buf)
	if err == nil {
		s.size += int64(w)
		return 0, nil
	}
	whole := bytes.LastIndexByte(buf[:w], '\n') + 1
	if w > whole {
		if terr := s.f.Truncate(s.size + int64(whole)); terr != nil {
			// The torn tail stays; open ends it with "\n" before the
			// next record, which makes it unreadable as a record.
			s.f.Close()
			s.f = nil
		}
	}
	s.size += int64(whole)
	return n - bytes.Count(buf[:whole], []byte{'\n'}), fmt.Errorf("writing audit log: %w", err)
}

// reserve keeps reserveBytes preallocated past the end of the file. It
// fails when the disk has no room left for it: the records still fit,
// but the gate must stop before they no longer do.
func (s *series) reserve() error {
	if s.f == nil || !s.short && s.size+reserveBytes/2 <= s.reservedTo {
		return nil
	}
	err := unix.Fallocate(int(s.f.Fd()), unix.FALLOC_FL_KEEP_SIZE, s.size, reserveBytes)
	s.short = false
	switch {
	case err == nil:
		s.reservedTo = s.size + reserveBytes
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS):
		// A filesystem without preallocation: the free-space check
		// (MinFree) is the only guard there.
		s.reservedTo = math.MaxInt64
	default:
		s.short = true
		return fmt.Errorf("keeping the audit log's %d KiB reserve: %w", reserveBytes>>10, err)
	}
	return nil
}

// release gives back the reserve past the end of the file, which a file
// that is no longer written does not need.
func (s *series) release() {
	if s.f == nil || s.reservedTo <= s.size || s.reservedTo == math.MaxInt64 {
		return
	}
	unix.Fallocate(int(s.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, s.size, s.reservedTo-s.size)
	s.reservedTo = 0
}

// rotate shifts path.(keep-1) … path.1, path up by one and starts a new,
// empty path. The caller has flushed, and has dealt with path.keep,
// which the shift overwrites.
func (s *series) rotate() error {
	s.release()
	for i := s.keep - 1; i >= 1; i-- {
		err := os.Rename(s.rotated(i), s.rotated(i+1))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotating audit log: %w", err)
		}
	}
	if err := os.Rename(s.path, s.rotated(1)); err != nil {
		return fmt.Errorf("rotating audit log: %w", err)
	}
	old := s.f
	s.f = nil
	err := s.open()
	if old != nil {
		old.Close()
	}
	return err
}

func (s *series) close() error {
	if s.f == nil {
		return nil
	}
	s.release()
	err := s.f.Close()
	s.f = nil
	return err
}

func (s *series) rotated(i int) string { return s.path + "." + strconv.Itoa(i) }
