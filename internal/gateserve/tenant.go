package gateserve

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/gate"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/secret"
)

// rules is what a tenant's policy files say, read and checked: everything a
// reload may change.
type rules struct {
	network config.Network
	audit   config.Audit
	secrets map[string]config.Secret
	policy  *policy.Policy
	roots   *x509.CertPool // nil: the system's
}

// readRules reads a tenant's policy files, lowest layer first, with moat's
// own parser (strict; errors name file:line), and compiles them the way a
// sandbox's daemon does (daemon.Rules). Only [network], [policies],
// [secrets] and [audit] mean anything to the service: a file that sets
// anything else is refused rather than half read.
func readRules(t Tenant, system *x509.CertPool) (*rules, error) {
	var files []*config.File
	for _, p := range t.Policy {
		f, err := config.ParseFile(p)
		if err != nil {
			return nil, fmt.Errorf("tenant %s: %w", t.Name, err)
		}
		files = append(files, f)
	}
	return compileRules(t, files, system)
}

// compileRules is readRules for files already parsed (a policy from a
// Kubernetes ConfigMap is no file of the service's).
func compileRules(t Tenant, files []*config.File, system *x509.CertPool) (*rules, error) {
	for _, f := range files {
		if err := onlyGateTables(f); err != nil {
			return nil, fmt.Errorf("tenant %s: %w", t.Name, err)
		}
	}
	merged := config.Merge(files...)
	if err := merged.Validate(); err != nil {
		return nil, fmt.Errorf("tenant %s: %w", t.Name, err)
	}
	for name, s := range merged.Secrets {
		if strings.HasPrefix(s.From, "command:") && !slices.Contains(t.Pushed, name) {
			return nil, fmt.Errorf("tenant %s: secret %s (%s): the gate service runs jailed and cannot run commands; read it from env: or file:", t.Name, name, s.Source)
		}
	}
	// A policy's list is loaded by the sandbox's keeper; the service does
	// not load lists yet, and a list left out would drop its rules
	// without a word.
	for name, p := range merged.Network.Policies {
		if p.Source != "" {
			return nil, fmt.Errorf("tenant %s: [policies.%s] in %s reads a list from %s, which the gate service does not load yet; give its rules as allow and block, or remove source", t.Name, name, p.File, p.Source)
		}
	}
	rs, err := daemon.Rules(daemon.RuleSources{Network: merged.Network})
	if err != nil {
		return nil, fmt.Errorf("tenant %s: %w", t.Name, err)
	}
	slices.SortStableFunc(rs, func(a, b policy.Rule) int { return int(a.Layer) - int(b.Layer) })
	r := &rules{network: merged.Network, audit: merged.Audit, secrets: merged.Secrets, policy: policy.Compile(rs)}
	if len(merged.Network.Trust) > 0 {
		r.roots = system.Clone()
		if err := daemon.AppendTrust(r.roots, merged.Network.Trust); err != nil {
			return nil, fmt.Errorf("tenant %s: %w", t.Name, err)
		}
	}
	return r, nil
}

// onlyGateTables refuses a file that configures a sandbox: the service
// would ignore it, and the person who wrote it would think it applied.
func onlyGateTables(f *config.File) error {
	for _, x := range []struct {
		table string
		v     any
	}{{"[sandbox]", f.Sandbox}, {"[[shares]]", f.Shares}, {"[[files]]", f.Files}, {"[env]", f.Env},
		{"[forwards]", f.Forwards}, {"[hooks]", f.Hooks}, {"[ssh_agent]", f.SSHAgent}} {
		if !reflect.ValueOf(x.v).IsZero() {
			return fmt.Errorf("%s: %s configures a sandbox, not the gate service; remove it (the service reads [network], [policies], [secrets] and [audit])", f.Path, x.table)
		}
	}
	return nil
}

// secretsTimeout bounds reading a tenant's secrets.
const secretsTimeout = 10 * time.Second

// resolveSecrets reads the values (from the service's environment and
// files, as moat reads them), keeping the placeholders already handed out.
func resolveSecrets(r *rules, placeholders map[string]string) (*secret.Set, error) {
	ctx, cancel := context.WithTimeout(context.Background(), secretsTimeout)
	defer cancel()
	return secret.ResolveWith(ctx, r.secrets, os.LookupEnv, placeholders)
}

// credentials is a tenant's secrets, swapped whole on reload: a request
// sees one set or the other, never a mix. pending is the pushed secrets
// that have no value yet (control.go); nil: none.
type credentials struct {
	cur     atomic.Pointer[secret.Set]
	pending atomic.Pointer[secret.Set]
	// waiting says where pending values come from, for the refusal; ""
	// the control socket's.
	waiting string
}

var _ gate.Credentials = (*credentials)(nil)

// Bound counts a pending secret's hosts too: their traffic must be
// intercepted to be refused, not spliced past the gate.
func (c *credentials) Bound(host string) bool {
	return c.cur.Load().Bound(host) || c.pending.Load().Bound(host)
}

func (c *credentials) Request(host string, h http.Header, u *url.URL) (secret.Applied, error) {
	if p := c.pending.Load(); p.Bound(host) {
		if c.waiting != "" {
			return nil, fmt.Errorf("secrets %s have no value: %s; requests to their hosts are refused until they do (fail closed)", strings.Join(p.Names(), ", "), c.waiting)
		}
		return nil, pendingError(p)
	}
	return c.cur.Load().Request(host, h, u)
}
func (c *credentials) ScrubHeader(h http.Header)               { c.cur.Load().ScrubHeader(h) }
func (c *credentials) ScrubBody(b io.ReadCloser) io.ReadCloser { return c.cur.Load().ScrubBody(b) }
func (c *credentials) ScrubString(s string) string             { return c.cur.Load().ScrubString(s) }
func (c *credentials) Scrubs() bool                            { return c.cur.Load().Scrubs() }

// readPlaceholders reads NAME=placeholder lines; a missing file is empty.
func readPlaceholders(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok && k != "" && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out, nil
}

// writePlaceholders writes the placeholders (never values) for whoever
// starts the tenant's clients, atomically, when they changed.
func writePlaceholders(path string, ph map[string]string) error {
	old, _ := readPlaceholders(path)
	if old != nil && maps.Equal(old, ph) {
		return nil
	}
	names := slices.Collect(maps.Keys(ph))
	sort.Strings(names)
	var b bytes.Buffer
	b.WriteString("# moat gate serve: each secret's placeholder; a client sends the placeholder, the gate swaps in the value\n")
	for _, n := range names {
		fmt.Fprintf(&b, "%s=%s\n", n, ph[n])
	}
	return writeFileAtomic(path, b.Bytes(), 0o644)
}
