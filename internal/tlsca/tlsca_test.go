package tlsca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func newCA(t testing.TB) *CA {
	t.Helper()
	ca, err := LoadOrCreate(filepath.Join(t.TempDir(), "api"))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func pool(ca *CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert())
	return p
}

func TestLeafVerifies(t *testing.T) {
	ca := newCA(t)
	tests := []struct {
		name    string
		verify  string // what a client checks the certificate for
		wantDNS string
		wantIP  string
	}{
		{"example.com", "example.com", "example.com", ""},
		{"API.Example.COM.", "api.example.com", "api.example.com", ""},
		{"under_score.example", "under_score.example", "under_score.example", ""},
		{"localhost", "localhost", "localhost", ""},
		{"10.0.0.1", "10.0.0.1", "", "10.0.0.1"},
		{"::1", "::1", "", "::1"},
		{"[2001:db8::1]", "2001:db8::1", "", "2001:db8::1"},
		{"::ffff:192.0.2.7", "192.0.2.7", "", "192.0.2.7"},
		{strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + ".example", strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + ".example", strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + ".example", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert, err := ca.Leaf(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if len(cert.Certificate) != 1 {
				t.Errorf("chain has %d certificates, want the leaf only", len(cert.Certificate))
			}
			leaf := cert.Leaf
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(ca), DNSName: tt.verify}); err != nil {
				t.Errorf("verifying for %s: %v", tt.verify, err)
			}
			var gotDNS, gotIP string
			if len(leaf.DNSNames) == 1 {
				gotDNS = leaf.DNSNames[0]
			}
			if len(leaf.IPAddresses) == 1 {
				gotIP = leaf.IPAddresses[0].String()
			}
			if gotDNS != tt.wantDNS || gotIP != tt.wantIP || len(leaf.DNSNames)+len(leaf.IPAddresses) != 1 {
				t.Errorf("SANs: DNS %q IP %q, want DNS %q IP %q", leaf.DNSNames, leaf.IPAddresses, tt.wantDNS, tt.wantIP)
			}
			if leaf.IsCA || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
				t.Errorf("leaf IsCA %v, ExtKeyUsage %v; want a server leaf", leaf.IsCA, leaf.ExtKeyUsage)
			}
			if _, ok := cert.PrivateKey.(*ecdsa.PrivateKey); !ok {
				t.Errorf("private key is %T, want ECDSA", cert.PrivateKey)
			}
			if !cert.PrivateKey.(*ecdsa.PrivateKey).PublicKey.Equal(leaf.PublicKey) {
				t.Error("private key does not match the leaf")
			}
		})
	}
}

// TestLeafHandshake: a real TLS handshake, as the gate will serve one,
// verified by a client that trusts the CA and nothing else.
func TestLeafHandshake(t *testing.T) {
	ca := newCA(t)
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	srv := tls.Server(s, &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return ca.Leaf(h.ServerName)
	}})
	cli := tls.Client(c, &tls.Config{RootCAs: pool(ca), ServerName: "api.example.com"})
	errc := make(chan error, 1)
	go func() { errc <- srv.Handshake() }()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := cli.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("server handshake: %v", err)
	}
}

func TestLeafBadNames(t *testing.T) {
	ca := newCA(t)
	for _, name := range []string{
		"", ".", "a..b", ".example.com", "*.example.com", "foo bar", "ex\x00ample",
		"fe80::1%eth0", "x/y", strings.Repeat("a", 64) + ".example",
		strings.Repeat("abcdefghi.", 26),
	} {
		_, err := ca.Leaf(name)
		if !errors.Is(err, ErrBadName) {
			t.Errorf("Leaf(%q) = %v, want ErrBadName", name, err)
		}
	}
}

