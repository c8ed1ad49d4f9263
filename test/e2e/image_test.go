package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type entry struct {
	name, link string
	body       []byte
	mode       int64
	dir        bool
}

func layerOf(t *testing.T, entries []entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: 0, Gid: 0}
		switch {
		case e.dir:
			h.Typeflag = tar.TypeDir
		case e.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func writeImage(t *testing.T, path, ref string, layers ...v1.Layer) {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		t.Fatal(err)
	}
}

// busyboxLayer is the small test image: busybox-static and its applets.
func busyboxLayer(t *testing.T) v1.Layer {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox-static is installed by scripts/setup.sh: %v", err)
	}
	es := []entry{{name: "bin/", dir: true, mode: 0o755}, {name: "bin/busybox", body: bb, mode: 0o755},
		{name: "etc/", dir: true, mode: 0o755}, {name: "etc/passwd", body: []byte("root:x:0:0:root:/root:/bin/sh\n"), mode: 0o644},
		{name: "etc/os-release", body: []byte("ID=moat-test-busybox\n"), mode: 0o644}}
	for _, a := range []string{"sh", "id", "cat", "echo", "ps", "ls", "true"} {
		es = append(es, entry{name: "bin/" + a, link: "/bin/busybox", mode: 0o777})
	}
	return layerOf(t, es)
}

func TestOCIImageImportAndRun(t *testing.T) {
	dir := project(t, "ociimg")
	archive := filepath.Join(t.TempDir(), "bb.tar")
	writeImage(t, archive, "moat.test/busybox:1", busyboxLayer(t))
	out := mustMoat(t, dir, "image", "import", archive)
	if !strings.Contains(out, "moat.test/busybox:1") {
		t.Fatalf("import printed %q", out)
	}
	if out := mustMoat(t, dir, "image", "list"); !strings.Contains(out, "moat.test/busybox:1") {
		t.Fatalf("image list: %q", out)
	}
	os.WriteFile(filepath.Join(dir, "moat.toml"), []byte("[sandbox]\nimage = \"moat.test/busybox:1\"\n"), 0o644)
	got := mustMoat(t, dir, "run", "--", "sh", "-c", "cat /etc/os-release; id -un; pwd")
	want := "ID=moat-test-busybox\nagent\n" + dir + "\n"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestImportRefusesEscapingArchive(t *testing.T) {
	sentinel := filepath.Join(os.TempDir(), "moat-e2e-escape-sentinel")
	os.Remove(sentinel)
	archive := filepath.Join(t.TempDir(), "evil.tar")
	writeImage(t, archive, "moat.test/evil:1", layerOf(t, []entry{
		{name: "../../../../../../" + strings.TrimPrefix(sentinel, "/"), body: []byte("pwned"), mode: 0o644},
	}))
	r := moat(t, "/", nil, "image", "import", archive)
	if r.code == 0 {
		t.Fatalf("an archive with ../ entries was imported: %s", r.stdout)
	}
	if _, err := os.Stat(sentinel); err == nil {
		t.Fatal("the archive wrote outside the cache")
	}
	if !strings.Contains(r.stderr, "..") {
		t.Fatalf("the refusal does not name the entry: %s", r.stderr)
	}
}
