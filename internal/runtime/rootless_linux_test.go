package runtime

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCopyUpForGuest(t *testing.T) {
	host, upper := t.TempDir(), t.TempDir()
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{"etc", 0o755}, {"etc/sudoers.d", 0o750}, {"etc/ssl", 0o755}, {"etc/ssl/certs", 0o755}} {
		if err := os.Mkdir(filepath.Join(host, d.path), d.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(host, d.path), d.mode)
	}
	os.WriteFile(filepath.Join(host, "etc/hosts"), []byte("host's hosts\n"), 0o644)
	os.WriteFile(filepath.Join(host, "etc/hostname"), []byte("host\n"), 0o644)
	os.WriteFile(filepath.Join(host, "etc/ssl/certs/ca-certificates.crt"), []byte("roots\n"), 0o644)
	// The upper layer already has the guest's own hostname (kept), and a
	// whiteout of the CA bundle (kept: the guest removed it).
	os.MkdirAll(filepath.Join(upper, "etc/ssl"), 0o755)
	os.Mkdir(filepath.Join(upper, "etc/ssl/certs"), 0o700)
	os.WriteFile(filepath.Join(upper, "etc/hostname"), []byte("guest\n"), 0o600)
	if err := unix.Mknod(filepath.Join(upper, "etc/ssl/certs/ca-certificates.crt"), unix.S_IFIFO|0o600, 0); err != nil {
		t.Fatal(err)
	}

	paths := []string{"etc/sudoers.d/", "etc/hosts", "etc/hostname", "etc/ssl/certs/ca-certificates.crt", "etc/pki/tls/certs/"}
	if err := copyUpForGuest(host, upper, paths); err != nil {
		t.Fatal(err)
	}
	// Twice: an upper layer from an earlier start changes nothing.
	if err := copyUpForGuest(host, upper, paths); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path    string
		mode    os.FileMode // permissions, or the type bit to check
		content string
	}{
		{"etc", os.ModeDir | 0o755, ""},
		{"etc/sudoers.d", os.ModeDir | 0o750, ""},
		{"etc/hosts", 0o644, "host's hosts\n"},
		{"etc/hostname", 0o600, "guest\n"},
		{"etc/ssl/certs", os.ModeDir | 0o700, ""},
		{"etc/ssl/certs/ca-certificates.crt", os.ModeNamedPipe | 0o600, ""},
	} {
		fi, err := os.Lstat(filepath.Join(upper, tt.path))
		if err != nil {
			t.Errorf("%s: %v", tt.path, err)
			continue
		}
		if got := fi.Mode() & (os.ModeType | os.ModePerm); got != tt.mode {
			t.Errorf("%s: mode %v, want %v", tt.path, got, tt.mode)
		}
		if tt.content != "" {
			if b, _ := os.ReadFile(filepath.Join(upper, tt.path)); string(b) != tt.content {
				t.Errorf("%s: %q, want %q", tt.path, b, tt.content)
			}
		}
	}
	// What the host lacks is not made.
	if _, err := os.Lstat(filepath.Join(upper, "etc/pki")); err == nil {
		t.Errorf("etc/pki made in the upper layer, though the host has none")
	}
}
