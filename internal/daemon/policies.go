package daemon

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/lists"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/state"
)

// Named policies with a source: their lists are loaded at start, refreshed
// in the background at their interval, and swapped into the gate live
// through the same recompile a runtime rule change uses.

// startFetchTimeout bounds the fetch of lists never fetched before, on the
// start path: long enough for a big list on a slow link, short enough that
// an unreachable source delays a start only a little (the sandbox then
// starts with the layer empty and a warning).
const startFetchTimeout = 20 * time.Second

// retryAfter is how soon a failed refresh is tried again, when the
// policy's own interval is longer.
const retryAfter = 10 * time.Minute

// LoadLists loads the lists of the named policies n uses that have a
// source, by policy name. With fetch, a list never fetched, or older than
// its refresh interval, is fetched first; without, only the cache and
// files are read. It never fails: see lists.Cache.Load.
func LoadLists(ctx context.Context, cache ListLoader, n config.Network, fetch bool) map[string]*lists.Loaded {
	out := map[string]*lists.Loaded{}
	for _, name := range n.Use {
		p, ok := n.Policies[name]
		if !ok || p.Source == "" {
			continue
		}
		out[name] = cache.Load(ctx, name, p.Source, p.Refresh, fetch)
	}
	return out
}

// namedRules are the rules of the named policy p: its inline entries and
// its list, as the named layer, with source "policy NAME".
func namedRules(p config.Policy, l *lists.Loaded) ([]policy.Rule, error) {
	src := "policy " + p.Name
	var out []policy.Rule
	for _, e := range []struct {
		entries []string
		a       policy.Action
	}{{p.Allow, policy.Allow}, {p.Block, policy.Block}} {
		rs, err := policy.FromEntries(e.entries, e.a, policy.LayerNamed, src)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	if l != nil {
		out = append(out, l.Parsed.Rules(policy.LayerNamed, src)...)
	}
	return out, nil
}

// ListLoader loads a named policy's list: a *lists.Cache, or in the gate
// process the keeper, which reads the cache for it (keeperLists).
type ListLoader interface {
	Load(ctx context.Context, name, source string, maxAge time.Duration, fetch bool) *lists.Loaded
}

// keeperLists loads lists through the keeper: the gate process's jail
// has no cache directory. The keeper loads a list by the policy's name,
// from the source its own copy of the configuration gives.
type keeperLists struct{ d *daemon }

func (k keeperLists) Load(ctx context.Context, name, _ string, maxAge time.Duration, fetch bool) *lists.Loaded {
	var l lists.Loaded
	if _, err := k.d.keeper.call(ctx, "list", listRequest{Name: name, MaxAge: maxAge, Fetch: fetch}, &l); err != nil {
		return &lists.Loaded{Name: name, Parsed: &lists.Parsed{}, Warnings: []string{fmt.Sprintf("policy %s: its list could not be loaded (%v)", name, err)}}
	}
	if l.Parsed == nil {
		l.Parsed = &lists.Parsed{}
	}
	return &l
}

// CacheFor is the list cache of the moat home the process runs under.
func CacheFor() (*lists.Cache, error) {
	d, err := state.Resolve()
	if err != nil {
		return nil, err
	}
	return &lists.Cache{Dir: lists.CacheDir(d)}, nil
}

// namedLists are a running daemon's loaded lists.
type namedLists struct {
	cache  ListLoader
	config config.Network

	mu     sync.Mutex // guards loaded
	loaded map[string]*lists.Loaded
}

// startLists loads the lists of the policies the sandbox uses (fetching
// those never fetched, bounded by startFetchTimeout) and starts their
// refreshes, which stop with ctx.
func (n *network) startLists(ctx context.Context, d *daemon) {
	var cache ListLoader = keeperLists{d}
	if d.keeper == nil {
		c, err := CacheFor()
		if err != nil {
			d.log.Warn("finding the list cache; named policies' lists stay empty", "err", err)
			c = &lists.Cache{Dir: ""}
		}
		cache = c
	}
	nl := &namedLists{cache: cache, config: n.o.Config}
	sctx, cancel := context.WithTimeout(ctx, startFetchTimeout)
	// An infinite age: a copy already cached is used as it is now and
	// refreshed in the background, off the start path.
	nl.loaded = LoadLists(sctx, cache, withRefresh(n.o.Config, 1<<62), true)
	cancel()
	for _, l := range nl.loaded {
		for _, w := range l.Warnings {
			d.log.Warn(w)
		}
	}
	n.named = nl
	for _, name := range slices.Sorted(maps.Keys(nl.loaded)) {
		d.tasks.Go("refreshing the policy list "+name, func() { nl.refreshLoop(ctx, n, d, name) })
	}
}

// withRefresh is n with every policy's refresh interval set to age.
func withRefresh(n config.Network, age time.Duration) config.Network {
	n.Policies = maps.Clone(n.Policies)
	for k, p := range n.Policies {
		p.Refresh = age
		n.Policies[k] = p
	}
	return n
}

// get is the lists as they are now; nil-safe, so a network without
// named lists (tests) compiles from the inline rules alone.
func (nl *namedLists) get() map[string]*lists.Loaded {
	if nl == nil {
		return nil
	}
	nl.mu.Lock()
	defer nl.mu.Unlock()
	return maps.Clone(nl.loaded)
}

func (nl *namedLists) set(name string, l *lists.Loaded) {
	nl.mu.Lock()
	nl.loaded[name] = l
	nl.mu.Unlock()
}

// warnings are the lists' warnings, by policy name order.
func (nl *namedLists) warnings() []string {
	var out []string
	m := nl.get()
	for _, name := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[name].Warnings...)
	}
	return out
}

