package rootless

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"moat.dev/moat/internal/userns"
)

// The image's ids that are neither root's nor, by construction, the test user's.
const imgUID, imgGID = 4321, 4322

// TestRootlessImage runs an OCI image without sudo, end to end as the
// user would: moat image import (each layer unpacked in a user namespace
// with the sandbox's map), moat image pull and rm of a second image that
// shares a layer, moat run with [sandbox] image. Inside the
// guest a file keeps the owner the image gives it, a file a higher layer
// whited out is absent and an opaque directory shows only the higher
// layer's files; the agent is the user, and what it writes in the
// workspace belongs to the user. On the host the layer's files belong to
// the ids the namespace maps the image's ids to. down/up keeps the
// writable layer; destroy leaves no mount and no process, image rm leaves
// no layer, and nothing the sandbox's ids own is left in MOAT_HOME or in
// the host's temp dirs. A layer that escapes its root is refused without
// a trace.
func TestRootlessImage(t *testing.T) {
	h := setupHost(t)
	u := h.user
	home := mkdirOwned(t, h.base, "home", u)
	ws := mkdirOwned(t, h.base, "imgws", u)
	m := &moatUser{h: h, bin: moatBinary(t, h.base), home: home}
	moat := m.run
	state := filepath.Join(home, "state", "sandboxes", "imgws")
	t.Cleanup(func() {
		moat(t, ws, "destroy", "--yes", "imgws")
		waitNoProcs(t, h)
	})
	tmpBefore := ownedInTmp(t, h)

	out, _, code := moat(t, ws, "doctor")
	if code != 0 {
		t.Fatalf("moat doctor as %s: exit %d\n%s", u.name, code, out)
	}
	if re := regexp.MustCompile(`(?i)\bimages?\b[^\n]*(not yet|unsupported|not supported|needs? (root|sudo))`); re.MatchString(out) {
		t.Errorf("moat doctor says images do not work without sudo: %q\n%s", re.FindString(out), out)
	}

	archive := filepath.Join(h.base, "img.tar")
	writeImage(t, archive, "moat.test/rootless:1", imageLower(t), imageUpper(t))
	if _, se, code := moat(t, ws, "image", "import", archive); code != 0 {
		t.Fatalf("moat image import as %s: exit %d: %s", u.name, code, se)
	}

	// On the host: each file is on the id the sandbox's namespace maps
	// the image's id to, and the whiteouts are overlayfs's.
	uidMap, gidMap := sandboxMaps(t, u)
	layers := filepath.Join(home, "cache", "images", "layers")
	lower := layerWith(t, layers, "opt/owned")
	for _, c := range []struct {
		path     string
		uid, gid uint32
	}{
		{filepath.Join(lower, "opt", "owned"), imgUID, imgGID},
		{filepath.Join(lower, "bin", "busybox"), 0, 0},
	} {
		var st syscall.Stat_t
		if err := syscall.Lstat(c.path, &st); err != nil {
			t.Fatal(err)
		}
		if wu, wg := hostID(uidMap, c.uid), hostID(gidMap, c.gid); st.Uid != wu || st.Gid != wg {
			t.Errorf("%s is %d:%d on the host, want %d:%d (the image's %d:%d through the sandbox's map)", c.path, st.Uid, st.Gid, wu, wg, c.uid, c.gid)
		}
	}
	if got := owner(t, lower+".json"); got != u.uid {
		t.Errorf("the layer's info %s.json belongs to %s, want the user %d (the store's own files stay the user's)", lower, ownerString(got), u.uid)
	}
	// The store is for moat without sudo: root's moat refuses it rather
	// than mount its layers without userxattr.
	asRoot := exec.Command(m.bin, "image", "list")
	asRoot.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + home, "MOAT_HOME=" + home}
	if out, err := asRoot.CombinedOutput(); err == nil || !strings.Contains(string(out), "moat without sudo made it") {
		t.Errorf("moat image list as root on the user's store: %v, want a refusal; output: %s", err, out)
	}
	upper := layerWith(t, layers, "opt/d/new")
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(upper, "opt", "gone"), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev != 0 {
		t.Errorf("the whiteout of opt/gone: mode %o rdev %d (%v), want a 0/0 character device", st.Mode, st.Rdev, err)
	}

	// moat image pull, from a registry on loopback: the same unpacking,
	// a layer the store has is not unpacked again, and rm takes only the
	// layer no other image uses.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	pulled := strings.TrimPrefix(reg.URL, "http://") + "/moat/pulled:1"
	pimg, err := mutate.AppendLayers(empty.Image, imageLower(t), layerFrom(t, []tarEntry{
		{name: "opt/", dir: true, mode: 0o755}, {name: "opt/pulled", body: "pulled", mode: 0o644, uid: imgUID, gid: imgGID}}))
	if err != nil {
		t.Fatal(err)
	}
	pref, err := name.ParseReference(pulled, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(pref, pimg); err != nil {
		t.Fatalf("pushing to the test registry: %v", err)
	}
	if _, se, code := moat(t, ws, "image", "pull", pulled); code != 0 || !strings.Contains(se, "layer 1/2 sha256:") || !strings.Contains(se, "already unpacked") {
		t.Fatalf("moat image pull %s: exit %d, want the shared layer already unpacked; stderr: %s", pulled, code, se)
	}
	pl := layerWith(t, layers, "opt/pulled")
	var pst syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(pl, "opt", "pulled"), &pst); err != nil || pst.Uid != hostID(uidMap, imgUID) {
		t.Errorf("the pulled layer's opt/pulled is uid %d on the host (%v), want %d", pst.Uid, err, hostID(uidMap, imgUID))
	}
	if _, se, code := moat(t, ws, "image", "rm", pulled); code != 0 {
		t.Fatalf("moat image rm %s: exit %d: %s", pulled, code, se)
	}
	if _, err := os.Lstat(pl); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after image rm, the pulled image's own layer is still there: %v", err)
	}
	layerWith(t, layers, "opt/owned") // still used by the imported image

	if err := os.WriteFile(filepath.Join(ws, "moat.toml"), []byte("[sandbox]\nimage = \"moat.test/rootless:1\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chown(filepath.Join(ws, "moat.toml"), int(u.uid), int(u.gid))
	script := `echo "OS=$(cat /etc/os-release)"
echo "OWNED=$(stat -c %u:%g /opt/owned) $(cat /opt/owned)"
echo "BUSYBOX=$(stat -c %u:%g /bin/busybox)"
echo "GONE=$(ls /opt/gone 2>/dev/null || echo absent)"
echo "D=$(ls /opt/d | tr '\n' ' ')"
echo "ID=$(id -u):$(id -g) $(id -un)"
echo hi > f && echo "WROTE=ok"`
	so, se, code := moat(t, ws, "run", "--trust-project", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("moat run with the image as %s: exit %d\nstdout: %s\nstderr: %s\ndaemon.log:\n%s", u.name, code, so, se, readSandboxLog(state))
	}
	f := fields(so)
	for k, want := range map[string]string{
		"OS":      "ID=moat-test-rootless",
		"OWNED":   fmt.Sprintf("%d:%d owned", imgUID, imgGID),
		"BUSYBOX": "0:0",
		"GONE":    "absent",
		"D":       "new",
		"ID":      fmt.Sprintf("%d:%d agent", u.uid, u.gid),
		"WROTE":   "ok",
	} {
		if f[k] != want {
			t.Errorf("in the guest %s=%q, want %q", k, f[k], want)
		}
	}
	if t.Failed() {
		t.Logf("guest:\n%s", so)
	}
	if got := owner(t, filepath.Join(ws, "f")); got != u.uid {
		t.Errorf("the agent's file belongs to %s on the host, want the user %d", ownerString(got), u.uid)
	}

	t.Run("down_up_keeps_the_writable_layer", func(t *testing.T) {
		write := `echo kept > "$HOME/keep" && cat "$HOME/keep"`
		if so, se, code := moat(t, ws, "run", "--", "sh", "-c", write); code != 0 || so != "kept\n" {
			t.Fatalf("writing ~/keep in the guest: exit %d, stdout %q\nstderr: %s", code, so, se)
		}
		if _, se, code := moat(t, ws, "down"); code != 0 {
			t.Fatalf("moat down: exit %d: %s", code, se)
		}
		waitNoProcs(t, h)
		if _, se, code := moat(t, ws, "up"); code != 0 {
			t.Fatalf("moat up: exit %d: %s\ndaemon.log:\n%s", code, se, readSandboxLog(state))
		}
		if so, se, code := moat(t, ws, "run", "--", "sh", "-c", `cat "$HOME/keep"; ls /opt/gone 2>/dev/null || echo absent`); code != 0 || so != "kept\nabsent\n" {
			t.Errorf("after down and up: exit %d, stdout %q, want ~/keep kept and /opt/gone still absent\nstderr: %s", code, so, se)
		}
	})

	// destroy: no mount, namespace or process of the sandbox outlives it.
	nsBefore := h.sandboxNamespaces()
	if len(mountsUnder(state)) == 0 || len(nsHolders(nsBefore)) == 0 {
		t.Errorf("the running sandbox shows no mount under %s or no namespace held: the scans see nothing", state)
	}
	if _, se, code := moat(t, ws, "destroy", "--yes", "imgws"); code != 0 {
		t.Fatalf("moat destroy: exit %d: %s", code, se)
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state dir is still there after destroy: %v", err)
	}
	waitNoProcs(t, h)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		held := nsHolders(nsBefore)
		if len(held) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("10 s after destroy, the sandbox's namespaces are still held:\n%s", strings.Join(held, "\n"))
			break
		}
	}
	for _, dir := range []string{home, ws} {
		if left := mountsUnder(dir); len(left) > 0 {
			t.Errorf("after destroy, mounts at or under %s:\n%s", dir, strings.Join(left, "\n"))
		}
	}

	// A layer that climbs out of its root: refused, nothing written.
	sentinel := filepath.Join(h.base, "escaped")
	evil := filepath.Join(h.base, "evil.tar")
	writeImage(t, evil, "moat.test/evil:1", layerFrom(t, []tarEntry{{name: "../../../../../../../../" + strings.TrimPrefix(sentinel, "/"), body: "pwned", mode: 0o644}}))
	if _, se, code := moat(t, ws, "image", "import", evil); code == 0 || !strings.Contains(se, "unsafe image archive") {
		t.Errorf("importing an archive whose layer escapes: exit %d, want a refusal that says why; stderr: %s", code, se)
	}
	if _, err := os.Lstat(sentinel); err == nil {
		t.Errorf("the escaping layer wrote %s", sentinel)
	}
	// An id past the user's subordinate range cannot be mapped: refused,
	// saying what to do.
	far := filepath.Join(h.base, "far.tar")
	writeImage(t, far, "moat.test/far:1", layerFrom(t, []tarEntry{{name: "far", body: "far", mode: 0o644, uid: int(u.subUID.Count) + 1000}}))
	if _, se, code := moat(t, ws, "image", "import", far); code == 0 || !strings.Contains(se, "larger range") {
		t.Errorf("importing an image with uid %d, past the user's %d subordinate ids: exit %d, want a refusal that says what to do; stderr: %s", u.subUID.Count+1000, u.subUID.Count, code, se)
	}

	// image rm: the layers, whose files belong to subordinate ids, go too.
	if _, se, code := moat(t, ws, "image", "rm", "moat.test/rootless:1"); code != 0 {
		t.Fatalf("moat image rm: exit %d: %s", code, se)
	}
	for _, d := range []string{layers, filepath.Join(home, "cache", "images", "tmp")} {
		if ents, err := os.ReadDir(d); err != nil || len(ents) > 0 {
			t.Errorf("after image rm, %s holds %d entries (%v), want none", d, len(ents), err)
		}
	}
	if left := notOwnedBy(t, home, u.uid); len(left) > 0 {
		t.Errorf("after destroy and image rm, MOAT_HOME holds files of other ids than the user's:\n%s", strings.Join(left, "\n"))
	}
	if left := newEntries(tmpBefore, ownedInTmp(t, h)); len(left) > 0 {
		t.Errorf("files of the user or its subordinate ids left in the host's temp dirs:\n%s", strings.Join(left, "\n"))
	}
}

