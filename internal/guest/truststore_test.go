package guest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/tlsca"
)

// newCA is a real sandbox CA, as the daemon makes it.
func newCA(t *testing.T) *tlsca.CA {
	t.Helper()
	ca, err := tlsca.LoadOrCreate(filepath.Join(t.TempDir(), "api"))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// systemRoots stands in for a distribution's bundle: two self-signed roots
// between comments, as ca-certificates and certifi write them.
func systemRoots(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for i := range 2 {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 1)), Subject: pkix.Name{CommonName: fmt.Sprintf("Root %d", i)},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "# Root %d\n", i)
		pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	return b.String()
}

// layout writes files under root: a value starting with "-> " is a
// symlink, one ending in "/" a directory, anything else a file's content.
func layout(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, v := range files {
		full := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		var err error
		switch {
		case strings.HasPrefix(v, "-> "):
			err = os.Symlink(strings.TrimPrefix(v, "-> "), full)
		case p[len(p)-1] == '/':
			err = os.MkdirAll(full, 0o755)
		default:
			err = os.WriteFile(full, []byte(v), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// certsIn decodes every certificate in the file at guest path p under root,
// through symlinks as the guest would follow them (TestResolveIn).
func certsIn(t *testing.T, root, p string) []*x509.Certificate {
	t.Helper()
	real, _, err := resolveIn(root, p)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, real))
	if err != nil {
		t.Fatalf("reading %s: %v", p, err)
	}
	var certs []*x509.Certificate
	for block, rest := pem.Decode(b); block != nil; block, rest = pem.Decode(rest) {
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		certs = append(certs, c)
	}
	return certs
}

// countCA counts ca's certificate and other moat CAs in certs, and the rest.
func countCA(certs []*x509.Certificate, ca *tlsca.CA) (this, otherMoat, rest int) {
	for _, c := range certs {
		switch {
		case c.Equal(ca.Cert()):
			this++
		case tlsca.IsMoatCA(c):
			otherMoat++
		default:
			rest++
		}
	}
	return
}

func TestInstallCALayouts(t *testing.T) {
	roots := systemRoots(t)
	tests := []struct {
		name       string
		files      map[string]string
		wantBundle string            // trust.bundle
		withRoots  []string          // files that must hold the 2 roots and the CA once
		caOnly     []string          // files that must hold the CA alone
		links      map[string]string // symlinks that must exist, and their targets
		absent     []string
	}{{
		name: "debian",
		files: map[string]string{
			"/etc/ssl/certs/ca-certificates.crt": roots,
			"/usr/local/share/ca-certificates/":  "",
			"/etc/ssl/certs/0123abcd.0":          "-> Root_0.pem",
		},
		wantBundle: "/etc/ssl/certs/ca-certificates.crt",
		withRoots:  []string{"/etc/ssl/certs/ca-certificates.crt"},
		caOnly:     []string{"/usr/local/share/ca-certificates/moat.crt", "/etc/ssl/certs/moat.pem"},
		links: map[string]string{
			"/etc/ssl/certs/moat.pem":   "/usr/local/share/ca-certificates/moat.crt",
			"/etc/ssl/certs/0123abcd.0": "Root_0.pem",
		},
		absent: []string{"/etc/pki"},
	}, {
		name: "alpine",
		files: map[string]string{
			"/etc/ssl/certs/ca-certificates.crt": roots,
			"/etc/ssl/cert.pem":                  "-> certs/ca-certificates.crt",
		},
		wantBundle: "/etc/ssl/certs/ca-certificates.crt",
		withRoots:  []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/cert.pem"},
		caOnly:     []string{"/usr/local/share/ca-certificates/moat.crt"},
		links:      map[string]string{"/etc/ssl/cert.pem": "certs/ca-certificates.crt"},
	}, {
		name: "fedora",
		files: map[string]string{
			"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem": roots,
			"/etc/pki/ca-trust/source/anchors/":                 "",
			"/etc/pki/tls/certs/ca-bundle.crt":                  "-> /etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
			"/etc/pki/tls/cert.pem":                             "-> /etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
			"/etc/ssl/certs":                                    "-> /etc/pki/tls/certs",
		},
		wantBundle: "/etc/pki/tls/certs/ca-bundle.crt",
		withRoots:  []string{"/etc/pki/tls/certs/ca-bundle.crt", "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/pki/tls/cert.pem"},
		caOnly:     []string{"/etc/pki/ca-trust/source/anchors/moat.pem"},
		links: map[string]string{
			"/etc/pki/tls/certs/ca-bundle.crt": "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
			"/etc/ssl/certs":                   "/etc/pki/tls/certs",
		},
		absent: []string{"/usr/local/share/ca-certificates", "/etc/pki/tls/certs/ca-certificates.crt", "/etc/pki/tls/certs/moat.pem"},
	}, {
		// No roots at all: the CA alone in the Debian path, and no
		// REQUESTS_CA_BUNDLE (it would replace certifi's roots).
		name:       "no bundle",
		files:      map[string]string{"/etc/": ""},
		wantBundle: "",
		caOnly:     []string{"/etc/ssl/certs/ca-certificates.crt", "/usr/local/share/ca-certificates/moat.crt", "/etc/ssl/certs/moat.pem"},
		links:      map[string]string{"/etc/ssl/certs/moat.pem": "/usr/local/share/ca-certificates/moat.crt"},
	}, {
		// A Debian bundle that is a dangling symlink is written through.
		name: "dangling bundle link",
		files: map[string]string{
			"/etc/ssl/certs/ca-certificates.crt": "-> /var/lib/certs/bundle.crt",
		},
		wantBundle: "",
		caOnly:     []string{"/etc/ssl/certs/ca-certificates.crt", "/var/lib/certs/bundle.crt"},
		links:      map[string]string{"/etc/ssl/certs/ca-certificates.crt": "/var/lib/certs/bundle.crt"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			layout(t, root, tt.files)
			ca := newCA(t)
			got, err := installCA(root, ca.CertPEM())
			if err != nil {
				t.Fatal(err)
			}
			if got.bundle != tt.wantBundle {
				t.Errorf("bundle %q, want %q", got.bundle, tt.wantBundle)
			}
			for _, p := range tt.withRoots {
				if this, other, rest := countCA(certsIn(t, root, p), ca); this != 1 || other != 0 || rest != 2 {
					t.Errorf("%s: CA %d times, other moat CAs %d, roots %d; want 1, 0, 2", p, this, other, rest)
				}
			}
			for _, p := range tt.caOnly {
				if this, other, rest := countCA(certsIn(t, root, p), ca); this != 1 || other+rest != 0 {
					t.Errorf("%s: CA %d times, %d others; want the CA alone", p, this, other+rest)
				}
			}
			for p, want := range tt.links {
				if got, err := os.Readlink(filepath.Join(root, p)); err != nil || got != want {
					t.Errorf("%s: link to %q (%v), want a link to %q", p, got, err, want)
				}
			}
			for _, p := range tt.absent {
				if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
					t.Errorf("%s was created", p)
				}
			}
			// A client that trusts the bundle accepts the gate's leaves.
			if tt.wantBundle != "" {
				pool := x509.NewCertPool()
				for _, c := range certsIn(t, root, tt.wantBundle) {
					pool.AddCert(c)
				}
				leaf, _ := ca.Leaf("api.example.com")
				if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.example.com"}); err != nil {
					t.Errorf("verifying a leaf against %s: %v", tt.wantBundle, err)
				}
			}
		})
	}
}

