package daemon

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/gate"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/preset"
	"moat.dev/moat/internal/secret"
	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/tlsca"
)

// secretsTimeout bounds reading every secret at start: a `command:` source
// that hangs (a password manager waiting for a touch) must not hold the
// sandbox's start forever.
const secretsTimeout = 30 * time.Second

// credentials is the gate's view of the sandbox's secrets. A preset added
// while the sandbox runs brings new secrets, and a secret.Set's list is
// fixed when it is resolved, so the daemon resolves a new Set and swaps it
// in whole; requests in flight finish with the one they started with.
type credentials struct {
	cur atomic.Pointer[secret.Set]

	// mu serialises changes (two presets added at once); cfg is the
	// configuration's own secrets, guarded by mu.
	mu  sync.Mutex
	cfg map[string]config.Secret
}

var _ gate.Credentials = (*credentials)(nil)

func (c *credentials) set() *secret.Set { return c.cur.Load() }

func (c *credentials) Bound(host string) bool { return c.set().Bound(host) }
func (c *credentials) Request(host string, h http.Header, u *url.URL) (secret.Applied, error) {
	return c.set().Request(host, h, u)
}
func (c *credentials) ScrubHeader(h http.Header)               { c.set().ScrubHeader(h) }
func (c *credentials) ScrubBody(b io.ReadCloser) io.ReadCloser { return c.set().ScrubBody(b) }
func (c *credentials) ScrubString(s string) string             { return c.set().ScrubString(s) }
func (c *credentials) Scrubs() bool                            { return c.set().Scrubs() }

// wanted is every secret the sandbox uses: the configuration's, then each
// preset's credentials whose variable lookupEnv has (a preset's
// credentials are alternatives, an API key or an OAuth token, so a missing
// one is skipped; a secret the configuration names is required). The
// configuration wins a name both define: the user chose its hosts.
func wanted(cfg map[string]config.Secret, presets []string, lookupEnv func(string) (string, bool)) map[string]config.Secret {
	out := maps.Clone(cfg)
	if out == nil {
		out = map[string]config.Secret{}
	}
	for _, name := range presets {
		p, err := preset.Lookup(name)
		if err != nil {
			continue // a preset this moat no longer knows: its rules are gone too
		}
		for _, s := range p.Secrets {
			if _, ok := out[s.Env]; ok {
				continue
			}
			if v, ok := lookupEnv(s.Env); !ok || v == "" {
				continue
			}
			out[s.Env] = config.Secret{Name: s.Env, From: "env:" + s.Env, Hosts: s.Hosts, Source: "preset " + name}
		}
	}
	return out
}

// startCredentials creates or loads the sandbox CA, reads the secrets and
// adds what the guest needs to its spec: the CA's path (init installs it
// in the system stores) and the placeholders in every session's
// environment. A secret that cannot be read stops the start: a sandbox
// without the credential its configuration names would fail in ways that
// are harder to understand than this error.
func (d *daemon) startCredentials(ctx context.Context) (*tlsca.CA, *credentials, error) {
	ca, err := tlsca.LoadOrCreate(d.o.Dir)
	if err != nil {
		return nil, nil, fmt.Errorf("loading the sandbox CA: %w", err)
	}
	// The CA, then the [network] trust roots (guestTrust). Written only
	// when it changed: every write is an fsync on the start path.
	trusted, err := guestTrust(ca.CertPEM(), d.o.Network.Config.Trust)
	if err != nil {
		return nil, nil, err
	}
	guestCA := filepath.Join(d.o.Plan.GuestDir, "ca.pem")
	if old, err := os.ReadFile(guestCA); err != nil || !bytes.Equal(old, trusted) {
		if err := state.WriteAtomic(guestCA, trusted, 0o644); err != nil {
			return nil, nil, fmt.Errorf("writing the CA for the guest: %w", err)
		}
	}
	d.o.Guest.CAFile = guestspec.CAFile

	rec, err := d.record()
	if err != nil {
		return nil, nil, err
	}
	creds := &credentials{cfg: d.o.Secrets}
	rctx, cancel := context.WithTimeout(ctx, secretsTimeout)
	defer cancel()
	lookup := d.lookupEnv(nil)
	set, err := secret.ResolveRemote(rctx, wanted(d.o.Secrets, rec.Presets, lookup), lookup, rec.Placeholders, d.secretRemote())
	if err != nil {
		return nil, nil, fmt.Errorf("reading secrets on the host: %w", err)
	}
	creds.cur.Store(set)
	if err := d.keepPlaceholders(rec.Placeholders, set); err != nil {
		return nil, nil, err
	}
	d.o.Guest.Env = append(d.o.Guest.Env, set.Env()...)
	return ca, creds, nil
}

// lookupEnv reads a secret's variable: from extra (a request's values)
// first, then from what the CLI handed over at start. Never from the
// daemon's own environment, which the CLI started without them.
func (d *daemon) lookupEnv(extra map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		if v, ok := extra[k]; ok && v != "" {
			return v, true
		}
		v, ok := d.o.SecretEnv[k]
		return v, ok && v != ""
	}
}

// handedEnv reads a host variable the CLI handed over (at start, or with
// a preset or a refresh since): the [env] entries of hooks are expanded
// with these, the daemon's own environment having none of the user's.
func (d *daemon) handedEnv(k string) (string, bool) {
	if d.creds != nil {
		// keepSecretEnv writes the map under this lock.
		d.creds.mu.Lock()
		defer d.creds.mu.Unlock()
	}
	v, ok := d.o.SecretEnv[k]
	return v, ok
}