// imageLower is the image's first layer: busybox, an os-release, a file
// of a user that is neither root nor the test user, and the files the
// upper layer deletes.
func imageLower(t *testing.T) v1.Layer {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox-static is installed by scripts/setup.sh: %v", err)
	}
	es := []tarEntry{
		{name: "bin/", dir: true, mode: 0o755}, {name: "bin/busybox", body: string(bb), mode: 0o755},
		{name: "etc/", dir: true, mode: 0o755},
		{name: "etc/passwd", body: "root:x:0:0:root:/root:/bin/sh\n", mode: 0o644},
		{name: "etc/os-release", body: "ID=moat-test-rootless\n", mode: 0o644},
		{name: "opt/", dir: true, mode: 0o755},
		{name: "opt/owned", body: "owned", mode: 0o644, uid: imgUID, gid: imgGID},
		{name: "opt/gone", body: "must be hidden", mode: 0o644},
		{name: "opt/d/", dir: true, mode: 0o755},
		{name: "opt/d/old", body: "must be hidden", mode: 0o644},
	}
	for _, a := range []string{"sh", "id", "cat", "echo", "ls", "stat", "tr", "true"} {
		es = append(es, tarEntry{name: "bin/" + a, link: "/bin/busybox", mode: 0o777})
	}
	return layerFrom(t, es)
}