// TestInstallCAHashLink: OpenSSL's hashed directory finds the CA under its
// subject hash, and a root that already holds <hash>.0 keeps it.
func TestInstallCAHashLink(t *testing.T) {
	ca := newCA(t)
	h, err := subjectHash(ca.Cert().RawSubject)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	taken := fmt.Sprintf("/etc/ssl/certs/%08x.0", h)
	layout(t, root, map[string]string{
		"/etc/ssl/certs/ca-certificates.crt": systemRoots(t),
		taken:                                "-> Root_0.pem",
	})
	if _, err := installCA(root, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink(filepath.Join(root, taken)); got != "Root_0.pem" {
		t.Errorf("%s now links to %q; another root's link was taken", taken, got)
	}
	next := fmt.Sprintf("/etc/ssl/certs/%08x.1", h)
	if got, _ := os.Readlink(filepath.Join(root, next)); got != "moat.pem" {
		t.Errorf("%s links to %q, want moat.pem", next, got)
	}
	if this, _, _ := countCA(certsIn(t, root, next), ca); this != 1 {
		t.Errorf("%s does not lead to the CA", next)
	}
}

// TestInstallCAIdempotent: the upper layer persists across down/up; a
// second start changes nothing, a third neither.
func TestInstallCAIdempotent(t *testing.T) {
	for _, name := range []string{"debian", "fedora", "none"} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			switch name {
			case "debian":
				layout(t, root, map[string]string{"/etc/ssl/certs/ca-certificates.crt": systemRoots(t), "/etc/ssl/cert.pem": "-> certs/ca-certificates.crt"})
			case "fedora":
				layout(t, root, map[string]string{
					"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem": systemRoots(t),
					"/etc/pki/tls/certs/ca-bundle.crt":                  "-> /etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
				})
			}
			ca := newCA(t)
			first, err := installCA(root, ca.CertPEM())
			if err != nil || len(first.changed) == 0 {
				t.Fatalf("first install: changed %v, %v", first.changed, err)
			}
			before := snapshot(t, root)
			for i := range 2 {
				again, err := installCA(root, ca.CertPEM())
				if err != nil {
					t.Fatal(err)
				}
				if len(again.changed) != 0 || again.bundle != first.bundle {
					t.Errorf("start %d changed %v (bundle %q, want %q)", i+2, again.changed, again.bundle, first.bundle)
				}
				if after := snapshot(t, root); !maps.Equal(before, after) {
					t.Errorf("start %d changed the files", i+2)
				}
			}
		})
	}
}

