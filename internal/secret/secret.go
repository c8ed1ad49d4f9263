// Package secret keeps credentials on the host. The guest is given a
// placeholder for each secret (NAME=moat-ph-…), never the value; the
// gate, which terminates TLS towards the hosts a secret is bound to,
// asks this package to swap the placeholder for the value in each
// request it forwards there, and to swap the value back for the
// placeholder in everything that comes back.
//
// It exists because an agent holding a real API key can send it to any
// host it may reach, or print it into a log that leaves the machine. A
// placeholder is worthless anywhere but on the way to the bound hosts,
// and there only the gate turns it into the credential (docs/credentials.md,
// threat model 23-26).
//
// Values are read on the host (Resolve, Refresh) and live only in this
// process's memory. Nothing here formats a value: Set prints as
// "[redacted]" under every fmt verb, in JSON and in slog, and errors
// name a secret and its source, never its value nor a command's output.
// Go cannot reliably wipe memory (the garbage collector copies and
// frees on its own schedule), so no attempt is made to zero old values.
//
// Placeholders are not secret: they may be stored in the sandbox record
// and shown to people. They are "moat-ph-" and 32 random base32
// characters (160 bits), lower case letters, digits and "-" only, so
// percent-encoding, JSON escaping and header folding leave them intact
// and a substring search finds them wherever a client put them.
package secret

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"moat.dev/moat/internal/config"
)

// PlaceholderPrefix starts every placeholder, so that a person reading a
// request log recognizes one.
const PlaceholderPrefix = "moat-ph-"

// placeholderChars is the length of the random part: 20 bytes of
// randomness in base32.
const placeholderChars = 32

var placeholderEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// redacted is what every formatting of a Set or a value prints.
const redacted = "[redacted]"

// Set is the resolved secrets of one sandbox. It is safe for concurrent
// use; Refresh replaces the values while requests are being swapped and
// bodies scrubbed, each of which works on the values it started with.
//
// A nil *Set has no secrets: Bound is false, Request changes nothing and
// the scrubbers pass everything through.
type Set struct {
	st *state
}

type state struct {
	defs   []def      // sorted by name; fixed at Resolve
	remote RemoteRead // nil: file: and command: sources are read here

	refreshMu sync.Mutex // serializes Refresh, so retired values are not lost
	snap      atomic.Pointer[snapshot]
}

// def is one secret's binding: everything but the value.
type def struct {
	name        string
	from        string
	source      string // the configuration file that defined it, for hints
	placeholder string
	header      string // canonical header name; "" means any header
	query       string // query parameter name; "" means none
	require     bool
	hosts       []hostPattern
}

// snapshot is one generation of values. It is never changed once
// published, so readers need no lock.
type snapshot struct {
	values []value // parallel to state.defs
	// retired holds, per secret, values that Refresh replaced. They are
	// still scrubbed from responses: the old token may still be valid,
	// and a server may echo it in a response to a request that started
	// before the refresh, or from a log of earlier requests.
	retired [][]value
	scrub   *scrubber // nil when there is nothing to scrub
}

// maxRetired bounds the values kept per secret after refreshes.
const maxRetired = 4

// Resolve reads each secret's value on the host and gives each a new
// placeholder. lookupEnv reads the host's environment (os.LookupEnv when
// nil). Every secret that cannot be read is reported, joined in one
// error; each error matches ErrUnavailable and names the secret and its
// source, never a value.
func Resolve(ctx context.Context, secrets map[string]config.Secret, lookupEnv func(string) (string, bool)) (*Set, error) {
	return ResolveWith(ctx, secrets, lookupEnv, nil)
}

// ResolveWith is Resolve, keeping the placeholders a sandbox already
// handed out (from its record, by secret name): a guest process that
// cached a placeholder keeps working across a daemon restart. A
// placeholder that is not well formed, or that two names share, is
// replaced by a new one rather than trusted, because a short or common
// string would be swapped wherever it appears; read the ones in use back
// with Placeholders and store those.
func ResolveWith(ctx context.Context, secrets map[string]config.Secret, lookupEnv func(string) (string, bool), placeholders map[string]string) (*Set, error) {
	return ResolveRemote(ctx, secrets, lookupEnv, placeholders, nil)
}

// RemoteRead reads the value of the secret name, whose source is a file:
// or a command:, in another process: the daemon's gate process cannot
// open the host's files or run its commands, and asks its keeper, which
// reads only the sources the sandbox's configuration gives (ReadOne).
type RemoteRead func(ctx context.Context, name string) ([]byte, error)

