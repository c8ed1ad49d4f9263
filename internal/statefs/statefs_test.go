package statefs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSwapIn: the state's layer and image become the stage's; the old
// ones are set aside; what the stage lacks is gone from the state.
func TestSwapIn(t *testing.T) {
	dir, stage, old := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(path, body string) {
		t.Helper()
		os.MkdirAll(filepath.Dir(path), 0o700)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "disk.img"), "now")
	write(filepath.Join(dir, "suspend", "checkpoint.img"), "now")
	write(filepath.Join(dir, "record.json"), "kept")
	write(filepath.Join(stage, "disk.img"), "snap")
	if err := Swap(dir, stage, old, []string{"upper", "disk.img", "suspend"}); err != nil {
		t.Fatal(err)
	}
	read := func(path string) string { b, _ := os.ReadFile(path); return string(b) }
	if got := read(filepath.Join(dir, "disk.img")); got != "snap" {
		t.Errorf("disk.img = %q, want the snapshot's", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "suspend")); err == nil {
		t.Error("the sandbox's image is still in place; the snapshot had none")
	}
	if got := read(filepath.Join(dir, "record.json")); got != "kept" {
		t.Errorf("record.json = %q; the swap must not touch it", got)
	}
	if got := read(filepath.Join(old, "disk.img")); got != "now" {
		t.Errorf("the old disk.img set aside = %q", got)
	}
}

// TestCopyAndFlush: a copy keeps modes and symlinks, and a flush of it
// reports the space it takes; Main runs the same for the namespace's
// role and refuses what is not an operation.
func TestCopyAndFlush(t *testing.T) {
	src := filepath.Join(t.TempDir(), "upper")
	os.MkdirAll(filepath.Join(src, "root"), 0o700)
	if err := os.WriteFile(filepath.Join(src, "root", "f"), []byte(strings.Repeat("x", 10000)), 0o640); err != nil {
		t.Fatal(err)
	}
	os.Symlink("root/f", filepath.Join(src, "link"))
	dst := filepath.Join(t.TempDir(), "upper")
	if code := Main([]string{"cp", src, dst}); code != 0 {
		t.Fatalf("Main cp: exit %d", code)
	}
	if fi, err := os.Stat(filepath.Join(dst, "root", "f")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("the copied file: %v, %v; want mode 0640", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "root")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the copied directory: %v, %v; want mode 0700", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "root/f" {
		t.Errorf("the copied symlink: %q, %v", l, err)
	}
	n, err := Flush(dst)
	if err != nil || n < 10000 {
		t.Errorf("Flush: %d bytes, %v; want at least the file's 10000", n, err)
	}
	if err := Copy(src, dst); err == nil {
		t.Error("a copy onto an existing tree did not fail") // cp would copy into it
	}
	if code := Main([]string{"rm", dst}); code != 2 {
		t.Errorf("Main rm: exit %d, want 2", code)
	}
}
