package guest

import (
	"bytes"
	"crypto/sha256"
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

// The guest trusts the sandbox CA through its system store (docs/credentials.md), so
// that curl, git, Go, Python's ssl and everything else built on OpenSSL or
// the distribution's bundle accept the gate's leaves without configuration.
// Init writes the store itself, at every start: images need not ship
// update-ca-certificates or update-ca-trust, and the root filesystem's upper
// layer persists across down/up, so every step replaces what an earlier
// start wrote instead of adding to it.
//
// The roots of [network] trust go the same way, after the CA: the gate
// verifies the upstreams it terminates against them, but a host it splices
// is verified by the guest itself, which would otherwise refuse a private
// CA's certificate (or a corporate TLS-inspecting proxy's). Unlike the CA,
// such a root cannot be told from one the image ships by looking at it, so
// init records what it added (trustRecord) and removes exactly that when
// the configuration stops listing a root.

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

// trustHeader marks the [network] trust roots init adds after the CA.
const trustHeader = "# moat [network] trust roots: added by moat init at every start\n"

// trust is what installCA did.
type trust struct {
	// bundle is the path in the guest of a bundle that holds the CA and
	// other roots as well, for REQUESTS_CA_BUNDLE and PIP_CERT; empty when
	// the image has no roots of its own. Pointing those at a file with the
	// CA alone would make Python stop trusting every host the gate does
	// not inspect.
	bundle string
	// changed lists the files written or removed (not those already right).
	changed []string
	// roots is how many [network] trust roots the CA file carried.
	roots int
}

// installCA adds the sandbox CA, the first PEM certificate of ca, to every
// system trust store under root ("/" in the guest; a temporary directory
// in tests), and after it the [network] trust roots, the certificates that
// follow it. It removes any earlier moat CA, and the roots an earlier start
// added (trustRecord), from the bundles first, so it is idempotent and
// follows a CA or a list of roots that changed. A bundle that is a symlink
// is written through: the file it resolves to is replaced, the link is
// left as it is.
//
// An image with no bundle at all gets /etc/ssl/certs/ca-certificates.crt
// holding the CA (and the roots) alone. Nothing in such an image could
// verify any TLS peer before, so nothing breaks; with it, OpenSSL and Go
// programs trust the hosts the gate inspects, which are the ones with
// bound credentials. A later update-ca-certificates (installing
// ca-certificates runs it) rebuilds that file from the system roots plus
// the anchors init also writes.
//
// Errors are collected and returned together after every store was tried:
// one read-only or odd path must not keep the CA out of the others.
func installCA(root string, ca []byte) (trust, error) {
	var t trust
	cert, rest, err := parseMoatCA(ca)
	if err != nil {
		return t, err
	}
	roots, errs := parseRoots(rest)
	t.roots = len(roots)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	rec, err := readRecord(root)
	if err != nil {
		errs = append(errs, err)
	}
	var next []recordLine // what this start added: the next start's record
	// Files of roots no longer listed go first: a renewed root with the
	// same subject must not get <hash>.1 beside a <hash>.0 about to go,
	// which OpenSSL, stopping at the first missing name, would not find.
	current := map[[32]byte]bool{}
	for _, r := range roots {
		current[r.sum] = true
	}
	next = append(next, t.removeFiles(root, rec, func(l recordLine) bool { return !current[l.sum] }, &errs)...)
	drops := rec.bundles()
	seen := map[string]bool{} // resolved paths, to others: Alpine and Fedora link two names to one file
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
		others, added, err := t.addToBundle(root, real, caPEM, roots, drops[real], seen)
		if err != nil {
			errs = append(errs, fmt.Errorf("adding the sandbox CA to %s: %w", p, err))
			next = append(next, rec.bundleLines(real)...) // still there: the next start retries
			continue
		}
		next = append(next, bundleLines(real, added)...)
		if others && t.bundle == "" {
			t.bundle = p
		}
	}
	if !found {
		real, _, err := resolveIn(root, debianBundle)
		if err == nil {
			var added []extraRoot
			_, added, err = t.addToBundle(root, real, caPEM, roots, drops[real], seen)
			next = append(next, bundleLines(real, added)...)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("creating %s: %w", debianBundle, err))
		}
	}

	debian := exists(root, debianBundle) || exists(root, debianAnchorDir)
	fedora := exists(root, fedoraTrustDir)
	if debian {
		if err := t.writeIfChanged(root, debianAnchor, caPEM); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", debianAnchor, err))
		}
	}
	if fedora {
		if err := t.writeIfChanged(root, fedoraAnchor, caPEM); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", fedoraAnchor, err))
		}
	}
	if exists(root, debianBundle) && exists(root, debianAnchor) {
		if _, err := t.linkHash(root, cert, path.Base(hashLinkTarget), debianAnchor); err != nil {
			errs = append(errs, fmt.Errorf("linking the sandbox CA into %s: %w", hashDir, err))
		}
	}
	made := map[string]bool{}
	for _, r := range roots {
		paths, err := t.anchorRoot(root, r, debian, fedora)
		for _, p := range paths {
			made[p] = true
			next = append(next, recordLine{sum: r.sum, kind: kindFile, path: p})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("adding the [network] trust root %q: %w", r.cert.Subject, err))
		}
	}
	// A listed root's file this start did not make again (the layout
	// changed under it) goes too.
	next = append(next, t.removeFiles(root, rec, func(l recordLine) bool { return current[l.sum] && !made[l.path] }, &errs)...)
	if err := t.writeRecord(root, rec, next); err != nil {
		errs = append(errs, fmt.Errorf("writing %s: %w", trustRecord, err))
	}
	return t, errors.Join(errs...)
}

