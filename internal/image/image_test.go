package image

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestImportFormats(t *testing.T) {
	base := layerOf(t, dir("etc/", 0o755), file("etc/os-release", "ID=moat\n"))
	top := layerOf(t, file("hello", "world\n"))
	img := imageOf(t, base, top)
	wantLayers := []string{diffIDOf(t, base), diffIDOf(t, top)}

	tests := []struct {
		name       string
		archive    func(t *testing.T) string
		wantRef    string
		wantDigest string
	}{
		{
			name:       "docker save with tag",
			archive:    func(t *testing.T) string { return dockerArchive(t, img, "example.com/team/tool:1.2") },
			wantRef:    "example.com/team/tool:1.2",
			wantDigest: configDigestOf(t, img),
		},
		{
			name:       "docker save without tag",
			archive:    func(t *testing.T) string { return dockerArchive(t, img, "") },
			wantRef:    "import:" + shortHex(configDigestOf(t, img)),
			wantDigest: configDigestOf(t, img),
		},
		{
			name:       "docker save gzipped",
			archive:    func(t *testing.T) string { return gzipFile(t, dockerArchive(t, img, "example.com/gz:1")) },
			wantRef:    "example.com/gz:1",
			wantDigest: configDigestOf(t, img),
		},
		{
			name: "OCI layout with ref annotation",
			archive: func(t *testing.T) string {
				return ociArchive(t, img, map[string]string{"org.opencontainers.image.ref.name": "example.com/oci:2"})
			},
			wantRef:    "example.com/oci:2",
			wantDigest: digestOf(t, img),
		},
		{
			name: "OCI layout with bare tag annotation",
			archive: func(t *testing.T) string {
				return ociArchive(t, img, map[string]string{"org.opencontainers.image.ref.name": "latest"})
			},
			wantRef:    "import:" + shortHex(digestOf(t, img)),
			wantDigest: digestOf(t, img),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t)
			var progress bytes.Buffer
			got, err := s.Import(context.Background(), tt.archive(t), &progress)
			if err != nil {
				t.Fatalf("Import: %v", err)
			}
			if got.Ref != tt.wantRef {
				t.Errorf("Ref = %q, want %q", got.Ref, tt.wantRef)
			}
			if got.Digest != tt.wantDigest {
				t.Errorf("Digest = %q, want %q", got.Digest, tt.wantDigest)
			}
			var layers []string
			for _, l := range wantLayers {
				layers = append(layers, filepath.Join(s.Root(), "layers", l))
			}
			if !reflect.DeepEqual(got.Layers, layers) {
				t.Errorf("Layers = %q, want %q", got.Layers, layers)
			}
			want := Config{
				Env:        []string{"PATH=/usr/bin:/bin", "MOAT_TEST=1"},
				Entrypoint: []string{"/bin/sh", "-c"},
				Cmd:        []string{"echo hi"},
				WorkingDir: "/work",
				User:       "1000:1000",
			}
			if !reflect.DeepEqual(got.Config, want) {
				t.Errorf("Config = %+v, want %+v", got.Config, want)
			}
			if got.SizeBytes <= 0 {
				t.Errorf("SizeBytes = %d, want > 0", got.SizeBytes)
			}
			if b, err := os.ReadFile(filepath.Join(got.Layers[1], "hello")); err != nil || string(b) != "world\n" {
				t.Errorf("top layer hello = %q, %v", b, err)
			}
			if !strings.Contains(progress.String(), "unpacking layer 2/2 sha256:") {
				t.Errorf("progress lacks per-layer lines:\n%s", progress.String())
			}
			// The record round-trips through disk.
			res, err := s.Resolve(tt.wantRef)
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tt.wantRef, err)
			}
			if !reflect.DeepEqual(res.Layers, got.Layers) || res.Digest != got.Digest || !reflect.DeepEqual(res.Config, got.Config) {
				t.Errorf("Resolve = %+v, want %+v", res, got)
			}
			if n := len(dirNames(t, s.tmpDir())); n != 0 {
				t.Errorf("tmp/ holds %d leftovers", n)
			}
		})
	}
}

