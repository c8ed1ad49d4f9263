package image

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUserXattrOverlayHonoursWhiteouts unpacks layers as the child of a store without root does
// (opaque directories marked with user.overlay.opaque) and mounts them as the rootless shim does
// (userxattr): the lower files must be hidden. Mounted without userxattr the same layers show
// the opaque directory's lower file, so the attribute is what hides it.
func TestUserXattrOverlayHonoursWhiteouts(t *testing.T) {
	requireRoot(t)
	s := openStore(t)
	s.opaque = overlayUserOpaqueXattr
	img := importLayers(t, s,
		layerOf(t, dir("a/", 0o755), file("a/file", "hidden"), file("a/keep", "kept"),
			dir("d/", 0o755), file("d/old", "hidden")),
		layerOf(t, whiteout("a", "file"), dir("d/", 0o755), file("d/.wh..wh..opq", ""), file("d/new", "shown")),
	)
	top := filepath.Join(img.Layers[1], "d")
	if got := getxattr(top, overlayUserOpaqueXattr); got != "y" {
		t.Fatalf("d: %s = %q, want y", overlayUserOpaqueXattr, got)
	}
	if got := getxattr(top, overlayOpaqueXattr); got != "" {
		t.Errorf("d: %s = %q, want none in a store without root", overlayOpaqueXattr, got)
	}

	for _, tt := range []struct {
		opts  string
		wantD []string
	}{
		{",userxattr", []string{"new"}},
		{"", []string{"new", "old"}},
	} {
		mnt := t.TempDir()
		opts := "lowerdir=" + img.LowerDir() + tt.opts
		err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, opts)
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL) && tt.opts != "" {
			t.Skipf("cannot mount overlayfs with %s here (%v); needs overlayfs with userxattr (Linux 5.11 on)", opts, err)
		}
		if err != nil {
			t.Fatalf("mounting overlay %s: %v", opts, err)
		}
		d := dirNames(t, filepath.Join(mnt, "d"))
		slices.Sort(d)
		_, ferr := os.Lstat(filepath.Join(mnt, "a", "file"))
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
		}
		if !slices.Equal(d, tt.wantD) {
			t.Errorf("overlay %q: d/ = %v, want %v", opts, d, tt.wantD)
		}
		if !errors.Is(ferr, os.ErrNotExist) {
			t.Errorf("overlay %q: whited-out a/file is visible (err %v)", opts, ferr)
		}
	}
}

// TestRoleRemovesOnlyTheStore: the child is root of a namespace holding every file of the user,
// so its rm verb takes only the store's layers, locks and temp files.
func TestRoleRemovesOnlyTheStore(t *testing.T) {
	s := openStore(t)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(s.layersDir(), strings.Repeat("a", 64))
	if err := os.MkdirAll(filepath.Join(layer, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		victim,
		s.layersDir(),
		s.imagesDir(),
		s.root,
		filepath.Join(s.root, "..", filepath.Base(filepath.Dir(victim)), "victim"),
		filepath.Join(s.layersDir(), "..", "..", "x"),
		"layers/" + strings.Repeat("a", 64), // relative
	} {
		if err := roleMain([]string{"rm", s.root, p}); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Errorf("rm %s: %v, want a refusal", p, err)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("a refused rm removed %s: %v", victim, err)
	}
	if err := roleMain([]string{"rm", s.root, layer}); err != nil {
		t.Fatalf("rm %s: %v", layer, err)
	}
	if _, err := os.Stat(layer); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("rm of a layer left it: %v", err)
	}
	if err := roleMain([]string{"unpack", s.root, "../" + strings.Repeat("a", 61)}); err == nil {
		t.Error("unpack took a digest that is a path")
	}
}

// TestOpenRefusesAnotherUsersStore: a store is used only by whoever made it: with sudo (root) or
// without (the user, whose layers belong to its subordinate ids), and each error says what to do.
func TestOpenRefusesAnotherUsersStore(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "images")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(root, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	_, err := OpenRootless(root, "/nonexistent/moat")
	if err == nil || !strings.Contains(err.Error(), "MOAT_HOME") {
		t.Fatalf("OpenRootless of a store of uid 54321, as uid 0: %v, want a refusal naming MOAT_HOME", err)
	}
	if _, err := Open(root); err == nil || !strings.Contains(err.Error(), "MOAT_HOME") {
		t.Fatalf("Open of a store of uid 54321, as root: %v, want a refusal naming MOAT_HOME", err)
	}
	if fi, _ := os.Stat(root); fi.Mode().Perm() != 0o700 {
		t.Errorf("the refused store's mode changed to %v", fi.Mode().Perm())
	}
	own := filepath.Join(t.TempDir(), "own")
	s, err := OpenRootless(own, "/nonexistent/moat")
	if err != nil || s.ns == nil {
		t.Fatalf("OpenRootless of a store of one's own: %v", err)
	}
}
