package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// testCertPEM is a freshly made self-signed CA certificate in PEM.
func testCertPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "moat test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestTrust checks network.trust: paths are anchored at the file like
// every other host path, and a file that is missing or holds no usable
// certificate is an error naming file, line and key at load time.
func TestTrust(t *testing.T) {
	dir := t.TempDir()
	cert := testCertPEM(t)
	write := func(name string, data []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	one := write("certs/corp.pem", cert)
	bundle := write("bundle.pem", append(append([]byte("# corporate roots\n"), cert...), testCertPEM(t)...))
	keyOnly := write("key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1, 2, 3}}))
	broken := write("broken.pem", append(append([]byte{}, cert...), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})...))
	text := write("text.pem", []byte("hello\n"))
	moat := filepath.Join(dir, "moat.toml")

	tests := []struct {
		name    string
		doc     string
		want    []string // Trust, when no error is wanted
		wantErr []string // substrings of the error
	}{
		{"relative", `network.trust = ["certs/corp.pem"]`, []string{one}, nil},
		{"dot relative and absolute, once each", `network.trust = ["./certs/corp.pem", "` + bundle + `", "` + one + `"]`, []string{one, bundle}, nil},
		{"keys beside certificates are ignored", `network.trust = ["` + bundle + `"]`, []string{bundle}, nil},
		{"missing", "[network]\ntrust = [\"certs/corp.pem\",\n  \"nope.pem\"]",
			nil, []string{moat + ":3:3: network.trust[1]: reading " + filepath.Join(dir, "nope.pem") + ": no such file or directory; write the path of a PEM file"}},
		{"directory", `network.trust = ["certs"]`, nil, []string{"network.trust[0]: reading " + filepath.Join(dir, "certs") + ":", "is a directory"}},
		{"no certificate", `network.trust = ["key.pem"]`, nil, []string{keyOnly + " holds no PEM certificate"}},
		{"not PEM", `network.trust = ["text.pem"]`, nil, []string{moat + ":1:18: network.trust[0]: " + text + " holds no PEM certificate"}},
		{"broken certificate", `network.trust = ["broken.pem"]`, nil, []string{"network.trust[0]: certificate 2 in " + broken + " does not parse"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse(moat, []byte(tt.doc))
			if tt.wantErr != nil {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("got %v, want an ErrInvalid error", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error\n  %v\nwant it to contain\n  %s", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := f.Network.Trust; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Trust = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSecretQuery(t *testing.T) {
	for _, q := range []string{"key", "api-key", "access_token", "X.Token", "k[]"} {
		f, err := parse(t, "[secrets.K]\nfrom = \"env:K\"\nhosts = [\"x\"]\nquery = \""+q+"\"")
		if err != nil {
			t.Errorf("query %q: %v", q, err)
			continue
		}
		if got := f.Secrets["K"].Query; got != q {
			t.Errorf("query %q: got %q", q, got)
		}
	}
}
