package keys

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/crypto/ssh"
)

func TestEnsure(t *testing.T) {
	dir := t.TempDir()
	if err := Ensure(dir); err != nil {
		t.Fatal(err)
	}
	client, err := Client(dir)
	if err != nil {
		t.Fatal(err)
	}
	host, err := Host(filepath.Join(dir, HostKey))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := HostPublic(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pub.Marshal(), host.PublicKey().Marshal()) {
		t.Error("host_key.pub is not the host key's public half")
	}
	if got := client.PublicKey().Type(); got != ssh.KeyAlgoECDSA256 {
		t.Errorf("new client key is %s, want %s", got, ssh.KeyAlgoECDSA256)
	}
	for _, f := range []string{ClientKey, HostKey} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, fi.Mode().Perm())
		}
	}
	// A second Ensure keeps the keys.
	if err := Ensure(dir); err != nil {
		t.Fatal(err)
	}
	again, _ := Client(dir)
	if !bytes.Equal(again.PublicKey().Marshal(), client.PublicKey().Marshal()) {
		t.Error("Ensure replaced an existing key")
	}
}

// TestEnsureKeepsEd25519: sandboxes created before keys were P-256 keep
// their Ed25519 keys, and they still load.
func TestEnsureKeepsEd25519(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "guest"), 0o700)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(priv, "moat")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, ClientKey), pem.EncodeToMemory(block), 0o600)
	if err := Ensure(dir); err != nil {
		t.Fatal(err)
	}
	c, err := Client(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.PublicKey().Type(); got != ssh.KeyAlgoED25519 {
		t.Errorf("client key is %s, want the existing %s", got, ssh.KeyAlgoED25519)
	}
}
