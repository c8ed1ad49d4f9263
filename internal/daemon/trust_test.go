package daemon

import (
	"bytes"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moat.dev/moat/internal/tlsca"
)

// The guest's ca.pem is the sandbox CA, then each trust file's
// certificates, and nothing else from those files.
func TestGuestTrust(t *testing.T) {
	dir := t.TempDir()
	sandbox, err := tlsca.LoadOrCreate(filepath.Join(dir, "sandbox"))
	if err != nil {
		t.Fatal(err)
	}
	corp, err := tlsca.LoadOrCreate(filepath.Join(dir, "corp"))
	if err != nil {
		t.Fatal(err)
	}
	key := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("never copied")})
	file := filepath.Join(dir, "corp.pem")
	os.WriteFile(file, append(append([]byte("# the corp root\n"), key...), corp.CertPEM()...), 0o644)

	got, err := guestTrust(sandbox.CertPEM(), []string{file})
	if err != nil {
		t.Fatal(err)
	}
	if want := append(sandbox.CertPEM(), corp.CertPEM()...); !bytes.Equal(got, want) {
		t.Errorf("guestTrust =\n%s\nwant the sandbox CA, then the corp root:\n%s", got, want)
	}
	if got, err := guestTrust(sandbox.CertPEM(), nil); err != nil || !bytes.Equal(got, sandbox.CertPEM()) {
		t.Errorf("guestTrust without trust files = %q, %v; want the CA alone", got, err)
	}
	empty := filepath.Join(dir, "empty.pem")
	os.WriteFile(empty, key, 0o644)
	for _, f := range []string{empty, filepath.Join(dir, "missing.pem")} {
		if _, err := guestTrust(sandbox.CertPEM(), []string{file, f}); err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("guestTrust with %s: %v; want an error naming it", f, err)
		}
	}
}
