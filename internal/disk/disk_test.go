package disk

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

const (
	mib = 1 << 20
	gib = 1 << 30
)

func TestDefault(t *testing.T) {
	tests := []struct {
		free, want uint64
		err        error
	}{
		{free: 200 * gib, want: DefaultMaxBytes},
		{free: 40 * gib, want: 20 * gib},
		{free: 10 * gib, want: 5 * gib},
		{free: 3*gib + 3, want: 1 * gib}, // whole GiB, rounded down
		{free: 5*gib - 1, want: 2 * gib}, // whole GiB, rounded down
		{free: 2 * gib, want: 1 * gib},   // just fits
		{free: 2*gib - 2, err: ErrHostFull},
		{free: 0, err: ErrHostFull},
	}
	for _, tt := range tests {
		got, err := Default(tt.free)
		if !errors.Is(err, tt.err) || got != tt.want {
			t.Errorf("Default(%d) = %d, %v; want %d, %v", tt.free, got, err, tt.want, tt.err)
		}
		if err == nil && got%gib != 0 {
			t.Errorf("Default(%d) = %d: not whole GiB", tt.free, got)
		}
	}
}

func TestDecide(t *testing.T) {
	none := Image{}
	img := Image{Exists: true, SizeBytes: 1 * gib, UsedBytes: 300 * mib}
	tests := []struct {
		name      string
		img       Image
		want, def uint64
		act       Action
		size      uint64
		err       error
	}{
		{"new, default", none, 0, 5 * gib, Create, 5 * gib, nil},
		{"new, configured", none, 64 * mib, 5 * gib, Create, 64 * mib, nil},
		{"kept when not configured", img, 0, 5 * gib, Keep, 1 * gib, nil},
		{"kept at its size", img, 1 * gib, 0, Keep, 1 * gib, nil},
		{"raised", img, 2 * gib, 0, Grow, 2 * gib, nil},
		{"lowered above use", img, 512 * mib, 0, Shrink, 512 * mib, nil},
		{"lowered below use", img, 256 * mib, 0, Keep, 1 * gib, ErrBelowUse},
		{"lowered to the use exactly", img, 300 * mib, 0, Keep, 1 * gib, ErrBelowUse},
	}
	for _, tt := range tests {
		act, size, err := Decide(tt.img, tt.want, tt.def)
		if act != tt.act || size != tt.size || !errors.Is(err, tt.err) {
			t.Errorf("%s: got %v %d %v; want %v %d %v", tt.name, act, size, err, tt.act, tt.size, tt.err)
		}
	}
}

// superblock builds an ext4 superblock with the given fields.
func superblock(logBS uint32, blocks, free uint64, overhead uint32, is64 bool) []byte {
	b := make([]byte, SuperblockSize)
	le := binary.LittleEndian
	le.PutUint32(b[0x4:], uint32(blocks))
	le.PutUint32(b[0xC:], uint32(free))
	le.PutUint32(b[0x18:], logBS)
	le.PutUint16(b[0x38:], 0xEF53)
	le.PutUint32(b[0x248:], overhead)
	le.PutUint16(b[0x3A:], 1) // EXT2_VALID_FS
	if is64 {
		le.PutUint32(b[0x60:], 0x80)
		le.PutUint32(b[0x150:], uint32(blocks>>32))
		le.PutUint32(b[0x158:], uint32(free>>32))
	}
	return b
}

// highWords sets the 64-bit halves that a filesystem without the 64bit
// feature leaves meaningless.
func highWords(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[0x150:], 7)
	binary.LittleEndian.PutUint32(b[0x158:], 7)
	return b
}

// errorsFlagged sets EXT2_ERROR_FS in s_state.
func errorsFlagged(b []byte) []byte {
	binary.LittleEndian.PutUint16(b[0x3A:], 3)
	return b
}

func TestParseSuperblock(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
		used uint64
		err  error
	}{
		// The figures of a 20 GiB image fresh from mkfs.ext4 -m 0.
		{"fresh 20GiB", superblock(2, 5242880, 5116558, 126316, true), 6 * 4096, nil},
		{"no overhead recorded", superblock(2, 1000, 900, 0, false), 100 * 4096, nil},
		{"1 KiB blocks", superblock(0, 1000, 500, 100, false), 400 * 1024, nil},
		{"64-bit counts", superblock(2, 1<<33, 1<<32, 0, true), (1 << 32) * 4096, nil},
		{"high words ignored without 64bit", highWords(superblock(2, 100, 50, 0, false)), 50 * 4096, nil},
		{"errors flagged", errorsFlagged(superblock(2, 1000, 900, 0, false)), 100 * 4096, nil},
		{"bad magic", make([]byte, SuperblockSize), 0, ErrNotExt4},
		{"short", superblock(2, 1, 1, 0, false)[:512], 0, ErrNotExt4},
		{"huge block size", superblock(12, 1, 1, 0, false), 0, ErrNotExt4},
		{"more free than blocks", superblock(2, 10, 11, 0, false), 0, ErrNotExt4},
	}
	for _, tt := range tests {
		sb, err := ParseSuperblock(tt.b)
		if !errors.Is(err, tt.err) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.err)
			continue
		}
		if err == nil && sb.UsedBytes() != tt.used {
			t.Errorf("%s: UsedBytes() = %d, want %d", tt.name, sb.UsedBytes(), tt.used)
		}
		if wantErrs := strings.Contains(tt.name, "errors"); err == nil && sb.Errors != wantErrs {
			t.Errorf("%s: Errors = %v, want %v", tt.name, sb.Errors, wantErrs)
		}
	}
}

func FuzzParseSuperblock(f *testing.F) {
	f.Add(superblock(2, 5242880, 5116558, 126316, true))
	f.Fuzz(func(t *testing.T, b []byte) {
		sb, err := ParseSuperblock(b)
		if err == nil && sb.UsedBytes() > sb.Blocks*sb.BlockSize {
			t.Fatalf("used %d of %d", sb.UsedBytes(), sb.Blocks*sb.BlockSize)
		}
	})
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1 KiB"}, {1536 * mib, "1.5 GiB"},
		{20 * gib, "20 GiB"}, {64 * mib, "64 MiB"}, {100*mib + 1, "100 MiB"},
	}
	for _, tt := range tests {
		if got := FormatBytes(tt.n); got != tt.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}