// ResolveRemote is ResolveWith with file: and command: sources read by
// remote, now and at every Refresh; nil reads them here.
func ResolveRemote(ctx context.Context, secrets map[string]config.Secret, lookupEnv func(string) (string, bool), placeholders map[string]string, remote RemoteRead) (*Set, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	names := make([]string, 0, len(secrets))
	for n := range secrets {
		names = append(names, n)
	}
	sort.Strings(names)

	seen := map[string]bool{}
	st := &state{remote: remote}
	var errs []error
	for _, n := range names {
		c := secrets[n]
		d := def{name: n, from: c.From, source: c.Source, query: c.Query, require: c.Require}
		if c.Header != "" {
			d.header = http.CanonicalHeaderKey(c.Header)
		}
		for i, h := range c.Hosts {
			p, err := parseHost(h)
			if err != nil {
				errs = append(errs, fmt.Errorf("secret %s: hosts[%d]: %w; write a name such as \"api.example.com\" or a pattern such as \"*.example.com\"", n, i, err))
				continue
			}
			d.hosts = append(d.hosts, p)
		}
		if len(c.Hosts) == 0 {
			errs = append(errs, fmt.Errorf("secret %s: bound to no host; add hosts = [\"api.example.com\"] to [secrets.%s] in %s", n, n, d.sourceName()))
		}
		ph := placeholders[n]
		if !validPlaceholder(ph) || seen[ph] {
			var err error
			if ph, err = newPlaceholder(); err != nil {
				return nil, err
			}
		}
		seen[ph] = true
		d.placeholder = ph
		st.defs = append(st.defs, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	snap, err := st.read(ctx, lookupEnv, nil)
	if err != nil {
		return nil, err
	}
	st.snap.Store(snap)
	return &Set{st: st}, nil
}

// Refresh reads every value again and publishes them together, keeping
// the placeholders, and returns the names of the secrets whose value
// changed. If any value cannot be read, nothing changes and the error
// says which. Requests and bodies already in flight finish with the
// values they started with.
func (s *Set) Refresh(ctx context.Context, lookupEnv func(string) (string, bool)) (changed []string, err error) {
	if s == nil || s.st == nil {
		return nil, nil
	}
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	s.st.refreshMu.Lock()
	defer s.st.refreshMu.Unlock()
	old := s.st.snap.Load()
	snap, err := s.st.read(ctx, lookupEnv, old)
	if err != nil {
		return nil, err
	}
	s.st.snap.Store(snap)
	for i := range s.st.defs {
		if string(old.values[i]) != string(snap.values[i]) {
			changed = append(changed, s.st.defs[i].name)
		}
	}
	return changed, nil
}

// read reads all values into a new snapshot; old, if any, supplies the
// values to retire.
func (st *state) read(ctx context.Context, lookupEnv func(string) (string, bool), old *snapshot) (*snapshot, error) {
	snap := &snapshot{values: make([]value, len(st.defs)), retired: make([][]value, len(st.defs))}
	var errs []error
	for i := range st.defs {
		v, err := st.defs[i].readValue(ctx, lookupEnv, st.remote)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		snap.values[i] = v
		if old != nil {
			r := old.retired[i]
			if prev := old.values[i]; string(prev) != string(v) {
				r = append([]value{prev}, r...)
			}
			var keep []value
			for _, x := range r {
				if string(x) != string(v) && len(keep) < maxRetired {
					keep = append(keep, x)
				}
			}
			snap.retired[i] = keep
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	snap.scrub = st.newScrubber(snap)
	return snap, nil
}

func newPlaceholder() (string, error) {
	b := make([]byte, placeholderChars*5/8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making a secret placeholder: %w", err)
	}
	return PlaceholderPrefix + placeholderEncoding.EncodeToString(b), nil
}

// ValidPlaceholder reports whether p has the form of a placeholder moat
// hands out.
func ValidPlaceholder(p string) bool { return validPlaceholder(p) }

func validPlaceholder(p string) bool {
	r, ok := strings.CutPrefix(p, PlaceholderPrefix)
	if !ok || len(r) != placeholderChars {
		return false
	}
	for _, c := range []byte(r) {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// Names returns the secrets' names, sorted.
func (s *Set) Names() []string {
	if s == nil || s.st == nil {
		return nil
	}
	out := make([]string, len(s.st.defs))
	for i, d := range s.st.defs {
		out[i] = d.name
	}
	return out
}

// Placeholders returns each secret's placeholder by name: what the guest
// sees, and what to keep in the sandbox record for ResolveWith.
func (s *Set) Placeholders() map[string]string {
	if s == nil || s.st == nil {
		return map[string]string{}
	}
	out := make(map[string]string, len(s.st.defs))
	for _, d := range s.st.defs {
		out[d.name] = d.placeholder
	}
	return out
}

// Env returns "NAME=placeholder" for each secret, sorted by name: the
// guest's view of its credentials, for every session's environment.
func (s *Set) Env() []string {
	if s == nil || s.st == nil {
		return nil
	}
	out := make([]string, len(s.st.defs))
	for i, d := range s.st.defs {
		out[i] = d.name + "=" + d.placeholder
	}
	return out
}

// String, GoString, Format, MarshalJSON, MarshalText and LogValue all
// print "[redacted]", so that a Set passed to a log line, an error or a
// JSON encoder by mistake cannot carry a value out. Format covers the
// verbs that would otherwise print fields (%d, %x of a struct).

func (Set) String() string                    { return redacted }
func (Set) GoString() string                  { return redacted }
func (Set) Format(f fmt.State, _ rune)        { fmt.Fprint(f, redacted) }
func (Set) MarshalJSON() ([]byte, error)      { return []byte(`"` + redacted + `"`), nil }
func (Set) MarshalText() ([]byte, error)      { return []byte(redacted), nil }
func (Set) LogValue() slog.Value              { return slog.StringValue(redacted) }
func (value) String() string                  { return redacted }
func (value) GoString() string                { return redacted }
func (value) Format(f fmt.State, _ rune)      { fmt.Fprint(f, redacted) }
func (value) MarshalJSON() ([]byte, error)    { return []byte(`"` + redacted + `"`), nil }
func (value) MarshalText() ([]byte, error)    { return []byte(redacted), nil }
func (value) LogValue() slog.Value            { return slog.StringValue(redacted) }
func (snapshot) Format(f fmt.State, _ rune)   { fmt.Fprint(f, redacted) }
func (snapshot) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// value is a secret's bytes. Its own formatting methods are a second
// line of defence, for code in this package that holds one.
type value []byte
