package disk

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestPrepare makes, grows and shrinks a real image with e2fsprogs (no
// mount: that is the shim's, and the e2e test's).
func TestPrepare(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed (e2fsprogs); scripts/setup.sh installs it")
	}
	dir := t.TempDir()
	steps := []struct {
		want uint64
		act  Action
		size uint64
		err  error
	}{
		{64 * mib, Create, 64 * mib, nil},
		{0, Keep, 64 * mib, nil},
		{128 * mib, Grow, 128 * mib, nil},
		{96 * mib, Shrink, 96 * mib, nil},
		{MinBytes, Shrink, MinBytes, nil},
	}
	for i, s := range steps {
		act, size, err := Prepare(dir, s.want)
		if act != s.act || size != s.size || !errors.Is(err, s.err) {
			t.Fatalf("step %d: Prepare(%d) = %v %d %v; want %v %d %v", i, s.want, act, size, err, s.act, s.size, s.err)
		}
		img, sb, err := ReadImage(dir)
		if err != nil {
			t.Fatal(err)
		}
		if img.SizeBytes != s.size {
			t.Errorf("step %d: file is %d bytes, want %d", i, img.SizeBytes, s.size)
		}
		if fs := sb.Blocks * sb.BlockSize; fs != s.size {
			t.Errorf("step %d: filesystem is %d bytes, want %d", i, fs, s.size)
		}
		// After resize2fs the overhead counts as used until a mount.
		if s.act == Create && img.UsedBytes > 2*mib {
			t.Errorf("step %d: an empty filesystem uses %d bytes", i, img.UsedBytes)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ImageName+".new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary image is left: %v", err)
	}
	// Sparse: the host gives the image only what was written.
	u, err := Stat(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if u.LimitBytes != MinBytes || u.HostBytes > u.LimitBytes/4 {
		t.Errorf("Stat = %+v: want a limit of %d and a sparse file", u, MinBytes)
	}
}