// TestInstallCARotation: a new CA replaces the old one everywhere, also
// where update-ca-certificates copied the old one without its header.
func TestInstallCARotation(t *testing.T) {
	root := t.TempDir()
	roots := systemRoots(t)
	layout(t, root, map[string]string{"/etc/ssl/certs/ca-certificates.crt": roots})
	old, cur := newCA(t), newCA(t)
	if _, err := installCA(root, old.CertPEM()); err != nil {
		t.Fatal(err)
	}
	// What update-ca-certificates leaves: the anchor among the roots,
	// no header, not at the end.
	bundle := filepath.Join(root, "/etc/ssl/certs/ca-certificates.crt")
	os.WriteFile(bundle, []byte(string(old.CertPEM())+roots), 0o644)
	got, err := installCA(root, cur.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/etc/ssl/certs/ca-certificates.crt", "/usr/local/share/ca-certificates/moat.crt", "/etc/ssl/certs/moat.pem"} {
		certs := certsIn(t, root, p)
		if this, other, _ := countCA(certs, cur); this != 1 || other != 0 {
			t.Errorf("%s: new CA %d times, old %d; want 1, 0", p, this, other)
		}
	}
	if _, _, rest := countCA(certsIn(t, root, "/etc/ssl/certs/ca-certificates.crt"), cur); rest != 2 {
		t.Errorf("the bundle keeps %d roots, want 2", rest)
	}
	if got.bundle == "" {
		t.Error("no bundle for REQUESTS_CA_BUNDLE")
	}
	if b, _ := os.ReadFile(bundle); !strings.HasPrefix(string(b), roots) {
		t.Error("the roots' text was not kept as it was")
	}
}

func TestInstallCARefusesOtherCerts(t *testing.T) {
	roots := systemRoots(t)
	for _, ca := range []string{"", "junk", roots} {
		if _, err := installCA(t.TempDir(), []byte(ca)); err == nil {
			t.Errorf("installed %.20q as the sandbox CA", ca)
		}
	}
}

