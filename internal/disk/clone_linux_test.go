package disk

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestCloneKeepsDataAndHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	data := bytes.Repeat([]byte("moat"), 1024)
	for _, off := range []int64{0, 32 << 20} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()

	dst := filepath.Join(dir, "dst")
	if _, err := Clone(src, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatalf("the clone differs from its source")
	}
	fi, _ := os.Stat(dst)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the clone's mode is %v, want 0600", fi.Mode().Perm())
	}
	// Sparse: far fewer blocks than its size (a reflink shares them, a
	// copy leaves the holes).
	if st := fi.Sys().(*syscall.Stat_t); st.Blocks*512 >= size/2 {
		t.Errorf("the clone uses %d bytes of %d: its holes were filled", st.Blocks*512, size)
	}
	if _, err := Clone(src, dst); err == nil {
		t.Errorf("a clone onto an existing file succeeded; want an error")
	}
}
