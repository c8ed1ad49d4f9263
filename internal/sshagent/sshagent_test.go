package sshagent

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"path/filepath"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// hostAgent serves a keyring with two keys on a unix socket, as the
// host's ssh-agent would (the edge: the real agent is tested end to end).
func hostAgent(t *testing.T) (sock string, allowed, other ssh.PublicKey) {
	t.Helper()
	kr := agent.NewKeyring()
	var pubs []ssh.PublicKey
	for _, c := range []string{"deploy@ci", "personal@laptop"} {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if err := kr.Add(agent.AddedKey{PrivateKey: priv, Comment: c}); err != nil {
			t.Fatal(err)
		}
		p, _ := ssh.NewPublicKey(pub)
		pubs = append(pubs, p)
	}
	sock = filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { agent.ServeAgent(kr, c); c.Close() }()
		}
	}()
	return sock, pubs[0], pubs[1]
}

func TestFilter(t *testing.T) {
	sock, allowed, other := hostAgent(t)
	for _, allow := range [][]string{{ssh.FingerprintSHA256(allowed)}, {"deploy@ci"}} {
		f := &Filter{Sock: sock, Allow: allow}
		keys, err := f.List()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 || string(keys[0].Blob) != string(allowed.Marshal()) {
			t.Fatalf("allow %q: list %v, want the one allowed key", allow, keys)
		}
		sig, err := f.Sign(allowed, []byte("data"))
		if err != nil {
			t.Fatalf("signing with the allowed key: %v", err)
		}
		if err := allowed.Verify([]byte("data"), sig); err != nil {
			t.Fatalf("signature does not verify: %v", err)
		}
		if _, err := f.Sign(other, []byte("data")); !errors.Is(err, ErrRefused) {
			t.Errorf("signing with the other key: %v, want refused", err)
		}
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		_ = pub
		for name, err := range map[string]error{
			"add":        f.Add(agent.AddedKey{PrivateKey: priv}),
			"remove":     f.Remove(other),
			"remove all": f.RemoveAll(),
			"lock":       f.Lock([]byte("x")),
		} {
			if !errors.Is(err, ErrRefused) {
				t.Errorf("%s: %v, want refused", name, err)
			}
		}
		f.Close()
	}
	// The host's agent still has both keys.
	c, _ := net.Dial("unix", sock)
	defer c.Close()
	if keys, _ := agent.NewClient(c).List(); len(keys) != 2 {
		t.Errorf("the host's agent has %d keys left, want 2", len(keys))
	}
}

func TestConfirm(t *testing.T) {
	sock, allowed, _ := hostAgent(t)
	var asked []string
	answer := false
	f := &Filter{Sock: sock, Allow: []string{"deploy@ci"}, Confirm: func(k *agent.Key) bool {
		asked = append(asked, k.Comment)
		return answer
	}}
	defer f.Close()
	if _, err := f.Sign(allowed, []byte("x")); !errors.Is(err, ErrRefused) {
		t.Errorf("unconfirmed signature: %v, want refused", err)
	}
	answer = true
	if _, err := f.Sign(allowed, []byte("x")); err != nil {
		t.Errorf("confirmed signature: %v", err)
	}
	if len(asked) != 2 || asked[0] != "deploy@ci" {
		t.Errorf("asked %q", asked)
	}
}

func TestNoHostAgent(t *testing.T) {
	f := &Filter{Allow: []string{"x"}}
	if _, err := f.List(); err == nil {
		t.Error("listing without a host agent succeeded")
	}
}

// Served over the agent protocol, as the guest sees it.
func TestFilterOverTheProtocol(t *testing.T) {
	sock, allowed, _ := hostAgent(t)
	a, b := net.Pipe()
	f := &Filter{Sock: sock, Allow: []string{"deploy@ci"}}
	go func() { agent.ServeAgent(f, a); a.Close(); f.Close() }()
	cl := agent.NewClient(b)
	keys, err := cl.List()
	if err != nil || len(keys) != 1 || keys[0].Comment != "deploy@ci" {
		t.Fatalf("list: %v %v", keys, err)
	}
	if _, err := cl.Sign(allowed, []byte("x")); err != nil {
		t.Errorf("sign: %v", err)
	}
	b.Close()
}