// refreshLoop fetches the list of policy name again whenever it is older
// than its interval, and swaps the policy when it changed.
func (nl *namedLists) refreshLoop(ctx context.Context, n *network, d *daemon, name string) {
	// The gate exists once the guest has booted; until then there is
	// nothing to swap a policy into.
	select {
	case <-d.booted:
	case <-ctx.Done():
		return
	}
	p := nl.config.Policies[name]
	l := nl.get()[name]
	wait := p.Refresh
	switch {
	case lists.IsURL(p.Source) && l.Fetched.IsZero():
		wait = min(p.Refresh, retryAfter) // never fetched: try again soon
	case !l.Fetched.IsZero():
		wait = time.Until(l.Fetched.Add(p.Refresh))
	}
	for {
		t := time.NewTimer(max(wait, time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		fresh := nl.cache.Load(ctx, name, p.Source, p.Refresh, true)
		if ctx.Err() != nil {
			return
		}
		nl.set(name, fresh)
		wait = p.Refresh
		if lists.IsURL(p.Source) && fresh.Fetched.Equal(l.Fetched) && len(fresh.Warnings) > 0 {
			// The refresh failed and the old copy (or none) stands:
			// nothing to recompile; try again sooner than an interval.
			d.log.Warn("refreshing a named policy's list failed", "policy", name, "warnings", fresh.Warnings)
			wait = min(p.Refresh, retryAfter)
			l = fresh
			continue
		}
		l = fresh
		if err := n.recompile(); err != nil {
			d.log.Warn("recompiling the policy after a list refresh", "policy", name, "err", err)
			continue
		}
		d.log.Info("named policy's list refreshed", "policy", name, "entries", fresh.Parsed.Entries())
	}
}

// reload reads every list again from the cache and the files, without
// fetching (`moat policy refresh` has just fetched them), and recompiles.
func (nl *namedLists) reload(ctx context.Context, n *network) error {
	fresh := LoadLists(ctx, nl.cache, nl.config, false)
	nl.mu.Lock()
	nl.loaded = fresh
	nl.mu.Unlock()
	return n.recompile()
}

// policyWarnings are the named policies' warnings for `moat status`.
func (n *network) policyWarnings() []string {
	if n == nil {
		return nil
	}
	return n.named.warnings()
}

// handleReloadPolicies is POST /v1/policies/reload.
func (d *daemon) handleReloadPolicies(w http.ResponseWriter, r *http.Request) {
	if d.net == nil || d.net.named == nil {
		writeJSON(w, http.StatusOK, control.PolicyReload{Schema: control.Schema})
		return
	}
	if err := d.net.named.reload(r.Context(), d.net); err != nil {
		// Fail closed: the old policy stays, and the caller is told.
		writeJSON(w, http.StatusInternalServerError, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, control.PolicyReload{Schema: control.Schema, Warnings: d.net.policyWarnings()})
}
