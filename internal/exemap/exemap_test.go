package exemap

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// elfFile is a 64-bit little-endian ELF header of type typ with the
// program headers segs (type, flags, vaddr, memsz), as a ReaderAt.
func elfFile(typ uint16, segs ...[4]uint64) *bytes.Reader {
	le := binary.LittleEndian
	b := make([]byte, elfHeaderSize+len(segs)*phdrSize)
	copy(b, "\x7fELF\x02\x01\x01")
	le.PutUint16(b[16:], typ)
	le.PutUint64(b[32:], elfHeaderSize)
	le.PutUint16(b[54:], phdrSize)
	le.PutUint16(b[56:], uint16(len(segs)))
	for i, s := range segs {
		p := b[elfHeaderSize+i*phdrSize:]
		le.PutUint32(p, uint32(s[0]))
		le.PutUint32(p[4:], uint32(s[1]))
		le.PutUint64(p[16:], s[2])
		le.PutUint64(p[40:], s[3])
	}
	return bytes.NewReader(b)
}

func TestReadOnlySegments(t *testing.T) {
	const rx, r, rw = pfR | 1, pfR, pfR | pfW
	const load, note = ptLoad, 4
	tests := []struct {
		name string
		elf  *bytes.Reader
		want []span
	}{
		{"text and rodata, as Go's linker lays them out",
			elfFile(etExec, [4]uint64{load, rx, 0x400000, 0x952591}, [4]uint64{load, r, 0xd53000, 0xa8a390},
				[4]uint64{load, rw, 0x17de000, 0x2365de0}, [4]uint64{note, r, 0x400f78, 0x64}),
			[]span{{0x400000, 0xd52000}, {0xd53000, 0x17dd000}}},
		{"never a writable segment (data, bss, a RELRO's)",
			elfFile(etExec, [4]uint64{load, rw, 0x400000, 0x10000}, [4]uint64{load, pfW, 0x410000, 0x10000}),
			nil},
		{"only whole pages: none of one shared with a neighbour",
			elfFile(etExec, [4]uint64{load, r, 0x400800, 0x2000}),
			[]span{{0x401000, 0x402000}}},
		{"nothing of a segment smaller than a page", elfFile(etExec, [4]uint64{load, r, 0x400800, 0x400}), nil},
		{"nothing of an unreadable one", elfFile(etExec, [4]uint64{load, 1, 0x400000, 0x10000}), nil},
		{"nothing of a position-independent executable, which start-up relocates",
			elfFile(3, [4]uint64{load, rx, 0, 0x10000}, [4]uint64{load, r, 0x10000, 0x10000}),
			nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readOnlySegments(tt.elf, 4096)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %x, want %x", got, tt.want)
			}
		})
	}
}