// TestLeafConcurrent: many handshakes for the same new names mint once per
// name, and all get the same certificate.
func TestLeafConcurrent(t *testing.T) {
	ca := newCA(t)
	var mu sync.Mutex
	mints := map[string]int{}
	ca.leaves.onMint = func(name string) {
		mu.Lock()
		mints[name]++
		mu.Unlock()
	}
	const names, perName = 8, 32
	got := make([][]*tls.Certificate, names)
	var wg sync.WaitGroup
	for n := range names {
		got[n] = make([]*tls.Certificate, perName)
		for i := range perName {
			wg.Go(func() {
				cert, err := ca.Leaf(fmt.Sprintf("host%d.example", n))
				if err != nil {
					t.Error(err)
				}
				got[n][i] = cert
			})
		}
	}
	wg.Wait()
	for n := range names {
		name := fmt.Sprintf("host%d.example", n)
		if mints[name] != 1 {
			t.Errorf("%s minted %d times, want 1", name, mints[name])
		}
		for i := range perName {
			if got[n][i] != got[n][0] {
				t.Errorf("%s: caller %d got a different certificate", name, i)
				break
			}
		}
	}
	if len(mints) != names {
		t.Errorf("minted for %d names, want %d", len(mints), names)
	}
}

// TestLeafRenew: a cached leaf is reused until it has a day left, then
// replaced; a leaf never outlives the CA.
func TestLeafRenew(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	ca, err := loadOrCreate(filepath.Join(t.TempDir(), "api"), func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	first, _ := ca.Leaf("example.com")
	if want := t0.Add(-clockSkew); !first.Leaf.NotBefore.Equal(want) {
		t.Errorf("NotBefore %v, want %v (backdated for skewed guest clocks)", first.Leaf.NotBefore, want)
	}
	tests := []struct {
		after   time.Duration
		wantNew bool
	}{
		{time.Minute, false},
		{leafValidity - leafRenewBefore - time.Minute, false},
		{leafValidity - leafRenewBefore + time.Minute, true},
	}
	for _, tt := range tests {
		now = t0.Add(tt.after)
		got, _ := ca.Leaf("example.com")
		if gotNew := got != first; gotNew != tt.wantNew {
			t.Errorf("after %v: new leaf %v, want %v", tt.after, gotNew, tt.wantNew)
		}
	}

	now = ca.Cert().NotAfter.Add(-3 * 24 * time.Hour)
	late, _ := ca.Leaf("late.example")
	if !late.Leaf.NotAfter.Equal(ca.Cert().NotAfter) {
		t.Errorf("leaf minted 3 days before the CA ends expires %v, want the CA's %v", late.Leaf.NotAfter, ca.Cert().NotAfter)
	}
}

// TestLeafCacheBound: the cache keeps maxLeaves names and drops the least
// recently used, so a hot name survives a flood of new ones.
func TestLeafCacheBound(t *testing.T) {
	var lc leafCache
	hot := lc.entry("hot.example")
	for i := range maxLeaves + 100 {
		lc.entry(fmt.Sprintf("n%d.example", i))
		if i%100 == 0 {
			lc.entry("hot.example")
		}
	}
	if got := len(lc.byName); got != maxLeaves || lc.lru.Len() != maxLeaves {
		t.Errorf("cache holds %d names (list %d), want %d", got, lc.lru.Len(), maxLeaves)
	}
	if lc.entry("hot.example") != hot {
		t.Error("a recently used name was evicted")
	}
	if _, ok := lc.byName["n0.example"]; ok {
		t.Error("the least recently used name is still cached")
	}
}

func TestLoadOrCreateReloads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "api")
	a, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Cert().Raw, b.Cert().Raw) || !a.key.Equal(b.key) {
		t.Error("a second LoadOrCreate made a new CA")
	}
	if !bytes.Equal(a.CertPEM(), b.CertPEM()) {
		t.Error("CertPEM differs after reload")
	}
	// A leaf from the reloaded CA verifies against the first one.
	leaf, _ := b.Leaf("example.com")
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: pool(a), DNSName: "example.com"}); err != nil {
		t.Error(err)
	}
	if got := a.Cert().Subject.CommonName; got != "moat sandbox CA api" {
		t.Errorf("CA CN %q", got)
	}
	if !IsMoatCA(a.Cert()) || IsMoatCA(leaf.Leaf) {
		t.Error("IsMoatCA does not tell the CA from its leaf")
	}
	if !a.Cert().MaxPathLenZero || !a.Cert().IsCA {
		t.Error("CA may sign intermediates")
	}

	modes := map[string]os.FileMode{CertFile: 0o644, KeyFile: 0o600}
	ents, _ := os.ReadDir(dir)
	if len(ents) != len(modes) {
		t.Errorf("CA dir holds %d files, want %d (no temporary files left)", len(ents), len(modes))
	}
	for f, want := range modes {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s mode %v, want %v", f, got, want)
		}
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("CA dir mode %v, want 0700", fi.Mode().Perm())
	}
}