// imageUpper deletes opt/gone and makes opt/d opaque, as OCI layers say it.
func imageUpper(t *testing.T) v1.Layer {
	return layerFrom(t, []tarEntry{
		{name: "opt/", dir: true, mode: 0o755},
		{name: "opt/.wh.gone", mode: 0o644},
		{name: "opt/d/", dir: true, mode: 0o755},
		{name: "opt/d/.wh..wh..opq", mode: 0o644},
		{name: "opt/d/new", body: "shown", mode: 0o644},
	})
}

type tarEntry struct {
	name, link, body string
	mode             int64
	uid, gid         int
	dir              bool
}

func layerFrom(t *testing.T, entries []tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid}
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
		io.WriteString(tw, e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// writeImage writes a docker-save archive the user can read.
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
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// sandboxMaps are the maps moat gives the user's sandbox (and its image
// unpacking): KeepIDs, from the host's subordinate id files.
func sandboxMaps(t *testing.T, u *testUser) (uids, gids []userns.IDMap) {
	t.Helper()
	pu, err := user.Lookup(u.name)
	if err != nil {
		t.Fatal(err)
	}
	pu.Gid = strconv.Itoa(int(u.gid))
	c, err := userns.ConfigFor(pu, userns.KeepIDs, userns.SubUIDFile, userns.SubGIDFile)
	if err != nil {
		t.Fatal(err)
	}
	return c.UIDMap, c.GIDMap
}

// hostID is the host's id for id inside a namespace with maps.
func hostID(maps []userns.IDMap, id uint32) uint32 {
	for _, m := range maps {
		if id >= m.Inside && id-m.Inside < m.Count {
			return m.Outside + (id - m.Inside)
		}
	}
	return ^uint32(0)
}

// layerWith is the unpacked layer under layers that holds rel.
func layerWith(t *testing.T, layers, rel string) string {
	t.Helper()
	ents, err := os.ReadDir(layers)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if p := filepath.Join(layers, e.Name()); e.IsDir() {
			if _, err := os.Lstat(filepath.Join(p, rel)); err == nil {
				return p
			}
		}
	}
	t.Fatalf("no layer under %s holds %s", layers, rel)
	return ""
}

