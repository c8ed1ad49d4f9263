// Package guestspec is the guest configuration: what the daemon tells moat
// init inside the sandbox, as /.moat/guest.json.
//
// Specification. The file is JSON, one object, written by the daemon before
// every start and mounted read-only into the guest. Fields (frozen; only
// ever added):
//
//	schema         int     1
//	hostname       string  the sandbox's hostname
//	user           string  login name of the agent user ("agent")
//	uid, gid       int     the agent user's ids (the invoking host user's ids when not root, else 1000)
//	home           string  the agent user's home ("/home/agent")
//	workspace      string  absolute path of the project, the sessions' default directory
//	listen         string  address the SSH agent listens on ("10.88.0.2:22")
//	authorized_key string  the one public key (authorized_keys format) the agent accepts
//	host_key       string  path inside the guest of the agent's private host key
//	nameserver     string  the resolver the guest uses (the gateway)
//	env            []string base environment of every session ("K=V")
//	ca_file        string  path inside the guest of a PEM file (CAFile):
//	                       the sandbox CA's certificate first, then the
//	                       root certificates of [network] trust, if any;
//	                       init adds them all to the guest's trust stores;
//	                       empty (records written before TLS inspection):
//	                       no CA, init leaves the trust stores alone
//
// The guest runs the very same moat binary as the host, so reader and
// writer never disagree on this format; the schema number is for records
// written by an older moat and read after an upgrade.
package guestspec

import (
	"encoding/json"
	"fmt"
	"os"
)

// Schema is the current version.
const Schema = 1

// Paths inside the guest.
const (
	Dir    = "/.moat"
	Binary = "/.moat/moat"
	File   = "/.moat/guest.json"
	// CAFile is where the daemon puts the sandbox CA's certificate (never
	// its key), followed by the [network] trust roots: ca.pem in the guest
	// dir, which is mounted at Dir.
	CAFile = "/.moat/ca.pem"
)

// Spec is guest.json.
type Spec struct {
	Schema        int      `json:"schema"`
	Hostname      string   `json:"hostname"`
	User          string   `json:"user"`
	UID           int      `json:"uid"`
	GID           int      `json:"gid"`
	Home          string   `json:"home"`
	Workspace     string   `json:"workspace"`
	Listen        string   `json:"listen"`
	AuthorizedKey string   `json:"authorized_key"`
	HostKey       string   `json:"host_key"`
	Nameserver    string   `json:"nameserver"`
	Env           []string `json:"env"`
	CAFile        string   `json:"ca_file,omitempty"`
	// SSHAgentSocket is where the guest's ssh-agent listens, when the
	// sandbox may use keys of the host's agent ([ssh_agent]).
	SSHAgentSocket string `json:"ssh_agent_socket,omitempty"`
}

// SSHAgentSocket is the guest's ssh-agent socket, in a directory of its own.
const SSHAgentSocket = "/run/moat-ssh-agent/agent.sock"

// Read loads a spec.
func Read(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading guest spec: %w", err)
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parsing guest spec %s: %w", path, err)
	}
	if s.Schema > Schema {
		return nil, fmt.Errorf("guest spec schema %d is newer than this binary's %d", s.Schema, Schema)
	}
	return &s, nil
}
