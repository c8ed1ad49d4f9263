// Package testfs gives tests a small real filesystem that they can fill up,
// for what must happen on a full disk (threat model 28). It needs root, as
// ./scripts/test.sh has; without it the test is skipped, saying why.
package testfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Small mounts a tmpfs of size (a mount option: "2m", "64m") on a fresh
// temporary directory and returns it. It is unmounted when the test ends,
// after every clean-up registered later has run.
func Small(t testing.TB, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Skipf("skipped: mounting a small tmpfs needs root, which ./scripts/test.sh has: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// Fill writes dir/filler until the filesystem is full and returns its
// path; removing it makes room again. The test fails if the filesystem
// takes 1 GiB without filling up.
func Fill(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for range 1 << 14 {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return path
		}
	}
	t.Fatalf("%s took 1 GiB and is not full", dir)
	return path
}