// notOwnedBy lists what under dir does not belong to uid.
func notOwnedBy(t *testing.T, dir string, uid uint32) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", p, err))
			return nil
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) == nil && st.Uid != uid {
			out = append(out, fmt.Sprintf("%s (uid %d)", p, st.Uid))
		}
		return nil
	})
	return out
}

// ownedInTmp lists the entries of the host's temp dirs, but the test's own
// base, that belong to the user or its subordinate ids.
func ownedInTmp(t *testing.T, h *host) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	sub := h.user.subUID
	for _, d := range []string{os.TempDir(), "/var/tmp", "/dev/shm"} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			p := filepath.Join(d, e.Name())
			var st syscall.Stat_t
			if p == h.base || syscall.Lstat(p, &st) != nil {
				continue
			}
			if st.Uid == h.user.uid || st.Uid >= sub.Start && st.Uid-sub.Start < sub.Count {
				out[fmt.Sprintf("%s (uid %d)", p, st.Uid)] = true
			}
		}
	}
	return out
}

func newEntries(before, after map[string]bool) []string {
	var out []string
	for p := range after {
		if !before[p] {
			out = append(out, p)
		}
	}
	return out
}

func readSandboxLog(state string) string {
	b, _ := os.ReadFile(filepath.Join(state, "daemon.log"))
	r, _ := os.ReadFile(filepath.Join(state, "runsc.log"))
	return string(b) + "\nrunsc.log:\n" + string(r)
}