func TestImportRejectsNonArchive(t *testing.T) {
	s := openStore(t)
	p := filepath.Join(t.TempDir(), "empty.tar")
	os.WriteFile(p, layerTar(t, file("README", "not an image")), 0o600)
	if _, err := s.Import(context.Background(), p, nil); err == nil || !strings.Contains(err.Error(), "not an image archive") {
		t.Fatalf("Import of a plain tar: err = %v, want 'not an image archive'", err)
	}
}

func TestLowerDir(t *testing.T) {
	img := &Image{Layers: []string{"/c/l1", "/c/l2", "/c/we:ird,l3"}}
	if got, want := img.LowerDir(), `/c/we\:ird\,l3:/c/l2:/c/l1`; got != want {
		t.Errorf("LowerDir = %q, want %q", got, want)
	}
}

func TestOpenRestrictsRoot(t *testing.T) {
	root := filepath.Join(t.TempDir(), "cache")
	os.Mkdir(root, 0o755)
	if _, err := Open(root); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(root)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o700 {
		t.Errorf("store root mode = %o, want 700", got)
	}
}

func TestSharedLayerAndRemove(t *testing.T) {
	shared := layerOf(t, file("shared", "base"))
	onlyA := layerOf(t, file("a", "A"))
	onlyB := layerOf(t, file("b", "B"))
	imgA := imageOf(t, shared, onlyA)
	imgB := imageOf(t, shared, onlyB)
	s := openStore(t)
	ctx := context.Background()

	a, err := s.Import(ctx, dockerArchive(t, imgA, "example.com/a:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	sharedDir := a.Layers[0]
	before, err := os.Stat(filepath.Join(sharedDir, "shared"))
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	b, err := s.Import(ctx, dockerArchive(t, imgB, "example.com/b:1"), &progress)
	if err != nil {
		t.Fatal(err)
	}
	if b.Layers[0] != sharedDir {
		t.Fatalf("shared layer dirs differ: %s vs %s", b.Layers[0], sharedDir)
	}
	if !strings.Contains(progress.String(), "layer 1/2 sha256:"+diffIDOf(t, shared)[:12]+"… already unpacked") {
		t.Errorf("second import did not reuse the shared layer:\n%s", progress.String())
	}
	after, err := os.Stat(filepath.Join(sharedDir, "shared"))
	if err != nil || !os.SameFile(before, after) {
		t.Errorf("shared layer was unpacked again")
	}

	layerDirs := func() []string {
		var dirs []string
		for _, n := range dirNames(t, s.layersDir()) {
			if !strings.HasSuffix(n, ".json") {
				dirs = append(dirs, n)
			}
		}
		slices.Sort(dirs)
		return dirs
	}
	sorted := func(ls ...string) []string { slices.Sort(ls); return ls }

	if got, want := layerDirs(), sorted(diffIDOf(t, shared), diffIDOf(t, onlyA), diffIDOf(t, onlyB)); !reflect.DeepEqual(got, want) {
		t.Fatalf("layers = %v, want %v", got, want)
	}
	if err := s.Remove("example.com/a:1"); err != nil {
		t.Fatalf("Remove a: %v", err)
	}
	if got, want := layerDirs(), sorted(diffIDOf(t, shared), diffIDOf(t, onlyB)); !reflect.DeepEqual(got, want) {
		t.Errorf("after removing a: layers = %v, want %v", got, want)
	}
	if _, err := s.Resolve("example.com/a:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Resolve removed image: err = %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(sharedDir, "shared")); err != nil {
		t.Errorf("shared layer lost with a: %v", err)
	}
	// Removing by digest prefix works too, and then nothing is left.
	if err := s.Remove(b.ShortDigest()); err != nil {
		t.Fatalf("Remove b by digest: %v", err)
	}
	if got := dirNames(t, s.layersDir()); len(got) != 0 {
		t.Errorf("after removing everything: layers/ = %v", got)
	}
	if got := dirNames(t, s.locksDir()); len(got) != 0 {
		t.Errorf("after removing everything: locks/ = %v", got)
	}
	if err := s.Remove("example.com/b:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: err = %v, want ErrNotFound", err)
	}
}

func TestConcurrentImportsShareLayers(t *testing.T) {
	img := imageOf(t, layerOf(t, file("x", strings.Repeat("x", 1<<20))), layerOf(t, file("y", "y")))
	archive := dockerArchive(t, img, "example.com/same:1")
	root := filepath.Join(t.TempDir(), "store")
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Open(root) // a Store per goroutine, as separate processes would have
			if err == nil {
				_, err = s.Import(context.Background(), archive, nil)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("import %d: %v", i, err)
		}
	}
	s, _ := Open(root)
	imgs, err := s.List()
	if err != nil || len(imgs) != 1 {
		t.Fatalf("List = %d images, %v; want 1", len(imgs), err)
	}
	if b, err := os.ReadFile(filepath.Join(imgs[0].Layers[0], "x")); err != nil || len(b) != 1<<20 {
		t.Errorf("layer content after concurrent imports: %d bytes, %v", len(b), err)
	}
}