func TestMergeBundle(t *testing.T) {
	ca := newCA(t)
	caPEM := string(ca.CertPEM())
	other := newCA(t)
	roots := systemRoots(t)
	tests := []struct {
		name, in, want string
		others         bool
	}{
		{"empty", "", bundleHeader + caPEM, false},
		{"roots", roots, roots + bundleHeader + caPEM, true},
		{"no final newline", "# comment", "# comment\n" + bundleHeader + caPEM, false},
		{"already there", roots + bundleHeader + caPEM, roots + bundleHeader + caPEM, true},
		{"older CA with header", roots + bundleHeader + string(other.CertPEM()), roots + bundleHeader + caPEM, true},
		{"older CA between roots", "# a\n" + string(other.CertPEM()) + roots, "# a\n" + roots + bundleHeader + caPEM, true},
		{"CA alone", bundleHeader + caPEM, bundleHeader + caPEM, false},
		{"CRLF roots", strings.ReplaceAll(roots, "\n", "\r\n"), strings.ReplaceAll(roots, "\n", "\r\n") + bundleHeader + caPEM, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, others, _ := mergeBundle([]byte(tt.in), []byte(caPEM), nil, nil)
			if string(got) != tt.want || others != tt.others {
				t.Errorf("mergeBundle = %q, others %v\nwant %q, others %v", got, others, tt.want, tt.others)
			}
		})
	}
}

// TestSubjectHash: vectors from openssl x509 -subject_hash on certificates
// Go made with these subjects.
func TestSubjectHash(t *testing.T) {
	tests := []struct {
		subject string // RawSubject, hex
		want    uint32
	}{
		// O=moat, OU=sandbox CA, CN=moat sandbox CA api
		{"3042310d300b060355040a13046d6f617431133011060355040b130a73616e64626f78204341311c301a060355040313136d6f61742073616e64626f7820434120617069", 0x24c339d7},
		// C=DE, O="Example, Inc.", CN="  Mixed   CASE\tName  ": case, space
		{"3045310b300906035504061302444531163014060355040a130d4578616d706c652c20496e632e311e301c06035504030c1520204d6978656420202043415345094e616d652020", 0xddf9f6db},
		// O=ACME, CN="Grüße Ünïcode": non-ASCII is left as it is
		{"302b310d300b060355040a130441434d45311a301806035504030c114772c3bcc39f6520c39c6ec3af636f6465", 0xefb56eea},
	}
	for _, tt := range tests {
		raw, _ := hex.DecodeString(tt.subject)
		got, err := subjectHash(raw)
		if err != nil || got != tt.want {
			t.Errorf("subjectHash(%s) = %08x, %v; want %08x", tt.subject[:16], got, err, tt.want)
		}
	}
}

// TestSubjectHashSystemRoots checks subjectHash against every hash link
// c_rehash made on this machine, when it has a hashed directory.
func TestSubjectHashSystemRoots(t *testing.T) {
	links, _ := filepath.Glob("/etc/ssl/certs/????????.0")
	if len(links) == 0 {
		t.Skip("no hashed /etc/ssl/certs here; install ca-certificates to run this")
	}
	for _, l := range links {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		block, _ := pem.Decode(b)
		if block == nil {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			continue
		}
		got, err := subjectHash(c.RawSubject)
		if want := strings.TrimSuffix(filepath.Base(l), ".0"); err != nil || fmt.Sprintf("%08x", got) != want {
			t.Errorf("%s (%s): subjectHash %08x, %v; want %s", l, c.Subject, got, err, want)
		}
	}
}

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	layout(t, root, map[string]string{
		"/a/file":     "x",
		"/a/rel":      "-> file",
		"/a/abs":      "-> /a/file",
		"/a/up":       "-> ../a/./file",
		"/b":          "-> /a",
		"/a/dangling": "-> /nowhere/file",
		"/a/loop":     "-> loop",
		"/a/escape":   "-> ../../../../a/file",
	})
	tests := []struct {
		in, want string
		exists   bool
		err      bool
	}{
		{"/a/file", "/a/file", true, false},
		{"/a/rel", "/a/file", true, false},
		{"/a/abs", "/a/file", true, false},
		{"/a/up", "/a/file", true, false},
		{"/b/abs", "/a/file", true, false},
		{"/b/missing", "/a/missing", false, false},
		{"/a/dangling", "/nowhere/file", false, false},
		{"/a/escape", "/a/file", true, false}, // .. stops at the root, as in the guest
		{"/a/loop", "", false, true},
	}
	for _, tt := range tests {
		got, exists, err := resolveIn(root, tt.in)
		if got != tt.want || exists != tt.exists || (err != nil) != tt.err {
			t.Errorf("resolveIn(%s) = %q, %v, %v; want %q, %v, error %v", tt.in, got, exists, err, tt.want, tt.exists, tt.err)
		}
	}
}

