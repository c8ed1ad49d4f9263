package guest

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"moat.dev/moat/internal/tlsca"
)

// The [network] trust roots in the guest's stores (see truststore.go for
// the CA they follow): parsed from the file the daemon writes, anchored
// one file per root, and recorded, so that a later start removes exactly
// what this one added.

// trustRecord lists, one "<sha256 of the root> bundle|file <path>" a line,
// every root init added to a bundle and every file or link it made for
// one, so that a later start removes exactly those when the root is gone
// from the configuration, and never a root the image ships itself. The
// format is read back by later moat versions: fields only added.
const trustRecord = "/var/lib/moat/trust-roots"

// trustPrefix starts the name of every file init makes for a trust root;
// it removes only files so named (or links to them), whatever the record
// says.
const trustPrefix = "moat-trust-"

// extraRoot is one root certificate of [network] trust.
type extraRoot struct {
	cert *x509.Certificate
	sum  [32]byte // SHA-256 of the DER
	pem  []byte
}

// name is the root's file name without extension, the same at every start.
func (r extraRoot) name() string { return trustPrefix + hex.EncodeToString(r.sum[:8]) }

// parseRoots reads the [network] trust roots that follow the CA. A block
// that is not a certificate is skipped (the daemon writes none), a moat CA
// too: the bundles lose every moat CA at the next start, so it would come
// and go. A root listed twice is added once.
func parseRoots(b []byte) ([]extraRoot, []error) {
	var roots []extraRoot
	var errs []error
	seen := map[[32]byte]bool{}
	for block, rest := pem.Decode(b); block != nil; block, rest = pem.Decode(rest) {
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			errs = append(errs, fmt.Errorf("parsing a [network] trust root: %w", err))
			continue
		}
		sum := sha256.Sum256(c.Raw)
		if tlsca.IsMoatCA(c) || seen[sum] {
			continue
		}
		seen[sum] = true
		roots = append(roots, extraRoot{cert: c, sum: sum, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})})
	}
	return roots, errs
}

// anchorRoot writes a trust root's anchors, where the distribution's tools
// rebuild the bundles from, and links it into OpenSSL's hashed directory,
// as installCA does for the CA. One file per root: OpenSSL's rehash skips
// a file with more than one certificate. It returns the paths it made or
// found right.
func (t *trust) anchorRoot(root string, r extraRoot, debian, fedora bool) ([]string, error) {
	var made []string
	var errs []error
	if debian {
		anchor := path.Join(debianAnchorDir, r.name()+".crt")
		if err := t.writeIfChanged(root, anchor, r.pem); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", anchor, err))
		} else {
			made = append(made, anchor)
			if exists(root, debianBundle) {
				links, err := t.linkHash(root, r.cert, r.name()+".pem", anchor)
				made = append(made, links...)
				if err != nil {
					errs = append(errs, fmt.Errorf("linking it into %s: %w", hashDir, err))
				}
			}
		}
	}
	if fedora {
		anchor := path.Join(path.Dir(fedoraAnchor), r.name()+".pem")
		if err := t.writeIfChanged(root, anchor, r.pem); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", anchor, err))
		} else {
			made = append(made, anchor)
		}
	}
	return made, errors.Join(errs...)
}

// Kinds of trustRecord line (frozen: the record outlives the moat that
// wrote it).
const (
	kindBundle = "bundle" // the root was added to the bundle at path (resolved)
	kindFile   = "file"   // init made the file or link at path for the root
)

// recordLine is one line of trustRecord.
type recordLine struct {
	sum  [32]byte
	kind string
	path string
}

type record []recordLine

// readRecord reads trustRecord; nil when there is none, which is every
// start of a sandbox that never listed a root: one failed open.
func readRecord(root string) (record, error) {
	b, err := os.ReadFile(filepath.Join(root, trustRecord))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", trustRecord, err)
	}
	var rec record
	for l := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimRight(l, "\n"), " ", 3)
		if len(f) != 3 || (f[1] != kindBundle && f[1] != kindFile) || !path.IsAbs(f[2]) {
			continue // not ours to guess at
		}
		sum, err := hex.DecodeString(f[0])
		if err != nil || len(sum) != sha256.Size {
			continue
		}
		rec = append(rec, recordLine{sum: [32]byte(sum), kind: f[1], path: path.Clean(f[2])})
	}
	return rec, nil
}

// bundles is, for each bundle, the roots an earlier start added to it.
func (rec record) bundles() map[string]map[[32]byte]bool {
	if len(rec) == 0 {
		return nil
	}
	m := map[string]map[[32]byte]bool{}
	for _, l := range rec {
		if l.kind != kindBundle {
			continue
		}
		if m[l.path] == nil {
			m[l.path] = map[[32]byte]bool{}
		}
		m[l.path][l.sum] = true
	}
	return m
}

// bundleLines are the record's lines for the bundle at real.
func (rec record) bundleLines(real string) []recordLine {
	var out []recordLine
	for _, l := range rec {
		if l.kind == kindBundle && l.path == real {
			out = append(out, l)
		}
	}
	return out
}

func bundleLines(real string, added []extraRoot) []recordLine {
	var out []recordLine
	for _, r := range added {
		out = append(out, recordLine{sum: r.sum, kind: kindBundle, path: real})
	}
	return out
}

// removeFiles removes the files and links the record lists for which
// stale holds, and returns the lines of those it could not remove, for
// the next start to try again. It removes only a file named trustPrefix…
// or a link to one: a hash link a later rehash gave to another root is
// left alone.
func (t *trust) removeFiles(root string, rec record, stale func(recordLine) bool, errs *[]error) []recordLine {
	var kept []recordLine
	for _, l := range rec {
		if l.kind != kindFile || !stale(l) {
			continue
		}
		dir, _, err := resolveIn(root, path.Dir(l.path))
		if err == nil {
			err = t.removeOurs(root, path.Join(dir, path.Base(l.path)))
		}
		if err != nil {
			*errs = append(*errs, fmt.Errorf("removing %s, made for a [network] trust root no longer listed: %w", l.path, err))
			kept = append(kept, l)
		}
	}
	return kept
}

func (t *trust) removeOurs(root, p string) error {
	full := filepath.Join(root, p)
	fi, err := os.Lstat(full)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	ours := strings.HasPrefix(path.Base(p), trustPrefix)
	if !ours && fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(full)
		ours = err == nil && strings.HasPrefix(path.Base(target), trustPrefix)
	}
	if !ours {
		return nil
	}
	if err := os.Remove(full); err != nil {
		return err
	}
	t.changed = append(t.changed, p)
	return nil
}

// writeRecord writes next as trustRecord, unless it holds that already;
// with nothing to record, it removes the record an earlier start wrote.
func (t *trust) writeRecord(root string, rec record, next []recordLine) error {
	if len(next) == 0 {
		if len(rec) == 0 {
			return nil
		}
		err := os.Remove(filepath.Join(root, trustRecord))
		if err == nil {
			t.changed = append(t.changed, trustRecord)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	lines := make([]string, 0, len(next))
	for _, l := range next {
		lines = append(lines, hex.EncodeToString(l.sum[:])+" "+l.kind+" "+l.path+"\n")
	}
	sort.Strings(lines)
	lines = slices.Compact(lines)
	return t.writeIfChanged(root, trustRecord, []byte(strings.Join(lines, "")))
}