func TestResolve(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	imgA := imageOf(t, layerOf(t, file("a", "1")))
	imgB := imageOf(t, layerOf(t, file("b", "2")))
	a, err := s.Import(ctx, dockerArchive(t, imgA, "alpine:3"), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Import(ctx, dockerArchive(t, imgB, "example.com/b:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	hexA := strings.TrimPrefix(a.Digest, "sha256:")

	tests := []struct {
		ref     string
		want    *Image // nil: ErrNotFound
		wantMsg string
	}{
		{ref: "alpine:3", want: a},
		{ref: "docker.io/library/alpine:3", want: a},
		{ref: "index.docker.io/library/alpine:3", want: a},
		{ref: "example.com/b:1", want: b},
		{ref: a.Digest, want: a},
		{ref: hexA, want: a},
		{ref: hexA[:12], want: a},
		{ref: "sha256:" + hexA[:12], want: a},
		{ref: strings.ToUpper(hexA[:16]), want: a},
		{ref: hexA[:11], wantMsg: "moat image pull " + hexA[:11]},
		{ref: "alpine:4", wantMsg: `"alpine:4" is not in the image cache; get it with: moat image pull alpine:4, or load an archive with: moat image import FILE`},
		{ref: "example.com/b:2"},
		{ref: "0000000000000000", wantMsg: "no cached image has digest"},
	}
	for _, tt := range tests {
		t.Run(tt.ref, func(t *testing.T) {
			got, err := s.Resolve(tt.ref)
			if tt.want == nil {
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("Resolve = %v, %v; want ErrNotFound", got, err)
				}
				if !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("error %q does not say %q", err, tt.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if got.Ref != tt.want.Ref || got.Digest != tt.want.Digest {
				t.Errorf("Resolve = %s (%s), want %s (%s)", got.Ref, got.Digest, tt.want.Ref, tt.want.Digest)
			}
		})
	}

	imgs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, img := range imgs {
		refs = append(refs, img.Ref)
	}
	if want := []string{"alpine:3", "example.com/b:1"}; !reflect.DeepEqual(refs, want) {
		t.Errorf("List refs = %v, want %v", refs, want)
	}
}

func TestReimportReplacesRecord(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	old := imageOf(t, layerOf(t, file("v", "1")))
	cur := imageOf(t, layerOf(t, file("v", "2")))
	if _, err := s.Import(ctx, dockerArchive(t, old, "example.com/app:latest"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, dockerArchive(t, cur, "example.com/app"), nil); err != nil {
		t.Fatal(err)
	}
	imgs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Digest != configDigestOf(t, cur) {
		t.Fatalf("after re-import under the same name: %d records, want 1 with the new digest", len(imgs))
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1258291, "1.2 MiB"},
		{5 << 30, "5.0 GiB"},
	}
	for _, tt := range tests {
		if got := formatSize(tt.n); got != tt.want {
			t.Errorf("formatSize(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}
