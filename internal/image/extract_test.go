package image

import (
	"archive/tar"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create whiteout devices and set ownership; run go test as root (CI does)")
	}
}

// importLayers imports one image made of the given layers and returns it.
func importLayers(t *testing.T, s *Store, layers ...v1.Layer) *Image {
	t.Helper()
	img, err := s.Import(context.Background(), dockerArchive(t, imageOf(t, layers...), "example.com/test:1"), nil)
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	return img
}

func TestLayerContents(t *testing.T) {
	requireRoot(t)
	s := openStore(t)
	setuid := ent{name: "usr/bin/sudo", body: "#!sudo", mode: 0o4755}
	owned := ent{name: "home/agent/.profile", body: "export X=1\n", mode: 0o640, uid: 1000, gid: 1001}
	xattr := ent{name: "bin/ping", body: "ping", mode: 0o755, xattrs: map[string]string{
		"user.moat":                "kept",
		"trusted.overlay.redirect": "/etc", // steers overlayfs: must be dropped
	}}
	img := importLayers(t, s, layerOf(t,
		dir("./", 0o755),
		dir("etc/", 0o755),
		file("etc/hostname", "moat\n"),
		dir("tmp/", 0o1777),
		setuid,
		owned,
		xattr,
		symlink("bin/sh", "/bin/busybox"),
		symlink("lib", "usr/lib"),
		hardlink("usr/bin/sudoedit", "usr/bin/sudo"),
		file("/abs/file", "made relative"),
		file("var/lib/deep/implicit", "parents made for me"),
	))
	root := img.Layers[0]

	tests := []struct {
		path    string
		mode    fs.FileMode
		uid     uint32
		gid     uint32
		body    string
		link    string
		nlink   uint64
		xattr   string
		noXattr string
	}{
		{path: "etc", mode: fs.ModeDir | 0o755},
		{path: "etc/hostname", mode: 0o644, body: "moat\n"},
		{path: "tmp", mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{path: "usr/bin/sudo", mode: fs.ModeSetuid | 0o755, body: "#!sudo", nlink: 2},
		{path: "usr/bin/sudoedit", mode: fs.ModeSetuid | 0o755, body: "#!sudo", nlink: 2},
		{path: "home/agent/.profile", mode: 0o640, uid: 1000, gid: 1001, body: "export X=1\n"},
		{path: "bin/ping", mode: 0o755, xattr: "user.moat=kept", noXattr: "trusted.overlay.redirect"},
		{path: "bin/sh", mode: fs.ModeSymlink | 0o777, link: "/bin/busybox"},
		{path: "lib", mode: fs.ModeSymlink | 0o777, link: "usr/lib"},
		{path: "abs/file", mode: 0o644, body: "made relative"},
		{path: "var/lib/deep", mode: fs.ModeDir | 0o755},
		{path: "var/lib/deep/implicit", mode: 0o644, body: "parents made for me"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			p := filepath.Join(root, tt.path)
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode(); got != tt.mode {
				t.Errorf("mode = %v, want %v", got, tt.mode)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != tt.uid || st.Gid != tt.gid {
				t.Errorf("owner = %d:%d, want %d:%d", st.Uid, st.Gid, tt.uid, tt.gid)
			}
			if tt.nlink != 0 && uint64(st.Nlink) != tt.nlink {
				t.Errorf("nlink = %d, want %d", st.Nlink, tt.nlink)
			}
			if !fi.IsDir() && !fi.ModTime().Equal(testMtime) {
				t.Errorf("mtime = %v, want %v", fi.ModTime(), testMtime)
			}
			if tt.body != "" {
				if b, err := os.ReadFile(p); err != nil || string(b) != tt.body {
					t.Errorf("body = %q, %v; want %q", b, err, tt.body)
				}
			}
			if tt.link != "" {
				if got, err := os.Readlink(p); err != nil || got != tt.link {
					t.Errorf("link = %q, %v; want %q", got, err, tt.link)
				}
			}
			if tt.xattr != "" {
				k, v, _ := strings.Cut(tt.xattr, "=")
				if got := getxattr(p, k); got != v {
					t.Errorf("xattr %s = %q, want %q", k, got, v)
				}
			}
			if tt.noXattr != "" {
				if got := getxattr(p, tt.noXattr); got != "" {
					t.Errorf("xattr %s = %q, want it dropped", tt.noXattr, got)
				}
			}
		})
	}
	// Directory mtimes are set after their children are written.
	if fi, err := os.Stat(filepath.Join(root, "etc")); err != nil || !fi.ModTime().Equal(testMtime) {
		t.Errorf("etc mtime = %v, want %v", fi.ModTime(), testMtime)
	}
}

func getxattr(path, name string) string {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

func TestWhiteoutConversion(t *testing.T) {
	requireRoot(t)
	s := openStore(t)
	img := importLayers(t, s,
		layerOf(t, file("gone", "lower"), dir("d/", 0o755), file("d/old", "lower")),
		layerOf(t,
			whiteout("", "gone"),
			dir("d/", 0o755),
			file("d/.wh..wh..opq", ""),
			file("d/new", "upper"),
			file(".wh..wh.plnk", ""),                             // AUFS bookkeeping: ignored
			ent{name: "already", typ: tar.TypeChar, mode: 0o600}, // overlay-form whiteout: kept
		),
	)
	top := img.Layers[1]
	for _, name := range []string{"gone", "already"} {
		fi, err := os.Lstat(filepath.Join(top, name))
		if err != nil {
			t.Fatalf("whiteout %s: %v", name, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode()&fs.ModeCharDevice == 0 || st.Rdev != 0 {
			t.Errorf("whiteout %s: mode %v rdev %d, want a 0/0 char device", name, fi.Mode(), st.Rdev)
		}
	}
	if got := getxattr(filepath.Join(top, "d"), overlayOpaqueXattr); got != "y" {
		t.Errorf("d: %s = %q, want y", overlayOpaqueXattr, got)
	}
	for _, name := range []string{".wh.gone", "d/.wh..wh..opq", ".wh..wh.plnk"} {
		if _, err := os.Lstat(filepath.Join(top, name)); !os.IsNotExist(err) {
			t.Errorf("%s exists in the layer (err %v); whiteout markers must be converted, not copied", name, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(img.Layers[0], "gone")); err != nil {
		t.Errorf("lower layer lost its file: %v", err)
	}
}

func TestMaliciousArchives(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name    string
		entries func(sentinel string) []ent
		wantMsg string
	}{
		{
			name:    "dot-dot escape",
			entries: func(string) []ent { return []ent{file("../pwned", "x")} },
			wantMsg: "escapes the layer root",
		},
		{
			name:    "absolute dot-dot escape",
			entries: func(string) []ent { return []ent{file("/abs/../../pwned", "x")} },
			wantMsg: "escapes the layer root",
		},
		{
			name:    "deep dot-dot escape",
			entries: func(string) []ent { return []ent{dir("a/", 0o755), file("a/../../../../../../pwned", "x")} },
			wantMsg: "escapes the layer root",
		},
		{
			name: "entry under symlinked dir",
			entries: func(sentinel string) []ent {
				return []ent{symlink("link", sentinel), file("link/pwned", "x")}
			},
			wantMsg: `goes through symlink "link"`,
		},
		{
			name: "entry under relative symlink escaping",
			entries: func(sentinel string) []ent {
				// From store/tmp/layer-<hex>/a, four levels up is the test's base dir, so a
				// regression writes into the sentinel rather than somewhere on the host.
				return []ent{dir("a/", 0o755), symlink("a/up", "../../../../sentinel"), file("a/up/pwned", "x")}
			},
			wantMsg: `goes through symlink "a/up"`,
		},
		{
			name: "whiteout under symlinked dir",
			entries: func(sentinel string) []ent {
				return []ent{symlink("link", sentinel), whiteout("link", "victim")}
			},
			wantMsg: "goes through symlink",
		},
		{
			name: "opaque marker under symlinked dir",
			entries: func(sentinel string) []ent {
				return []ent{symlink("link", sentinel), file("link/.wh..wh..opq", "")}
			},
			wantMsg: "goes through symlink",
		},
		{
			name:    "hard link escaping",
			entries: func(string) []ent { return []ent{hardlink("passwd", "../../etc/passwd")} },
			wantMsg: "escapes the layer root",
		},
		{
			name: "hard link through symlink",
			entries: func(sentinel string) []ent {
				return []ent{symlink("link", sentinel), hardlink("stolen", "link/victim")}
			},
			wantMsg: "goes through symlink",
		},
		{
			name: "char device",
			entries: func(string) []ent {
				return []ent{ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3}}
			},
			wantMsg: "device node",
		},
		{
			name: "block device",
			entries: func(string) []ent {
				return []ent{ent{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660, major: 8}}
			},
			wantMsg: "device node",
		},
		{
			name:    "fifo",
			entries: func(string) []ent { return []ent{ent{name: "pipe", typ: tar.TypeFifo, mode: 0o644}} },
			wantMsg: "fifo",
		},
		{
			name:    "root as file",
			entries: func(string) []ent { return []ent{file(".", "x")} },
			wantMsg: "layer root",
		},
		{
			name:    "whiteout of dot-dot",
			entries: func(string) []ent { return []ent{file("a/.wh...", "")} },
			wantMsg: "whiteout names no file",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			sentinel := filepath.Join(base, "sentinel")
			os.Mkdir(sentinel, 0o755)
			os.WriteFile(filepath.Join(sentinel, "victim"), []byte("keep me"), 0o644)
			s, err := Open(filepath.Join(base, "store"))
			if err != nil {
				t.Fatal(err)
			}
			good := layerOf(t, file("fine", "ok"))
			bad := layerOf(t, append([]ent{file("before", "written first")}, tt.entries(sentinel)...)...)
			archive := dockerArchive(t, imageOf(t, good, bad), "example.com/evil:1")

			_, err = s.Import(context.Background(), archive, nil)
			if !errors.Is(err, ErrUnsafeArchive) {
				t.Fatalf("Import = %v, want ErrUnsafeArchive", err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
			if !strings.Contains(err.Error(), "entry ") {
				t.Errorf("error %q does not name the archive entry", err)
			}
			// Nothing outside the store...
			if got := dirNames(t, sentinel); len(got) != 1 || got[0] != "victim" {
				t.Errorf("sentinel dir = %v, want only victim", got)
			}
			if b, _ := os.ReadFile(filepath.Join(sentinel, "victim")); string(b) != "keep me" {
				t.Errorf("sentinel victim = %q", b)
			}
			filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
				if err == nil && strings.HasPrefix(d.Name(), "pwned") || d != nil && d.Name() == "stolen" {
					t.Errorf("escaped entry created at %s", p)
				}
				return nil
			})
			// ...no partial layer, no leftovers, no record.
			badDir := filepath.Join(s.Root(), "layers", diffIDOf(t, bad))
			if _, err := os.Lstat(badDir); !os.IsNotExist(err) {
				t.Errorf("partial layer dir %s left behind (err %v)", badDir, err)
			}
			if got := dirNames(t, s.tmpDir()); len(got) != 0 {
				t.Errorf("tmp/ = %v, want empty", got)
			}
			if imgs, _ := s.List(); len(imgs) != 0 {
				t.Errorf("List = %d images after a refused import", len(imgs))
			}
		})
	}
}

// lyingLayer claims another layer's diff ID, as a malicious image config would.
type lyingLayer struct {
	v1.Layer
	claim v1.Hash
}

func (l lyingLayer) DiffID() (v1.Hash, error) { return l.claim, nil }

func TestDiffIDVerified(t *testing.T) {
	s := openStore(t)
	honest := layerOf(t, file("bin/true", "real"))
	evil := layerOf(t, file("bin/true", "trojan"))
	claim, err := honest.DiffID()
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.unpackLayer(context.Background(), lyingLayer{evil, claim}, 1, 1, nil)
	if !errors.Is(err, ErrUnsafeArchive) || !strings.Contains(err.Error(), "not the diff ID") {
		t.Fatalf("unpacking a layer under a false diff ID: err = %v, want ErrUnsafeArchive", err)
	}
	if _, ok := s.unpacked(claim.Hex); ok {
		t.Errorf("the false layer was stored under the honest diff ID")
	}
}