// parseMoatCA reads the first PEM block of b, which must be a moat CA, and
// returns what follows it.
func parseMoatCA(b []byte) (*x509.Certificate, []byte, error) {
	block, rest := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, nil, errors.New("reading the sandbox CA: no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the sandbox CA: %w", err)
	}
	// installCA removes every moat CA from the bundles before adding this
	// one, so it must be one: anything else would pile up.
	if !tlsca.IsMoatCA(cert) {
		return nil, nil, errors.New("the sandbox CA is not a moat CA")
	}
	return cert, rest, nil
}

// addToBundle puts caPEM and the roots into the bundle at real (resolved,
// in the guest), once per file, after removing the roots in drop, and
// reports whether the bundle holds other roots too and which of roots it
// added (those the bundle did not hold already). seen maps the bundles
// done to their others.
func (t *trust) addToBundle(root, real string, caPEM []byte, roots []extraRoot, drop map[[32]byte]bool, seen map[string]bool) (others bool, added []extraRoot, err error) {
	if others, ok := seen[real]; ok {
		return others, nil, nil // written already, under another name
	}
	old, err := os.ReadFile(filepath.Join(root, real))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, nil, err
	}
	merged, others, added := mergeBundle(old, caPEM, roots, drop)
	seen[real] = others
	if bytes.Equal(merged, old) {
		return others, added, nil
	}
	if err := replaceFile(filepath.Join(root, real), merged); err != nil {
		return false, nil, err
	}
	t.changed = append(t.changed, real)
	return others, added, nil
}

