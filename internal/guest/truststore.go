package guest

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"moat.dev/moat/internal/tlsca"
)

// The guest trusts the sandbox CA through its system store (DESIGN §5), so
// that curl, git, Go, Python's ssl and everything else built on OpenSSL or
// the distribution's bundle accept the gate's leaves without configuration.
// Init writes the store itself, at every start: images need not ship
// update-ca-certificates or update-ca-trust, and the root filesystem's upper
// layer persists across down/up, so every step replaces what an earlier
// start wrote instead of adding to it.

// trustBundles are the system bundles init adds the CA to, in the order a
// session's REQUESTS_CA_BUNDLE prefers them.
var trustBundles = []string{
	// Debian, Ubuntu, Alpine; also the first file Go's crypto/x509 reads.
	debianBundle,
	// Fedora, RHEL: a symlink to the next, update-ca-trust's output.
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	// Alpine (a symlink to the first), LibreSSL's default.
	"/etc/ssl/cert.pem",
}

const (
	debianBundle = "/etc/ssl/certs/ca-certificates.crt"
	// OpenSSL's hashed directory: Debian's OpenSSL reads it when its
	// default CA file (/usr/lib/ssl/cert.pem, shipped by the openssl
	// package, which slim images lack) is missing; Python's ssl module
	// then finds the CA only here.
	hashDir = "/etc/ssl/certs"
	// Anchors: where the distributions' own tools rebuild the bundles
	// from, so that an update-ca-certificates or update-ca-trust run in
	// the guest (installing a package can run one) keeps the CA.
	debianAnchorDir = "/usr/local/share/ca-certificates" // update-ca-certificates reads *.crt only
	debianAnchor    = debianAnchorDir + "/moat.crt"
	fedoraTrustDir  = "/etc/pki/ca-trust"
	fedoraAnchor    = fedoraTrustDir + "/source/anchors/moat.pem"
	// hashLinkTarget is the link update-ca-certificates itself makes for
	// a local anchor; the hash link points at it, as c_rehash's would.
	hashLinkTarget = hashDir + "/moat.pem"
)

// bundleHeader marks the CA's block in a bundle for a person reading it.
// Init finds an earlier block by its certificate (tlsca.IsMoatCA), not by
// this line: update-ca-certificates rebuilds the bundle without it.
const bundleHeader = "# moat sandbox CA: added by moat init at every start\n"

// trust is what installCA did.
type trust struct {
	// bundle is the path in the guest of a bundle that holds the CA and
	// other roots as well, for REQUESTS_CA_BUNDLE and PIP_CERT; empty when
	// the image has no roots of its own. Pointing those at a file with the
	// CA alone would make Python stop trusting every host the gate does
	// not inspect.
	bundle string
	// changed lists the files written (not those already right).
	changed []string
}

// installCA adds the PEM certificate ca to every system trust store under
// root ("/" in the guest; a temporary directory in tests). It removes any
// earlier moat CA from the bundles first, so it is idempotent and follows
// a CA that changed. A bundle that is a symlink is written through: the
// file it resolves to is replaced, the link is left as it is.
//
// An image with no bundle at all gets /etc/ssl/certs/ca-certificates.crt
// holding the CA alone. Nothing in such an image could verify any TLS peer
// before, so nothing breaks; with it, OpenSSL and Go programs trust the
// hosts the gate inspects, which are the ones with bound credentials. A
// later update-ca-certificates (installing ca-certificates runs it) rebuilds
// that file from the system roots plus the anchor init also writes.
//
// Errors are collected and returned together after every store was tried:
// one read-only or odd path must not keep the CA out of the others.
func installCA(root string, ca []byte) (trust, error) {
	var t trust
	cert, err := parseMoatCA(ca)
	if err != nil {
		return t, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	var errs []error
	seen := map[string]bool{} // resolved paths: Alpine and Fedora link two names to one file
	found := false
	for _, p := range trustBundles {
		real, exists, err := resolveIn(root, p)
		if err != nil {
			errs = append(errs, fmt.Errorf("resolving %s: %w", p, err))
			continue
		}
		if !exists {
			continue
		}
		found = true
		others, err := t.addToBundle(root, real, caPEM, seen)
		if err != nil {
			errs = append(errs, fmt.Errorf("adding the sandbox CA to %s: %w", p, err))
			continue
		}
		if others && t.bundle == "" {
			t.bundle = p
		}
	}
	if !found {
		real, _, err := resolveIn(root, debianBundle)
		if err == nil {
			_, err = t.addToBundle(root, real, caPEM, seen)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("creating %s: %w", debianBundle, err))
		}
	}

	if exists(root, debianBundle) || exists(root, debianAnchorDir) {
		if err := t.writeIfChanged(root, debianAnchor, caPEM); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", debianAnchor, err))
		}
	}
	if exists(root, fedoraTrustDir) {
		if err := t.writeIfChanged(root, fedoraAnchor, caPEM); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", fedoraAnchor, err))
		}
	}
	if exists(root, debianBundle) && exists(root, debianAnchor) {
		if err := t.linkHash(root, cert); err != nil {
			errs = append(errs, fmt.Errorf("linking the sandbox CA into %s: %w", hashDir, err))
		}
	}
	return t, errors.Join(errs...)
}