func TestSessionEnv(t *testing.T) {
	base := []string{"PATH=/usr/bin", "LANG=C.UTF-8"}
	tests := []struct {
		name   string
		base   []string
		caFile string
		t      trust
		want   []string
	}{
		{"no CA", base, "", trust{bundle: "/etc/ssl/certs/ca-certificates.crt"}, base},
		{"CA and bundle", base, "/.moat/ca.pem", trust{bundle: "/etc/ssl/certs/ca-certificates.crt"}, []string{
			"NODE_EXTRA_CA_CERTS=/.moat/ca.pem",
			"REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
			"PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
			"PATH=/usr/bin", "LANG=C.UTF-8",
		}},
		{"CA without roots", base, "/.moat/ca.pem", trust{}, []string{
			"NODE_EXTRA_CA_CERTS=/.moat/ca.pem", "PATH=/usr/bin", "LANG=C.UTF-8",
		}},
		// The spec's own value comes later, so the agent keeps it.
		{"user's value last", []string{"PIP_CERT=/mine.pem"}, "/.moat/ca.pem", trust{bundle: "/b"}, []string{
			"NODE_EXTRA_CA_CERTS=/.moat/ca.pem", "REQUESTS_CA_BUNDLE=/b", "PIP_CERT=/b", "PIP_CERT=/mine.pem",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := sessionEnv(tt.base, tt.caFile, tt.t)
			if !slices.Equal(got, tt.want) {
				t.Errorf("sessionEnv = %q, want %q", got, tt.want)
			}
			for _, kv := range got {
				if strings.HasPrefix(kv, "SSL_CERT_FILE=") {
					t.Errorf("sets %s (docs/credentials.md)", kv)
				}
			}
		})
	}
}

// snapshot is every file's content or link target under root.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "-> " + target
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			out[rel] = fi.Mode().String() + " " + string(b)
		}
		return nil
	})
	return out
}

