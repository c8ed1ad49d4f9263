package secret

import (
	"errors"
	"net"
	"strings"

	"moat.dev/moat/internal/policy"
)

// hostPattern is one entry of a secret's hosts: a name, or "*.suffix"
// for every name below suffix at any depth (not suffix itself), compared
// the way the gate's policy compares names, so that a secret is bound to
// exactly the names a user would expect from writing the same entry in
// network.allow.
type hostPattern struct {
	name     string // normalized (policy.NormalizeName)
	wildcard bool
}

func parseHost(s string) (hostPattern, error) {
	if strings.ContainsAny(s, "/:@ \t") {
		// Ports, URLs and user info are not part of a binding: the
		// gate swaps only over TLS on whatever port the policy allows.
		return hostPattern{}, errors.New("\"" + s + "\" is not a host name")
	}
	p := hostPattern{}
	name := s
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		p.wildcard, name = true, rest
	}
	n, err := policy.NormalizeName(name)
	if err != nil {
		return hostPattern{}, err
	}
	p.name = n
	return p, nil
}

func (p hostPattern) match(name string) bool {
	if p.wildcard {
		return len(name) > len(p.name) && strings.HasSuffix(name, p.name) && name[len(name)-len(p.name)-1] == '.'
	}
	return name == p.name
}

// normalizeHost turns the host a request was for (an SNI, a Host header,
// maybe with a port) into the form patterns are compared in; "" when it
// is not a name, which matches nothing: an IP address is never bound.
func normalizeHost(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	n, err := policy.NormalizeName(host)
	if err != nil {
		return ""
	}
	return n
}

// bound returns the indexes of the secrets bound to host.
func (st *state) bound(host string) []int {
	n := normalizeHost(host)
	if n == "" {
		return nil
	}
	var out []int
	for i := range st.defs {
		for _, p := range st.defs[i].hosts {
			if p.match(n) {
				out = append(out, i)
				break
			}
		}
	}
	return out
}

// Bound reports whether any secret is bound to host (a name, optionally
// with a port). The gate terminates TLS for such hosts, and refuses
// plain HTTP to them: a placeholder is swapped only where nobody on the
// path can read the value.
func (s *Set) Bound(host string) bool {
	if s == nil || s.st == nil {
		return false
	}
	return len(s.st.bound(host)) > 0
}
