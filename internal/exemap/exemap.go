// Package exemap hands a long-lived moat process's mappings of its own
// executable back to the page cache while the process idles.
//
// Every moat process on the host (the keeper, the gate process, the
// reaper, the shim) is the one static binary, and package initialisation
// alone touches pages all over its text and read-only data; the kernel
// maps a whole window of the file around each of those faults. An idle
// process uses a small part of what it has mapped by then, and PSS counts
// all of it. Those pages are clean copies of the file: the kernel itself
// may take them from a process at any time under memory pressure and map
// them again from the page cache at the next touch. Release does the same
// on purpose with madvise(MADV_DONTNEED) on the executable's read-only
// mappings: this process's page-table entries go, the page cache keeps the
// pages (shared with every other moat process, and reclaimable once no
// process maps them), and the next touch is a minor fault.
//
// Only what cannot hold a private page is released: the executable's
// loadable segments that are not writable, and only in a fixed-address
// executable (ELF type EXEC, as moat is built), where nothing relocates
// them at start. MADV_DONTNEED on a private page would drop what was
// written to it, such as a position-independent build's relocated
// read-only data; such a build releases nothing.
package exemap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// span is a range of addresses, [start, end).
type span struct{ start, end uintptr }

// Text is the executable's read-only segments in this process, found once
// with Find; the zero value and nil release nothing.
type Text struct {
	spans    []span
	gcGap    time.Duration // ReleaseAfterGC's least time between releases
	releases atomic.Uint64 // how many times Release ran, for tests
}

// Find reads the executable's program headers through /proc/self/exe.
// Call it before anything hides /proc (the gate process's jail); the
// segments do not move afterwards. A position-independent executable
// has none to release.
func Find() (*Text, error) {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("reading the executable's program headers: %w", err)
	}
	defer f.Close()
	spans, err := readOnlySegments(f, os.Getpagesize())
	if err != nil {
		return nil, fmt.Errorf("reading the executable's program headers: %w", err)
	}
	return &Text{spans: spans, gcGap: gcReleaseGap}, nil
}

// Release drops this process's page-table entries for the executable's
// read-only segments. It costs one madvise per segment; what runs next
// faults its pages back from the page cache.
func (t *Text) Release() {
	if t == nil {
		return
	}
	for _, s := range t.spans {
		// An error (a locked mapping) leaves the pages mapped: nothing
		// is lost, and there is nothing to say.
		unix.Syscall(unix.SYS_MADVISE, s.start, s.end-s.start, unix.MADV_DONTNEED)
	}
	t.releases.Add(1)
}

// gcReleaseGap is the least time between two releases after collections:
// a busy process collects many times a second, and would otherwise fault
// its working set back in after each.
const gcReleaseGap = 10 * time.Second

// ReleaseAfterGC arranges for Release after each garbage collection, at
// most once every gcReleaseGap, until ctx ends. A collection reads the
// type data of every live object and runs much of the runtime, and once
// a process has collected, the runtime collects at least every two
// minutes however little it allocates: released only once, an idle
// process mapped much of it back within minutes. A process that never
// collects is never released by this.
func (t *Text) ReleaseAfterGC(ctx context.Context) {
	if t == nil {
		return
	}
	var last time.Time
	var arm func()
	arm = func() {
		if ctx.Err() != nil {
			return
		}
		// Unreachable from the start, so the next collection that
		// finishes after it was allocated runs the cleanup (in the
		// runtime's cleanup goroutine, one at a time). A pointer field
		// keeps it out of the tiny allocator, whose blocks are freed
		// together.
		sentinel := &struct{ p *int }{}
		runtime.AddCleanup(sentinel, func(struct{}) {
			if now := time.Now(); now.Sub(last) >= t.gcGap {
				t.Release()
				last = now
			}
			arm()
		}, struct{}{})
	}
	arm()
}

// ELF64 constants (elf(5)); moat runs on 64-bit little-endian Linux only.
const (
	elfHeaderSize = 64
	phdrSize      = 56
	etExec        = 2
	ptLoad        = 1
	pfW           = 2
	pfR           = 4
	maxPhdrs      = 64 // Go's linker writes 6; a bound on what is read
)

var errNotELF = errors.New("not a 64-bit little-endian ELF executable")

// readOnlySegments returns the pages wholly inside the loadable segments
// that are readable and not writable, of a fixed-address executable: the
// pages of one that share a page with a writable segment are left out.
func readOnlySegments(r io.ReaderAt, pageSize int) ([]span, error) {
	var h [elfHeaderSize]byte
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return nil, err
	}
	if string(h[:4]) != "\x7fELF" || h[4] != 2 || h[5] != 1 {
		return nil, errNotELF
	}
	le := binary.LittleEndian
	if le.Uint16(h[16:]) != etExec {
		return nil, nil // position-independent: see the package doc
	}
	phoff, phentsize, phnum := le.Uint64(h[32:]), le.Uint16(h[54:]), le.Uint16(h[56:])
	if phentsize != phdrSize || phnum > maxPhdrs {
		return nil, fmt.Errorf("%d program headers of %d bytes, want at most %d of %d", phnum, phentsize, maxPhdrs, phdrSize)
	}
	ph := make([]byte, int(phnum)*phdrSize)
	if _, err := r.ReadAt(ph, int64(phoff)); err != nil {
		return nil, err
	}
	page := uint64(pageSize)
	var out []span
	for i := 0; i < int(phnum); i++ {
		p := ph[i*phdrSize:]
		typ, flags := le.Uint32(p), le.Uint32(p[4:])
		vaddr, memsz := le.Uint64(p[16:]), le.Uint64(p[40:])
		if typ != ptLoad || flags&pfW != 0 || flags&pfR == 0 {
			continue
		}
		start := (vaddr + page - 1) / page * page
		end := (vaddr + memsz) / page * page
		if end > start {
			out = append(out, span{uintptr(start), uintptr(end)})
		}
	}
	return out, nil
}