// mergeBundle returns bundle without any moat CA and without the roots
// whose SHA-256 is in drop (each with its header line, if it has one),
// with caPEM appended under bundleHeader, and after it, under trustHeader,
// those of roots the bundle does not hold by then; everything else is kept
// byte for byte. others reports whether certificates that are not moat
// CAs remain; added is the roots appended.
func mergeBundle(bundle, caPEM []byte, roots []extraRoot, drop map[[32]byte]bool) (merged []byte, others bool, added []extraRoot) {
	const begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
	var out, buf []byte
	held := make([]bool, len(roots)) // the image's own copy of a root
	keepFrom := 0                    // start of the text not yet copied to out
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
			if prevLine >= 0 {
				if h := string(bundle[prevLine:off]); h == bundleHeader || h == trustHeader {
					blockStart = prevLine
				}
			}
		case string(line) == end && blockStart >= 0:
			blockEnd := off + lineEnd
			var der []byte
			buf, der = decodeBlock(bundle[bodyStart:off], buf)
			// Hashed only when there is something to drop: init runs
			// this at every start, and mostly there is not.
			if isMoatDER(der) || (len(drop) > 0 && drop[sha256.Sum256(der)]) {
				out = append(out, bundle[keepFrom:blockStart]...)
				keepFrom = blockEnd
			} else {
				others = true
				for i, r := range roots {
					held[i] = held[i] || bytes.Equal(der, r.cert.Raw)
				}
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
	out = append(out, caPEM...)
	for i, r := range roots {
		if held[i] {
			continue
		}
		if len(added) == 0 {
			out = append(out, trustHeader...)
		}
		out = append(out, r.pem...)
		added = append(added, r)
	}
	return out, others, added
}

// decodeBlock decodes the base64 body of a PEM certificate block into buf
// (returned for reuse) and returns the DER, nil when it is not base64. It
// is on init's path at every start, for each of a bundle's ~140 roots: the
// body is decoded directly (base64 skips the line breaks), not by
// pem.Decode, which took most of the time.
func decodeBlock(body, buf []byte) ([]byte, []byte) {
	n := base64.StdEncoding.DecodedLen(len(body))
	buf = slices.Grow(buf[:0], n)[:n]
	n, err := base64.StdEncoding.Decode(buf, body)
	if err != nil {
		return buf, nil
	}
	return buf, buf[:n]
}

// isMoatDER reports whether der is a moat CA. A byte search turns away all
// but moat CAs before any certificate is parsed.
func isMoatDER(der []byte) bool {
	if !bytes.Contains(der, []byte("moat")) {
		return false
	}
	cert, err := x509.ParseCertificate(der)
	return err == nil && tlsca.IsMoatCA(cert)
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

// linkHash makes OpenSSL's hashed directory find cert: name (moat.pem for
// the CA) links to its anchor and <subject hash>.N to name, the very links
// update-ca-certificates would make, so its next run agrees with them.
// Links, not copies: a CA that changes needs only the anchor rewritten.
// It returns the links it made or found right (resolved, in the guest):
// name's, and <hash>.N's unless a link of the image's own already leads
// to cert (a trust root the image ships).
func (t *trust) linkHash(root string, cert *x509.Certificate, name, anchor string) ([]string, error) {
	dir, _, err := resolveIn(root, hashDir)
	if err != nil {
		return nil, err
	}
	links := []string{path.Join(dir, name)}
	if err := t.symlink(root, links[0], anchor); err != nil {
		return nil, err
	}
	h, err := subjectHash(cert.RawSubject)
	if err != nil {
		return links, err
	}
	// OpenSSL tries <hash>.0, .1, ... until one is missing; another root
	// with the same subject hash may hold .0 already. The bound is
	// generous: a collision between two roots is already rare.
	for i := range 10 {
		link := path.Join(dir, fmt.Sprintf("%08x.%d", h, i))
		target, err := os.Readlink(filepath.Join(root, link))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return append(links, link), t.symlink(root, link, name)
		case err == nil && target == name:
			return append(links, link), nil
		}
		c, err := readCert(root, link)
		switch {
		case err != nil:
		case tlsca.IsMoatCA(c) && tlsca.IsMoatCA(cert):
			// An older moat CA's link or copy, by another name.
			return append(links, link), t.symlink(root, link, name)
		case c.Equal(cert):
			return links, nil
		}
	}
	return links, fmt.Errorf("no free name for %08x.N", h)
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