func parseMoatCA(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("reading the sandbox CA: no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing the sandbox CA: %w", err)
	}
	// installCA removes every moat CA from the bundles before adding this
	// one, so it must be one: anything else would pile up.
	if !tlsca.IsMoatCA(cert) {
		return nil, errors.New("the sandbox CA is not a moat CA")
	}
	return cert, nil
}

// addToBundle puts caPEM into the bundle at real (resolved, in the guest),
// once per file, and reports whether the bundle holds other roots too.
func (t *trust) addToBundle(root, real string, caPEM []byte, seen map[string]bool) (others bool, err error) {
	old, err := os.ReadFile(filepath.Join(root, real))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	merged, others := mergeBundle(old, caPEM)
	if seen[real] {
		return others, nil
	}
	seen[real] = true
	if bytes.Equal(merged, old) {
		return others, nil
	}
	if err := replaceFile(filepath.Join(root, real), merged); err != nil {
		return false, err
	}
	t.changed = append(t.changed, real)
	return others, nil
}

// mergeBundle returns bundle without any moat CA (with its header line, if
// it has one) and with caPEM appended under bundleHeader; everything else
// is kept byte for byte. others reports whether certificates that are not
// moat CAs remain.
func mergeBundle(bundle, caPEM []byte) (merged []byte, others bool) {
	const begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
	var out, der []byte
	keepFrom := 0 // start of the text not yet copied to out
	blockStart, bodyStart, prevLine := -1, -1, -1
	for off := 0; off < len(bundle); {
		lineEnd := bytes.IndexByte(bundle[off:], '\n') + 1
		if lineEnd == 0 {
			lineEnd = len(bundle) - off
		}
		line := bytes.TrimRight(bundle[off:off+lineEnd], " \t\r\n")
		switch {
		case string(line) == begin:
			blockStart, bodyStart = off, off+lineEnd
			if prevLine >= 0 && string(bundle[prevLine:off]) == bundleHeader {
				blockStart = prevLine
			}
		case string(line) == end && blockStart >= 0:
			blockEnd := off + lineEnd
			var moat bool
			der, moat = isMoatBlock(bundle[bodyStart:off], der)
			if moat {
				out = append(out, bundle[keepFrom:blockStart]...)
				keepFrom = blockEnd
			} else {
				others = true
			}
			blockStart = -1
		}
		prevLine = off
		off += lineEnd
	}
	out = append(out, bundle[keepFrom:]...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	out = append(out, bundleHeader...)
	return append(out, caPEM...), others
}

// isMoatBlock reports whether the base64 body of a PEM certificate block is
// a moat CA, decoding it into buf (returned for reuse). It is on init's
// path at every start, for each of a bundle's ~140 roots: the body is
// decoded directly (base64 skips the line breaks), not by pem.Decode, which
// took most of the time, and a byte search turns away all but moat CAs
// before any certificate is parsed.
func isMoatBlock(body, buf []byte) ([]byte, bool) {
	buf = slices.Grow(buf[:0], base64.StdEncoding.DecodedLen(len(body)))[:base64.StdEncoding.DecodedLen(len(body))]
	n, err := base64.StdEncoding.Decode(buf, body)
	if err != nil || !bytes.Contains(buf[:n], []byte("moat")) {
		return buf, false
	}
	cert, err := x509.ParseCertificate(buf[:n])
	return buf, err == nil && tlsca.IsMoatCA(cert)
}

// writeIfChanged writes b to p (in the guest, through any symlinks) unless
// it already holds exactly b.
func (t *trust) writeIfChanged(root, p string, b []byte) error {
	real, _, err := resolveIn(root, p)
	if err != nil {
		return err
	}
	full := filepath.Join(root, real)
	if old, err := os.ReadFile(full); err == nil && bytes.Equal(old, b) {
		return nil
	}
	if err := replaceFile(full, b); err != nil {
		return err
	}
	t.changed = append(t.changed, real)
	return nil
}

// linkHash makes OpenSSL's hashed directory find the CA: moat.pem links to
// the anchor and <subject hash>.N to moat.pem, the very links
// update-ca-certificates would make, so its next run agrees with them.
// Links, not copies: a CA that changes needs only the anchor rewritten.
func (t *trust) linkHash(root string, cert *x509.Certificate) error {
	dir, _, err := resolveIn(root, hashDir)
	if err != nil {
		return err
	}
	if err := t.symlink(root, path.Join(dir, path.Base(hashLinkTarget)), debianAnchor); err != nil {
		return err
	}
	h, err := subjectHash(cert.RawSubject)
	if err != nil {
		return err
	}
	// OpenSSL tries <hash>.0, .1, ... until one is missing; another root
	// with the same subject hash may hold .0 already. The bound is
	// generous: a collision between two roots is already rare.
	for i := range 10 {
		name := path.Join(dir, fmt.Sprintf("%08x.%d", h, i))
		target, err := os.Readlink(filepath.Join(root, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return t.symlink(root, name, path.Base(hashLinkTarget))
		case err == nil && target == path.Base(hashLinkTarget):
			return nil
		}
		if c, err := readCert(root, name); err == nil && tlsca.IsMoatCA(c) {
			// An older moat CA's link or copy, by another name.
			return t.symlink(root, name, path.Base(hashLinkTarget))
		}
	}
	return fmt.Errorf("no free name for %08x.N", h)
}

// symlink makes name (resolved, in the guest) a link to target, replacing
// whatever is there, unless it is that link already.
func (t *trust) symlink(root, name, target string) error {
	full := filepath.Join(root, name)
	if old, err := os.Readlink(full); err == nil && old == target {
		return nil
	}
	tmp := filepath.Join(filepath.Dir(full), ".moat-link-"+filepath.Base(full))
	os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, full); err != nil {
		os.Remove(tmp)
		return err
	}
	t.changed = append(t.changed, name)
	return nil
}

func readCert(root, p string) (*x509.Certificate, error) {
	real, _, err := resolveIn(root, p)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(root, real))
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	return x509.ParseCertificate(block.Bytes)
}