func TestReadOnlySegmentsRefusesWhatIsNotAnExecutable(t *testing.T) {
	tooMany := make([][4]uint64, maxPhdrs+1)
	for name, in := range map[string][]byte{
		"empty":      nil,
		"not ELF":    []byte("#!/bin/sh\necho hello, this is a script and not an ELF file at all\n"),
		"32-bit":     append([]byte("\x7fELF\x01\x01\x01"), make([]byte, 64)...),
		"big-endian": append([]byte("\x7fELF\x02\x02\x01"), make([]byte, 64)...),
		"too many":   readAll(elfFile(etExec, tooMany...)),
		"cut short":  readAll(elfFile(etExec, [4]uint64{ptLoad, pfR, 0x400000, 0x10000}))[:elfHeaderSize+10],
	} {
		if _, err := readOnlySegments(bytes.NewReader(in), 4096); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func readAll(r *bytes.Reader) []byte {
	b := make([]byte, r.Len())
	r.ReadAt(b, 0)
	return b
}

// TestFindAgreesWithTheKernel checks what Find would release against
// the kernel's own list of this process's mappings: every page of it is
// in a private mapping of this executable that is not writable.
func TestFindAgreesWithTheKernel(t *testing.T) {
	text, err := Find()
	if err != nil {
		t.Fatal(err)
	}
	if len(text.spans) == 0 {
		t.Skip("the test binary is position-independent: Find releases nothing of it (built with -buildmode=pie?)")
	}
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	type mapping struct {
		span
		perms, path string
	}
	var ms []mapping
	for _, line := range strings.Split(strings.TrimSpace(string(maps)), "\n") {
		f := strings.Fields(line)
		lo, hi, _ := strings.Cut(f[0], "-")
		a, _ := strconv.ParseUint(lo, 16, 64)
		b, _ := strconv.ParseUint(hi, 16, 64)
		m := mapping{span: span{uintptr(a), uintptr(b)}, perms: f[1]}
		if len(f) > 5 {
			m.path = strings.Join(f[5:], " ")
		}
		ms = append(ms, m)
	}
	for _, s := range text.spans {
		for p := s.start; p < s.end; {
			i := slices.IndexFunc(ms, func(m mapping) bool { return m.start <= p && p < m.end })
			if i < 0 {
				t.Fatalf("%#x, of %x, is not mapped", p, s)
			}
			if m := ms[i]; m.path != exe || m.perms[1] != '-' || m.perms[3] != 'p' {
				t.Fatalf("%#x, of %x, is in %x %s %s: not a read-only private mapping of %s", p, s, m.span, m.perms, m.path, exe)
			}
			p = ms[i].end
		}
	}
	// And it is most of the executable's read-only mappings.
	var mapped, found uintptr
	for _, m := range ms {
		if m.path == exe && m.perms[1] == '-' {
			mapped += m.end - m.start
		}
	}
	for _, s := range text.spans {
		found += s.end - s.start
	}
	if found < mapped*9/10 {
		t.Errorf("Find has %d bytes of the executable's %d read-only mapped ones", found, mapped)
	}
}

// TestRelease maps the whole of the test binary's read-only mappings,
// releases them, and checks that this process then maps little of them:
// the kernel's count, read with as little code as can be run in between
// (every page run faults back in, with the kernel's window around it).
func TestRelease(t *testing.T) {
	text, err := Find()
	if err != nil {
		t.Fatal(err)
	}
	if len(text.spans) == 0 {
		t.Skip("the test binary is position-independent: Find releases nothing of it (built with -buildmode=pie?)")
	}
	fn := reflect.ValueOf(TestRelease).Pointer()
	found := false
	var sizeKB int
	for _, s := range text.spans {
		found = found || s.start <= fn && fn < s.end
		sizeKB += int((s.end - s.start) >> 10)
		// Map every page of it, as package initialisation half does.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, s.start, s.end-s.start, unix.MADV_POPULATE_READ); errno != 0 {
			t.Skipf("cannot map the binary whole to start from (MADV_POPULATE_READ needs Linux 5.14): %v", errno)
		}
	}
	if !found {
		t.Fatalf("no mapping found holds this test's code at %#x: %x", fn, text.spans)
	}
	fd, err := unix.Open("/proc/self/smaps", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	before, after := make([]byte, 1<<20), make([]byte, 1<<20)
	nb, err := unix.Pread(fd, before, 0)
	if err != nil {
		t.Fatal(err)
	}
	text.Release()
	na, err := unix.Pread(fd, after, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, a := rssKB(t, before[:nb], text.spans), rssKB(t, after[:na], text.spans)
	t.Logf("read-only mappings %d kB: mapped %d kB before, %d kB after Release", sizeKB, b, a)
	if b < sizeKB*9/10 {
		t.Fatalf("mapping every page mapped only %d kB of %d", b, sizeKB)
	}
	if a > b/2 {
		t.Errorf("after Release %d kB is still mapped, of %d before", a, b)
	}
	// Still runs: the pages come back on the next touch.
	if got := strings.Repeat("x", 3); got != "xxx" {
		t.Errorf("got %q after Release", got)
	}
}

func TestReleaseNil(t *testing.T) {
	var text *Text
	text.Release()
	text.ReleaseAfterGC(t.Context())
}

func TestReleaseAfterGC(t *testing.T) {
	text := &Text{} // no gap
	ctx, cancel := context.WithCancel(t.Context())
	text.ReleaseAfterGC(ctx)
	// Each collection releases once, in the runtime's cleanup
	// goroutine: wait for it, bounded.
	for want := uint64(1); want <= 3; want++ {
		runtime.GC()
		deadline := time.Now().Add(5 * time.Second)
		for text.releases.Load() < want && time.Now().Before(deadline) {
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
		if got := text.releases.Load(); got < want {
			t.Fatalf("after collections: %d releases, want %d", got, want)
		}
	}
	// Once ctx ends, at most the one armed already runs.
	cancel()
	n := text.releases.Load()
	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := text.releases.Load(); got > n+1 {
		t.Errorf("%d releases after ctx ended, want at most 1", got-n)
	}
}

func TestReleaseAfterGCKeepsItsGap(t *testing.T) {
	text := &Text{gcGap: time.Hour}
	text.ReleaseAfterGC(t.Context())
	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := text.releases.Load(); got > 1 {
		t.Errorf("%d releases within %v, want at most 1", got, text.gcGap)
	}
}

// rssKB is the Rss of the mappings that start where spans do, in smaps.
func rssKB(t *testing.T, smaps []byte, spans []span) int {
	t.Helper()
	starts := map[uintptr]bool{}
	for _, s := range spans {
		starts[s.start] = true
	}
	in, kb := false, 0
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		line := sc.Text()
		if first := strings.Fields(line)[0]; !strings.HasSuffix(first, ":") {
			lo, _, _ := strings.Cut(first, "-")
			a, err := strconv.ParseUint(lo, 16, 64)
			in = err == nil && starts[uintptr(a)]
			continue
		}
		if in && strings.HasPrefix(line, "Rss:") {
			n, err := strconv.Atoi(strings.Fields(line)[1])
			if err != nil {
				t.Fatal(err)
			}
			kb += n
		}
	}
	return kb
}

func BenchmarkFind(b *testing.B) {
	for b.Loop() {
		if _, err := Find(); err != nil {
			b.Fatal(err)
		}
	}
}
