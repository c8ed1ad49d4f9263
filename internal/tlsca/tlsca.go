// Package tlsca is a sandbox's own certificate authority: the gate presents
// leaves it mints when it must read a guest's TLS (a host with a bound
// secret, method/path rules, or inspect = true), and the guest trusts it
// through its system store (docs/credentials.md).
//
// One CA per sandbox, not one per host user, so that a key leaked from one
// sandbox's state cannot impersonate hosts to any other sandbox. Its key
// stays in the host's state dir (0600) and never enters the guest; only
// ca.pem is copied there.
//
// The CA cannot carry NameConstraints: the gate mints for whatever host the
// guest dials. What bounds it instead is that exactly one guest trusts it.
package tlsca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// File names in the CA's directory: frozen, since a sandbox's guest keeps
// trusting the CA across down/up only if later starts find it again.
const (
	CertFile = "ca.pem"     // 0644: also copied into the guest
	KeyFile  = "ca-key.pem" // 0600: never leaves the host
)

// Subject fields of every moat CA: frozen. The guest's init finds moat CAs
// in a trust bundle by them (IsMoatCA), to replace an older sandbox CA
// rather than pile them up.
const (
	subjectOrg  = "moat"
	subjectUnit = "sandbox CA"
)

// caValidity is 10 years: the CA lives as long as the sandbox, and every
// rotation is a moment where the guest's processes that loaded the old
// trust store (or a keystore the user imported it into) stop working. The
// key's exposure is bounded by where it lives (0600 in the state dir), not
// by expiry. LoadOrCreate still replaces a CA within caRenewBefore of its
// end, so a sandbox that outlives it keeps working after its next start.
const (
	caValidity    = 10 * 365 * 24 * time.Hour
	caRenewBefore = 30 * 24 * time.Hour
)

// clockSkew backdates NotBefore: a guest whose clock runs behind the host's
// (a restored snapshot, a paused VM) would otherwise reject a brand new
// certificate as not yet valid.
const clockSkew = time.Hour

// CA is a loaded sandbox CA. It is safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	now     func() time.Time
	leaves  leafCache
}

// LoadOrCreate returns the CA kept in dir (ca.pem and ca-key.pem), creating
// it on first use. dir must be host-only: the key is written there.
func LoadOrCreate(dir string) (*CA, error) {
	return loadOrCreate(dir, time.Now)
}

func loadOrCreate(dir string, now func() time.Time) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	ca, err := load(certPath, keyPath, now)
	switch {
	case err == nil && now().Add(caRenewBefore).Before(ca.cert.NotAfter):
		return ca, nil
	case err == nil:
		// Expired or about to: a new CA, which the guest's init puts in
		// place of the old one on the next start.
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating CA directory: %w", err)
	}
	ca, keyPEM, err := create(filepath.Base(dir), now)
	if err != nil {
		return nil, err
	}
	// The key first: a crash between the two renames leaves a key with no
	// certificate, which load treats as "no CA yet" (nothing trusts a key
	// alone), never a certificate the guest may trust whose key is gone.
	if err := writeAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("writing CA key: %w", err)
	}
	if err := writeAtomic(certPath, ca.certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("writing CA certificate: %w", err)
	}
	return ca, nil
}

// load reads the pair. It returns an error wrapping fs.ErrNotExist only
// when there is nothing to keep: no certificate at all.
func load(certPath, keyPath string, now func() time.Time) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("reading CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		// Not "no CA yet": the certificate exists and the guest may trust
		// it, so quietly making a new pair would hide whatever removed the
		// key. (A crash while creating leaves the opposite: a key alone.)
		return nil, damaged(keyPath, errors.New("missing, but the certificate is there"))
	}
	if err != nil {
		return nil, fmt.Errorf("reading CA key: %w", err)
	}
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, damaged(certPath, err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, damaged(keyPath, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, damaged(keyPath, errors.New("the key does not match "+certPath))
	}
	if !isMoatCA(cert) {
		return nil, damaged(certPath, errors.New("not a moat sandbox CA"))
	}
	return &CA{cert: cert, certPEM: certPEM, key: key, now: now}, nil
}

func damaged(path string, err error) error {
	dir := filepath.Dir(path)
	return fmt.Errorf("loading sandbox CA: %s: %w; remove %s and %s to make a new CA, or run moat destroy",
		path, err, filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
}

func parseCert(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return x509.ParseCertificate(block.Bytes)
}

func parseKey(b []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, errors.New("not an ECDSA P-256 key")
	}
	return ec, nil
}

func create(name string, now func() time.Time) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating CA key: %w", err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, nil, err
	}
	t := now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:         "moat sandbox CA " + name,
			Organization:       []string{subjectOrg},
			OrganizationalUnit: []string{subjectUnit},
		},
		NotBefore:             t.Add(-clockSkew),
		NotAfter:              t.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// Leaves only, never an intermediate.
		MaxPathLen:     0,
		MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing new CA certificate: %w", err)
	}
	p8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding CA key: %w", err)
	}
	ca := &CA{
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:     key,
		now:     now,
	}
	return ca, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), nil
}

// randSerial is 128 random bits: RFC 5280 allows up to 20 octets, and
// unpredictable serials are what CAs use against chosen-prefix collisions.
func randSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil // never zero
}

// writeAtomic replaces path with b. The temporary file is created 0600
// (os.CreateTemp's mode) and only then widened to mode, so a key is never
// readable by others, even for an instant, and a reader never sees half a
// file.
func writeAtomic(path string, b []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename, a no-op
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// CertPEM is the CA certificate, PEM-encoded: what the guest trusts.
func (c *CA) CertPEM() []byte { return bytes.Clone(c.certPEM) }

// Cert is the parsed CA certificate. Callers must not modify it.
func (c *CA) Cert() *x509.Certificate { return c.cert }

// IsMoatCA reports whether cert is a moat sandbox CA, this sandbox's or any
// other's (the guest's init replaces an older one it finds in a bundle).
func IsMoatCA(cert *x509.Certificate) bool { return isMoatCA(cert) }

func isMoatCA(cert *x509.Certificate) bool {
	return cert.IsCA &&
		slices.Equal(cert.Subject.Organization, []string{subjectOrg}) &&
		slices.Equal(cert.Subject.OrganizationalUnit, []string{subjectUnit})
}
