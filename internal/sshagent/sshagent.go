// Package sshagent is the ssh-agent the guest sees: a filter in front of
// the host's agent ($SSH_AUTH_SOCK) that shows and signs with only the keys
// the configuration lists, by SHA256 fingerprint or by comment. The keys
// themselves never leave the host's agent; the guest gets signatures, and
// only from the listed keys (threat model 27). Everything that would change the
// host's agent (adding, removing, locking) is refused.
//
// The daemon serves a Filter on every agent channel the guest opens
// through the session proxy's SSH connection; each channel dials the host's
// agent afresh, so an agent restarted on the host is picked up.
package sshagent

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// ErrRefused is what the guest gets for anything but listing and signing
// with an allowed key.
var ErrRefused = errors.New("refused by moat: the sandbox may only list and use the keys its configuration names")

// Filter is an agent.ExtendedAgent over the host's agent at Sock.
type Filter struct {
	Sock string // the host's SSH_AUTH_SOCK
	// Dial, when set, reaches the host's agent instead of Sock: in a
	// process that cannot open the socket itself, another does.
	Dial  func() (net.Conn, error)
	Allow []string // "SHA256:..." fingerprints or key comments
	// Confirm, when set, is asked before each signature with an allowed
	// key ([ssh_agent] confirm = true); false refuses it.
	Confirm func(k *agent.Key) bool

	up   agent.ExtendedAgent
	conn net.Conn
}

// dialTimeout bounds reaching the host's agent.
const dialTimeout = 5 * time.Second

func (f *Filter) upstream() (agent.ExtendedAgent, error) {
	if f.up != nil {
		return f.up, nil
	}
	if f.Dial != nil {
		c, err := f.Dial()
		if err != nil {
			return nil, err
		}
		f.conn, f.up = c, agent.NewClient(c)
		return f.up, nil
	}
	if f.Sock == "" {
		return nil, errors.New("the host has no ssh-agent (SSH_AUTH_SOCK was not set when the sandbox started)")
	}
	c, err := net.DialTimeout("unix", f.Sock, dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("reaching the host's ssh-agent: %w", err)
	}
	f.conn, f.up = c, agent.NewClient(c)
	return f.up, nil
}

// Close closes the connection to the host's agent.
func (f *Filter) Close() error {
	if f.conn != nil {
		return f.conn.Close()
	}
	return nil
}

func (f *Filter) allowed(k *agent.Key) bool {
	pub, err := ssh.ParsePublicKey(k.Blob)
	if err != nil {
		return false
	}
	fp := ssh.FingerprintSHA256(pub)
	return slices.ContainsFunc(f.Allow, func(a string) bool { return a == fp || (a == k.Comment && k.Comment != "") })
}

// List returns the allowed keys only.
func (f *Filter) List() ([]*agent.Key, error) {
	up, err := f.upstream()
	if err != nil {
		return nil, err
	}
	keys, err := up.List()
	if err != nil {
		return nil, err
	}
	var out []*agent.Key
	for _, k := range keys {
		if f.allowed(k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// check finds key among the host agent's allowed keys, and asks Confirm.
func (f *Filter) check(key ssh.PublicKey) error {
	keys, err := f.List()
	if err != nil {
		return err
	}
	blob := key.Marshal()
	for _, k := range keys {
		if string(k.Blob) == string(blob) {
			if f.Confirm != nil && !f.Confirm(k) {
				return fmt.Errorf("%w (the signature with %s was not confirmed)", ErrRefused, ssh.FingerprintSHA256(key))
			}
			return nil
		}
	}
	return fmt.Errorf("%w (key %s is not one of them)", ErrRefused, ssh.FingerprintSHA256(key))
}

// Sign signs with an allowed key.
func (f *Filter) Sign(key ssh.PublicKey, data []byte) (*ssh.Signature, error) {
	return f.SignWithFlags(key, data, 0)
}

// SignWithFlags signs with an allowed key.
func (f *Filter) SignWithFlags(key ssh.PublicKey, data []byte, flags agent.SignatureFlags) (*ssh.Signature, error) {
	if err := f.check(key); err != nil {
		return nil, err
	}
	return f.up.SignWithFlags(key, data, flags)
}

// Add is refused.
func (f *Filter) Add(agent.AddedKey) error { return ErrRefused }

// Remove is refused.
func (f *Filter) Remove(ssh.PublicKey) error { return ErrRefused }

// RemoveAll is refused.
func (f *Filter) RemoveAll() error { return ErrRefused }

// Lock is refused.
func (f *Filter) Lock([]byte) error { return ErrRefused }

// Unlock is refused.
func (f *Filter) Unlock([]byte) error { return ErrRefused }

// Signers is refused: signers would be used in this process, not the guest.
func (f *Filter) Signers() ([]ssh.Signer, error) { return nil, ErrRefused }

// Extension is refused: extensions are agent-specific operations nobody
// listed.
func (f *Filter) Extension(string, []byte) ([]byte, error) { return nil, agent.ErrExtensionUnsupported }

// Describe is for logs: the allowed entries.
func (f *Filter) Describe() string { return strings.Join(f.Allow, ", ") }

var _ agent.ExtendedAgent = (*Filter)(nil)
