// Package keys makes and loads a sandbox's SSH keys: the client key that
// the CLI and daemon authenticate to the guest agent with (it never enters
// the guest), and the agent's host key (mounted read-only into the guest,
// so the client can tell the real agent from anything else listening).
package keys

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"
)

// File names in the sandbox state dir: frozen.
const (
	ClientKey = "client_key"     // 0600, host only
	HostKey   = "guest/host_key" // 0600, mounted at /.moat/host_key
	HostPub   = "host_key.pub"   // the CLI verifies the agent against it
)

// Ensure creates both keys in dir if they are missing.
func Ensure(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "guest"), 0o700); err != nil {
		return fmt.Errorf("creating key dir: %w", err)
	}
	if err := ensureKey(filepath.Join(dir, ClientKey)); err != nil {
		return err
	}
	if err := ensureKey(filepath.Join(dir, HostKey)); err != nil {
		return err
	}
	s, err := loadSigner(filepath.Join(dir, HostKey))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, HostPub), ssh.MarshalAuthorizedKey(s.PublicKey()), 0o644)
}

func ensureKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// ECDSA P-256 rather than Ed25519: Go computes Ed25519's base-point
	// tables on a process's first signature and first verification, about
	// 1.5 ms of every short-lived CLI process (which signs its login and
	// verifies the host key's signature) and of the agent's first handshake
	// in a fresh guest; P-256's tables are compiled in. Keys written by
	// earlier versions, Ed25519, keep working.
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "moat")
	if err != nil {
		return fmt.Errorf("encoding key: %w", err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return fmt.Errorf("writing key %s: %w", path, err)
	}
	return nil
}

func loadSigner(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading key: %w", err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("parsing key %s: %w", path, err)
	}
	return s, nil
}

// Client loads the client signer.
func Client(dir string) (ssh.Signer, error) { return loadSigner(filepath.Join(dir, ClientKey)) }

// Host loads the agent's host signer (used inside the guest).
func Host(path string) (ssh.Signer, error) { return loadSigner(path) }

// HostPublic loads the agent's public host key.
func HostPublic(dir string) (ssh.PublicKey, error) {
	b, err := os.ReadFile(filepath.Join(dir, HostPub))
	if err != nil {
		return nil, fmt.Errorf("reading host key: %w", err)
	}
	k, _, _, _, err := ssh.ParseAuthorizedKey(b)
	if err != nil {
		return nil, fmt.Errorf("parsing host key: %w", err)
	}
	return k, nil
}