// replaceFile writes b to full by a rename, so that no reader sees half a
// bundle. The new file keeps the old one's mode and owner (0644, root's,
// when there was none). When the file cannot be renamed over, which is
// what a bind mount onto it looks like, it is rewritten in place.
func replaceFile(full string, b []byte) error {
	mode, uid, gid := os.FileMode(0o644), -1, -1
	if fi, err := os.Stat(full); err == nil {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", full)
		}
		mode = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	}
	dir := filepath.Dir(full)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".moat-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename, a no-op
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil && uid >= 0 {
		f.Chown(uid, gid) // best effort: root's files stay root's
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, full); err != nil {
		if errors.Is(err, syscall.EBUSY) || errors.Is(err, syscall.EXDEV) {
			return os.WriteFile(full, b, mode)
		}
		return err
	}
	return nil
}

func exists(root, p string) bool {
	_, ok, err := resolveIn(root, p)
	return err == nil && ok
}

// maxLinks is how many symlinks resolveIn follows, as Linux's MAXSYMLINKS.
const maxLinks = 40

// resolveIn resolves the guest path p against root, following symlinks as
// the guest's kernel would: an absolute link target starts again at root,
// not at the host's /. It returns the resolved path in the guest and
// whether it exists; when it does not, the path is where it would be (a
// dangling link resolves to its target), which is where to create it.
func resolveIn(root, p string) (string, bool, error) {
	rest := strings.Split(strings.TrimPrefix(path.Clean("/"+p), "/"), "/")
	cur, links := "/", 0
	for len(rest) > 0 {
		part := rest[0]
		rest = rest[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, part)
		fi, err := os.Lstat(filepath.Join(root, next))
		if errors.Is(err, fs.ErrNotExist) {
			return path.Join(append([]string{next}, rest...)...), false, nil
		}
		if err != nil {
			return "", false, err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > maxLinks {
			return "", false, fmt.Errorf("%s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", false, err
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return cur, true, nil
}