// TestLoadOrCreateKeyAlone: a crash between writing the key and the
// certificate leaves a key alone; the next start makes a new CA.
func TestLoadOrCreateKeyAlone(t *testing.T) {
	dir := t.TempDir()
	a, _ := LoadOrCreate(dir)
	os.Remove(filepath.Join(dir, CertFile))
	b, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a.Cert().Raw, b.Cert().Raw) {
		t.Error("kept a CA whose certificate was gone")
	}
}

func TestLoadOrCreateRenews(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Now()
	a, _ := loadOrCreate(dir, func() time.Time { return t0 })
	late := a.Cert().NotAfter.Add(-caRenewBefore + time.Hour)
	b, err := loadOrCreate(dir, func() time.Time { return late })
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a.Cert().Raw, b.Cert().Raw) {
		t.Error("kept a CA about to expire")
	}
	c, _ := loadOrCreate(dir, func() time.Time { return late })
	if !bytes.Equal(b.Cert().Raw, c.Cert().Raw) {
		t.Error("the renewed CA was not saved")
	}
}

func TestLoadDamaged(t *testing.T) {
	other := t.TempDir()
	if _, err := LoadOrCreate(other); err != nil {
		t.Fatal(err)
	}
	otherKey, _ := os.ReadFile(filepath.Join(other, KeyFile))
	tests := []struct {
		name     string
		file     string // the file the error must name
		mutilate func(dir string)
	}{
		{"garbage certificate", CertFile, func(dir string) {
			os.WriteFile(filepath.Join(dir, CertFile), []byte("not pem"), 0o644)
		}},
		{"truncated certificate", CertFile, func(dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, CertFile))
			os.WriteFile(filepath.Join(dir, CertFile), b[:len(b)/2], 0o644)
		}},
		{"garbage key", KeyFile, func(dir string) {
			os.WriteFile(filepath.Join(dir, KeyFile), []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600)
		}},
		{"another CA's key", KeyFile, func(dir string) {
			os.WriteFile(filepath.Join(dir, KeyFile), otherKey, 0o600)
		}},
		{"missing key", KeyFile, func(dir string) {
			os.Remove(filepath.Join(dir, KeyFile))
		}},
		{"not a moat CA", CertFile, func(dir string) {
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "x"},
				NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
			der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
			p8, _ := x509.MarshalPKCS8PrivateKey(key)
			os.WriteFile(filepath.Join(dir, CertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
			os.WriteFile(filepath.Join(dir, KeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), 0o600)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := LoadOrCreate(dir); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(filepath.Join(dir, CertFile))
			tt.mutilate(dir)
			after, _ := os.ReadFile(filepath.Join(dir, CertFile))
			_, err := LoadOrCreate(dir)
			if err == nil {
				t.Fatal("loaded a damaged CA")
			}
			msg := err.Error()
			if !strings.Contains(msg, filepath.Join(dir, tt.file)) || !strings.Contains(msg, "remove") || !strings.Contains(msg, "moat destroy") {
				t.Errorf("error %q does not name %s and say to remove it", msg, tt.file)
			}
			if now, _ := os.ReadFile(filepath.Join(dir, CertFile)); !bytes.Equal(now, after) || (tt.file == KeyFile && !bytes.Equal(now, before)) {
				t.Error("LoadOrCreate replaced a damaged CA instead of stopping")
			}
		})
	}
}

func BenchmarkLeafCached(b *testing.B) {
	ca := newCA(b)
	if _, err := ca.Leaf("example.com"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ca.Leaf("example.com")
		}
	})
}

func BenchmarkLeafNew(b *testing.B) {
	ca := newCA(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := ca.Leaf(fmt.Sprintf("h%d.example", i)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
