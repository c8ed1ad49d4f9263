package disk

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
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
		act, size, err := Prepare(dir, s.want, "")
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

// TestPrepareFromTemplate: new images are sparse copies of one template
// per size, which is made again when it is not a whole empty filesystem.
func TestPrepareFromTemplate(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed (e2fsprogs); scripts/setup.sh installs it")
	}
	tpl := t.TempDir()
	var inodes []uint64
	for i, broken := range []bool{false, false, true} {
		if broken {
			files, _ := filepath.Glob(filepath.Join(tpl, "*.img"))
			if len(files) != 1 {
				t.Fatalf("templates: %v, want one", files)
			}
			if err := os.Truncate(files[0], 4096); err != nil {
				t.Fatal(err)
			}
		}
		dir := t.TempDir()
		if act, size, err := Prepare(dir, 64*mib, tpl); act != Create || size != 64*mib || err != nil {
			t.Fatalf("sandbox %d: Prepare = %v %d %v", i, act, size, err)
		}
		img, sb, err := ReadImage(dir)
		if err != nil {
			t.Fatalf("sandbox %d: %v", i, err)
		}
		if img.SizeBytes != 64*mib || sb.Blocks*sb.BlockSize != 64*mib || img.UsedBytes > mib {
			t.Errorf("sandbox %d: image %+v, superblock %+v", i, img, sb)
		}
		u, err := Stat(dir, 0)
		if err != nil || u.HostBytes > 16*mib {
			t.Errorf("sandbox %d: not a sparse copy: %+v %v", i, u, err)
		}
		files, _ := filepath.Glob(filepath.Join(tpl, "*.img"))
		var st syscall.Stat_t
		if len(files) != 1 || syscall.Stat(files[0], &st) != nil {
			t.Fatalf("sandbox %d: templates %v", i, files)
		}
		inodes = append(inodes, st.Ino)
		// e2fsck finds nothing to fix in the copy (exit 0).
		if out, err := exec.Command("e2fsck", "-f", "-n", filepath.Join(dir, ImageName)).CombinedOutput(); err != nil {
			t.Errorf("sandbox %d: e2fsck: %v\n%s", i, err, out)
		}
	}
	if inodes[1] != inodes[0] || inodes[2] == inodes[1] {
		t.Errorf("template inodes %v: want the first reused and the broken one made again", inodes)
	}
}

// TestPrepareRepairs: an image the kernel marked as having errors is
// checked and repaired before it is mounted again.
func TestPrepareRepairs(t *testing.T) {
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("debugfs not installed (e2fsprogs); scripts/setup.sh installs it")
	}
	dir := t.TempDir()
	if _, _, err := Prepare(dir, 64*mib, ""); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, ImageName)
	if out, err := exec.Command("debugfs", "-w", "-R", "ssv state 3", img).CombinedOutput(); err != nil {
		t.Fatalf("debugfs: %v\n%s", err, out)
	}
	if _, sb, err := ReadImage(dir); err != nil || !sb.Errors {
		t.Fatalf("the error flag did not stick: %+v %v", sb, err)
	}
	if act, _, err := Prepare(dir, 0, ""); act != Keep || err != nil {
		t.Fatalf("Prepare = %v %v", act, err)
	}
	if _, sb, err := ReadImage(dir); err != nil || sb.Errors {
		t.Errorf("after Prepare the image still has errors: %+v %v", sb, err)
	}
}
