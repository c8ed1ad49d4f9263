package runtime

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestImageSizeNeedsTheStateFile(t *testing.T) {
	dir := t.TempDir()
	if _, ok := ImageSize(dir); ok {
		t.Fatal("a sandbox without an image has one")
	}
	img := SuspendDir(dir)
	os.MkdirAll(img, 0o700)
	os.WriteFile(filepath.Join(img, "pages.img"), make([]byte, 1000), 0o600)
	if _, ok := ImageSize(dir); ok {
		t.Fatal("pages without checkpoint.img count as an image")
	}
	os.WriteFile(filepath.Join(img, checkpointState), make([]byte, 24), 0o600)
	if n, ok := ImageSize(dir); !ok || n != 1024 {
		t.Fatalf("ImageSize = %d, %v; want 1024, true", n, ok)
	}
	os.MkdirAll(suspendTemp(dir), 0o700)
	os.WriteFile(GuestBinary(dir), nil, 0o755)
	if err := RemoveSaved(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{img, suspendTemp(dir), GuestBinary(dir)} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is left after RemoveSaved", p)
		}
	}
}

// The guest maps moat's binary: a suspend keeps the very file it maps, and
// refuses once the path holds another.
func TestKeepGuestBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "moat")
	os.WriteFile(bin, []byte("old moat"), 0o755)
	p := &Plan{StateDir: dir, Moat: bin}
	p.noteGuestBinary()
	if err := p.keepGuestBinary(); err != nil {
		t.Fatal(err)
	}
	kept, _ := os.Stat(GuestBinary(dir))
	orig, _ := os.Stat(bin)
	if !os.SameFile(kept, orig) {
		t.Error("the kept binary is not the file the guest maps (a link on the same filesystem)")
	}

	// An upgrade replaces the file by rename, as installers do.
	os.WriteFile(bin+".new", []byte("new moat, longer"), 0o755)
	os.Rename(bin+".new", bin)
	err := p.keepGuestBinary()
	if err == nil || !strings.Contains(err.Error(), "moat down") {
		t.Fatalf("a replaced binary: err %v; want a refusal that says to restart", err)
	}
	if b, _ := os.ReadFile(GuestBinary(dir)); string(b) != "old moat" {
		t.Fatalf("the kept binary became %q", b)
	}

	// A resumed guest maps the kept one already.
	p = &Plan{StateDir: dir, Moat: GuestBinary(dir)}
	if err := p.keepGuestBinary(); err != nil {
		t.Fatalf("a resumed guest's binary: %v", err)
	}
}

func TestRestoreArgs(t *testing.T) {
	p := &Plan{ID: "moat-x", Restore: "/s/suspend"}
	got := restoreArgs(p, "/s/bundle/sandbox.pid", "/s/bundle")
	for _, want := range []string{"restore", "--detach", "--image-path=/s/suspend", "--bundle=/s/bundle", "--pid-file=/s/bundle/sandbox.pid"} {
		if !slices.Contains(got, want) {
			t.Errorf("restore args %v lack %s", got, want)
		}
	}
	if got[len(got)-1] != "moat-x" {
		t.Errorf("restore args %v do not end with the container id", got)
	}
}
