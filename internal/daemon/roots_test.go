package daemon

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moat.dev/moat/internal/tlsca"
)

// Without extra roots nothing is loaded at start: nil tells crypto/tls to
// verify against the host's roots when it first needs them.
func TestUpstreamRootsNoneConfiguredLoadsNothing(t *testing.T) {
	pool, err := upstreamRoots(nil)
	if err != nil || pool != nil {
		t.Fatalf("upstreamRoots(nil) = %v, %v; want nil, nil", pool, err)
	}
}

// A trust file adds its roots: a leaf of that CA verifies.
func TestUpstreamRootsTrustFile(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsca.LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "extra.pem")
	if err := os.WriteFile(file, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	pool, err := upstreamRoots([]string{file})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf("upstream.test")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(leaf.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "upstream.test", Roots: pool}); err != nil {
		t.Fatalf("a leaf of the trusted file's CA: %v", err)
	}
}

// A trust file that holds no certificate stops the start, naming it.
func TestUpstreamRootsBadTrustFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "empty.pem")
	os.WriteFile(file, []byte("not a certificate\n"), 0o644)
	_, err := upstreamRoots([]string{file})
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("err = %v; want one naming %s", err, file)
	}
	_, err = upstreamRoots([]string{file + ".missing"})
	if err == nil || !strings.Contains(err.Error(), file+".missing") {
		t.Fatalf("err = %v; want one naming the missing file", err)
	}
}