// trustRoot is a private CA as a [network] trust file holds it: a corporate
// TLS-inspecting proxy's, or a test's own.
type trustRoot struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTrustRoot(t *testing.T, cn string) trustRoot {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{Organization: []string{"Corp"}, CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return trustRoot{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf is a server certificate for host signed by the root.
func (r trustRoot) leaf(t *testing.T, host string) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, r.cert, key.Public(), r.key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

// caFile is what the daemon writes to the guest's ca.pem: the CA, then the roots.
func caFile(ca *tlsca.CA, roots ...trustRoot) []byte {
	b := slices.Clone(ca.CertPEM())
	for _, r := range roots {
		b = append(b, r.pem...)
	}
	return b
}

// holds counts the certificates equal to c in the file at guest path p.
func holds(t *testing.T, root, p string, c *x509.Certificate) int {
	t.Helper()
	n := 0
	for _, got := range certsIn(t, root, p) {
		if got.Equal(c) {
			n++
		}
	}
	return n
}

// trustFiles lists the files and links under root whose name or link
// target starts with moat-trust-, and the record.
func trustFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for p, v := range snapshot(t, root) {
		if strings.HasPrefix(filepath.Base(p), trustPrefix) || strings.HasPrefix(v, "-> "+trustPrefix) || "/"+p == trustRecord {
			out = append(out, "/"+p)
		}
	}
	slices.Sort(out)
	return out
}

// TestInstallTrustRoots follows [network] trust through a sandbox's life
// on each distribution's layout: roots added after the CA in every bundle,
// with anchors (and, where OpenSSL reads a hashed directory, links); a
// restart that changes nothing; a root dropped from the configuration
// taken out again; the image's own roots untouched throughout.
func TestInstallTrustRoots(t *testing.T) {
	tests := []struct {
		name    string
		files   func(roots string) map[string]string
		bundles []string // every name of a bundle
		anchors []string // directory and extension of a root's anchor
		hashed  bool     // OpenSSL's hashed directory gets links
	}{{
		name: "debian",
		files: func(roots string) map[string]string {
			return map[string]string{
				"/etc/ssl/certs/ca-certificates.crt": roots,
				"/usr/local/share/ca-certificates/":  "",
			}
		},
		bundles: []string{"/etc/ssl/certs/ca-certificates.crt"},
		anchors: []string{"/usr/local/share/ca-certificates/*.crt"},
		hashed:  true,
	}, {
		name: "alpine",
		files: func(roots string) map[string]string {
			return map[string]string{
				"/etc/ssl/certs/ca-certificates.crt": roots,
				"/etc/ssl/cert.pem":                  "-> certs/ca-certificates.crt",
			}
		},
		bundles: []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/cert.pem"},
		anchors: []string{"/usr/local/share/ca-certificates/*.crt"},
		hashed:  true,
	}, {
		name: "fedora",
		files: func(roots string) map[string]string {
			return map[string]string{
				"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem": roots,
				"/etc/pki/ca-trust/source/anchors/":                 "",
				"/etc/pki/tls/certs/ca-bundle.crt":                  "-> /etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
				"/etc/pki/tls/cert.pem":                             "-> /etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
				"/etc/ssl/certs":                                    "-> /etc/pki/tls/certs",
			}
		},
		bundles: []string{"/etc/pki/tls/certs/ca-bundle.crt", "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem"},
		anchors: []string{"/etc/pki/ca-trust/source/anchors/*.pem"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			image := systemRoots(t)
			layout(t, root, tt.files(image))
			ca := newCA(t)
			corp, lab := newTrustRoot(t, "Corp Root"), newTrustRoot(t, "Lab Root")

			// First start with two roots.
			got, err := installCA(root, caFile(ca, corp, lab))
			if err != nil {
				t.Fatal(err)
			}
			if got.roots != 2 {
				t.Errorf("trust.roots %d, want 2", got.roots)
			}
			for _, p := range tt.bundles {
				this, other, rest := countCA(certsIn(t, root, p), ca)
				if this != 1 || other != 0 || rest != 4 || holds(t, root, p, corp.cert) != 1 || holds(t, root, p, lab.cert) != 1 {
					t.Errorf("%s: CA %d, other moat CAs %d, others %d (corp %d, lab %d); want 1, 0, 4 (1, 1)",
						p, this, other, rest, holds(t, root, p, corp.cert), holds(t, root, p, lab.cert))
				}
				if b := readGuest(t, root, p); !strings.HasPrefix(b, image) {
					t.Errorf("%s: the image's roots were not kept as they were", p)
				}
				// A client of the bundle verifies a host the gate splices.
				pool := x509.NewCertPool()
				for _, c := range certsIn(t, root, p) {
					pool.AddCert(c)
				}
				if _, err := corp.leaf(t, "git.corp.test").Verify(x509.VerifyOptions{Roots: pool, DNSName: "git.corp.test"}); err != nil {
					t.Errorf("verifying a corp leaf against %s: %v", p, err)
				}
			}
			if got.bundle != tt.bundles[0] {
				t.Errorf("bundle %q, want %q", got.bundle, tt.bundles[0])
			}
			for _, pattern := range tt.anchors {
				anchors, _ := filepath.Glob(filepath.Join(root, pattern))
				var n int
				for _, a := range anchors {
					if strings.HasPrefix(filepath.Base(a), trustPrefix) {
						n++
					}
				}
				if n != 2 {
					t.Errorf("%s: %d trust anchors, want 2 (%v)", pattern, n, anchors)
				}
			}
			if tt.hashed {
				checkHashLink(t, root, corp.cert, true)
				checkHashLink(t, root, lab.cert, true)
			}
			files := trustFiles(t, root)

			// Restarts with the same roots change nothing.
			before := snapshot(t, root)
			for i := range 2 {
				again, err := installCA(root, caFile(ca, corp, lab))
				if err != nil || len(again.changed) != 0 {
					t.Errorf("restart %d: changed %v, %v", i+1, again.changed, err)
				}
				if !maps.Equal(before, snapshot(t, root)) {
					t.Errorf("restart %d changed the files", i+1)
				}
			}

			// Lab dropped from the configuration: gone everywhere, corp stays.
			if _, err := installCA(root, caFile(ca, corp)); err != nil {
				t.Fatal(err)
			}
			for _, p := range tt.bundles {
				this, _, rest := countCA(certsIn(t, root, p), ca)
				if this != 1 || rest != 3 || holds(t, root, p, corp.cert) != 1 || holds(t, root, p, lab.cert) != 0 {
					t.Errorf("%s after dropping lab: CA %d, others %d, corp %d, lab %d; want 1, 3, 1, 0",
						p, this, rest, holds(t, root, p, corp.cert), holds(t, root, p, lab.cert))
				}
			}
			if tt.hashed {
				checkHashLink(t, root, corp.cert, true)
				checkHashLink(t, root, lab.cert, false)
			}
			if left := trustFiles(t, root); len(left) >= len(files) {
				t.Errorf("files after dropping lab %v; before %v", left, files)
			}

			// No roots at all: as if there had never been any.
			if _, err := installCA(root, ca.CertPEM()); err != nil {
				t.Fatal(err)
			}
			if left := trustFiles(t, root); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
			fresh := t.TempDir()
			layout(t, fresh, tt.files(image))
			if _, err := installCA(fresh, ca.CertPEM()); err != nil {
				t.Fatal(err)
			}
			if a, b := snapshot(t, root), snapshot(t, fresh); !maps.Equal(a, b) {
				t.Errorf("after dropping every root the store differs from one that never had any:\n%v\n%v", a, b)
			}
		})
	}
}

func readGuest(t *testing.T, root, p string) string {
	t.Helper()
	real, _, err := resolveIn(root, p)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, real))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkHashLink checks whether OpenSSL's lookup in /etc/ssl/certs, which
// tries <subject hash>.0, .1, ... until one is missing, finds c.
func checkHashLink(t *testing.T, root string, c *x509.Certificate, want bool) {
	t.Helper()
	h, err := subjectHash(c.RawSubject)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for i := 0; ; i++ {
		got, err := readCert(root, fmt.Sprintf("/etc/ssl/certs/%08x.%d", h, i))
		if err != nil {
			break
		}
		found = found || got.Equal(c)
	}
	if found != want {
		t.Errorf("OpenSSL's hashed directory finds %q: %v, want %v", c.Subject, found, want)
	}
}

// TestInstallTrustRootsImageOwn: a root the image ships itself is neither
// added a second time nor removed when the configuration drops it.
func TestInstallTrustRootsImageOwn(t *testing.T) {
	root := t.TempDir()
	corp := newTrustRoot(t, "Corp Root")
	h, _ := subjectHash(corp.cert.RawSubject)
	hashLink := fmt.Sprintf("/etc/ssl/certs/%08x.0", h)
	image := systemRoots(t) + string(corp.pem)
	layout(t, root, map[string]string{
		"/etc/ssl/certs/ca-certificates.crt": image,
		"/etc/ssl/certs/corp.pem":            string(corp.pem),
		hashLink:                             "-> corp.pem",
	})
	ca := newCA(t)
	const bundle = "/etc/ssl/certs/ca-certificates.crt"
	for _, step := range []struct {
		name  string
		roots []trustRoot
	}{{"listed", []trustRoot{corp}}, {"listed again", []trustRoot{corp}}, {"dropped", nil}} {
		if _, err := installCA(root, caFile(ca, step.roots...)); err != nil {
			t.Fatal(err)
		}
		if n := holds(t, root, bundle, corp.cert); n != 1 {
			t.Errorf("%s: the bundle holds the image's root %d times, want 1", step.name, n)
		}
		if b := readGuest(t, root, bundle); !strings.HasPrefix(b, image) {
			t.Errorf("%s: the image's roots were not kept as they were", step.name)
		}
		if got, _ := os.Readlink(filepath.Join(root, hashLink)); got != "corp.pem" {
			t.Errorf("%s: %s links to %q, want the image's corp.pem", step.name, hashLink, got)
		}
		checkHashLink(t, root, corp.cert, true)
	}
}

// TestInstallTrustRootsRenewed: a root renewed under the same subject (a
// new key) replaces the old one in OpenSSL's hashed directory without a
// gap before it, which would hide it.
func TestInstallTrustRootsRenewed(t *testing.T) {
	root := t.TempDir()
	layout(t, root, map[string]string{"/etc/ssl/certs/ca-certificates.crt": systemRoots(t)})
	ca := newCA(t)
	old, cur := newTrustRoot(t, "Corp Root"), newTrustRoot(t, "Corp Root")
	for _, r := range []trustRoot{old, cur} {
		if _, err := installCA(root, caFile(ca, r)); err != nil {
			t.Fatal(err)
		}
	}
	checkHashLink(t, root, cur.cert, true)
	checkHashLink(t, root, old.cert, false)
	if n := holds(t, root, "/etc/ssl/certs/ca-certificates.crt", old.cert); n != 0 {
		t.Errorf("the bundle still holds the old root %d times", n)
	}
}

// TestInstallTrustRootsNoBundle: an image without roots gets the CA and the
// trust roots, and no REQUESTS_CA_BUNDLE (which would replace certifi's).
func TestInstallTrustRootsNoBundle(t *testing.T) {
	root := t.TempDir()
	layout(t, root, map[string]string{"/etc/": ""})
	ca, corp := newCA(t), newTrustRoot(t, "Corp Root")
	got, err := installCA(root, caFile(ca, corp))
	if err != nil {
		t.Fatal(err)
	}
	if got.bundle != "" {
		t.Errorf("bundle %q for a store of moat's own certificates alone", got.bundle)
	}
	if holds(t, root, debianBundle, corp.cert) != 1 || holds(t, root, debianBundle, ca.Cert()) != 1 {
		t.Errorf("%s does not hold the CA and the root once each", debianBundle)
	}
}

// TestInstallTrustRootsRecordOnlyOurs: the record names a file, but init
// removes only what is named moat-trust-… or links to such a file; a hash
// link that a rehash in the guest has since given to another root stays.
func TestInstallTrustRootsRecordOnlyOurs(t *testing.T) {
	root := t.TempDir()
	layout(t, root, map[string]string{
		"/etc/ssl/certs/ca-certificates.crt": systemRoots(t),
		"/etc/ssl/certs/abcd0123.0":          "-> Root_0.pem",
		"/etc/ssl/certs/Root_0.pem":          "image's",
		"/etc/ssl/certs/moat-trust-00.pem":   "-> /nowhere",
	})
	sum := strings.Repeat("ab", 32)
	layout(t, root, map[string]string{trustRecord: sum + " file /etc/ssl/certs/abcd0123.0\n" +
		sum + " file /etc/ssl/certs/moat-trust-00.pem\n" + sum + " file /etc/ssl/certs/Root_0.pem\n"})
	if _, err := installCA(root, newCA(t).CertPEM()); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{"/etc/ssl/certs/abcd0123.0": true, "/etc/ssl/certs/Root_0.pem": true, "/etc/ssl/certs/moat-trust-00.pem": false, trustRecord: false} {
		if _, err := os.Lstat(filepath.Join(root, p)); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", p, err == nil, want)
		}
	}
}