// keepPlaceholders stores the placeholders in the record, so the next
// start hands out the same ones and the CLI can put them in sessions. The
// record is written only when they differ from old, what it holds: on an
// ordinary start they do not, and the write is an fsync.
func (d *daemon) keepPlaceholders(old map[string]string, set *secret.Set) error {
	ph := set.Placeholders()
	if maps.Equal(old, ph) {
		return nil
	}
	return d.updateRecord(func(r *state.Record) error {
		r.Placeholders = ph
		return nil
	})
}

// upstreamRoots is what intercepted upstreams are verified against: the
// host's roots plus the files of `[network] trust`. A trust file that
// cannot be read stops the start, like a policy that does not parse.
//
// With no extra roots it is nil, which crypto/tls reads as the host's
// roots, loaded at the first verification, that is at the first
// intercepted connection, if there is one. Loading them (parsing every
// certificate in the host's bundle) takes 15-20 ms of CPU on a 2-core host
// and holds about 1 MiB for the daemon's life. Every cold start used to
// wait for it; loaded in the background once the guest ran, it held up the
// first session instead (7-26 ms: the daemon then serves on one
// processor, and the parse kept it), for a pool most sandboxes never use.
func upstreamRoots(files []string) (*x509.CertPool, error) {
	if len(files) == 0 {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if err := AppendTrust(pool, files); err != nil {
		return nil, err
	}
	return pool, nil
}

// AppendTrust adds the certificates of [network] trust's files to pool,
// for the sandbox's gate and the gate service alike.
func AppendTrust(pool *x509.CertPool, files []string) error {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("network.trust: reading %s: %w", f, err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return fmt.Errorf("network.trust: %s holds no PEM certificate; give a file of \"-----BEGIN CERTIFICATE-----\" blocks", f)
		}
	}
	return nil
}

// handlePreset adds a preset to the running sandbox: its hosts as the
// preset layer, its credentials (values from the CLI's environment first,
// then the daemon's own) as secrets. The record keeps the preset, so every
// later start adds it again.
func (d *daemon) handlePreset(w http.ResponseWriter, r *http.Request) {
	var req control.PresetRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: "reading the request: " + err.Error()})
		return
	}
	if _, err := preset.Lookup(req.Name); err != nil {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
		return
	}
	ph, err := d.addPreset(r.Context(), req.Name, req.Env)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, control.PresetAnswer{Schema: control.Schema, Placeholders: ph})
}

// handleSecretsRefresh reads the sandbox's secrets again (see
// control.SecretsRefreshRequest): a rotated token, a password manager's
// new answer, a file rewritten, without restarting the sandbox. The
// placeholders stay; the values replaced stay scrubbed from responses.
func (d *daemon) handleSecretsRefresh(w http.ResponseWriter, r *http.Request) {
	var req control.SecretsRefreshRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: "reading the request: " + err.Error()})
		return
	}
	names, changed, err := d.refreshSecrets(r.Context(), req.Env)
	if err != nil {
		d.log.Warn("refreshing secrets", "err", err)
		writeJSON(w, http.StatusConflict, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
		return
	}
	d.log.Info("secrets refreshed", "secrets", names, "changed", changed)
	writeJSON(w, http.StatusOK, control.SecretsRefreshAnswer{Schema: control.Schema, Refreshed: names, Changed: changed})
}

func (d *daemon) refreshSecrets(ctx context.Context, env map[string]string) (names, changed []string, err error) {
	c := d.creds
	c.mu.Lock()
	defer c.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, secretsTimeout)
	defer cancel()
	set := c.set()
	changed, err = set.Refresh(rctx, d.lookupEnv(env))
	if err != nil {
		return nil, nil, fmt.Errorf("reading secrets on the host (nothing changed): %w", err)
	}
	d.keepSecretEnv(env)
	return set.Names(), changed, nil
}

// keepSecretEnv makes the values of secrets' variables a CLI handed over
// (a newly exported or rotated one) win from now on, over those the
// sandbox started with. Callers hold d.creds.mu.
func (d *daemon) keepSecretEnv(env map[string]string) {
	if d.o.SecretEnv == nil {
		d.o.SecretEnv = map[string]string{}
	}
	for k, v := range env {
		if v != "" {
			d.o.SecretEnv[k] = v
		}
	}
}

func (d *daemon) addPreset(ctx context.Context, name string, env map[string]string) (map[string]string, error) {
	c := d.creds
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, err := d.record()
	if err != nil {
		return nil, err
	}
	presets := rec.Presets
	if added := !slices.Contains(presets, name); added {
		if err := d.updateRecord(func(r *state.Record) error {
			if !slices.Contains(r.Presets, name) {
				r.Presets = append(r.Presets, name)
			}
			presets = r.Presets
			return nil
		}); err != nil {
			return nil, err
		}
		if err := d.net.recompile(); err != nil {
			return nil, fmt.Errorf("adding the preset's hosts: %w", err)
		}
	}
	lookup := d.lookupEnv(env)
	d.keepSecretEnv(env)
	rctx, cancel := context.WithTimeout(ctx, secretsTimeout)
	defer cancel()
	old := c.set()
	set, err := secret.ResolveRemote(rctx, wanted(c.cfg, presets, lookup), lookup, old.Placeholders(), d.secretRemote())
	if err != nil {
		return nil, fmt.Errorf("reading secrets on the host: %w", err)
	}
	c.cur.Store(set)
	if err := d.keepPlaceholders(rec.Placeholders, set); err != nil {
		return nil, err
	}
	return set.Placeholders(), nil
}
