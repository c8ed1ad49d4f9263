package image

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOverlayHonoursWhiteouts mounts two imported layers the way the runtime does and checks
// that the converted whiteouts hide lower files: the point of converting them at all.
func TestOverlayHonoursWhiteouts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting overlayfs needs root; run go test as root (CI does)")
	}
	s := openStore(t)
	img := importLayers(t, s,
		layerOf(t, dir("a/", 0o755), file("a/file", "hidden"), file("a/keep", "kept"),
			dir("d/", 0o755), file("d/old", "hidden")),
		layerOf(t, whiteout("a", "file"), dir("d/", 0o755), file("d/.wh..wh..opq", ""), file("d/new", "shown")),
	)
	mnt := t.TempDir()
	err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+img.LowerDir())
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENODEV) {
		t.Skipf("cannot mount overlayfs here (%v); needs CAP_SYS_ADMIN in the initial user namespace and overlay support", err)
	}
	if err != nil {
		t.Fatalf("mounting overlay lowerdir=%s: %v", img.LowerDir(), err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
		}
	})

	tests := []struct {
		dir  string
		want []string
	}{
		{"a", []string{"keep"}},
		{"d", []string{"new"}},
	}
	for _, tt := range tests {
		got := dirNames(t, filepath.Join(mnt, tt.dir))
		sort.Strings(got)
		if len(got) != len(tt.want) || got[0] != tt.want[0] {
			t.Errorf("overlay %s/ = %v, want %v", tt.dir, got, tt.want)
		}
	}
	if _, err := os.Stat(filepath.Join(mnt, "a/file")); !os.IsNotExist(err) {
		t.Errorf("whited-out a/file is visible through the overlay (err %v)", err)
	}
}
