package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/gate"
	"moat.dev/moat/internal/lists"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/preset"
	"moat.dev/moat/internal/state"
)

// NetworkOptions are the gate's inputs.
type NetworkOptions struct {
	Config     config.Network
	UserConfig string // path of the user's config file: its layer is "user", every other file's "project"
	// Upstream are the host resolvers the gate asks; empty: the host's
	// /etc/resolv.conf.
	Upstream []netip.AddrPort
	// DiscoverRoots are root directories to read package-repository
	// settings from (apt sources, apk repositories, pip, npm): "/" for the
	// host image, the image's layers otherwise.
	DiscoverRoots []string
	// DiscoverHost also asks the host's own tools (go env, npm config).
	DiscoverHost bool
	// Audit bounds the audit log ([audit]); zero: the defaults.
	Audit config.Audit
}

// RuleSources are what a sandbox's rule layers are made of. The daemon,
// `moat network list` of a stopped sandbox and `moat policy show` all
// assemble them with Rules, so that they cannot disagree.
type RuleSources struct {
	Network    config.Network
	UserConfig string // the user's config.toml: its layer is "user", others "project"
	Presets    []string
	Runtime    *state.RuntimeRules
	Discovered []policy.Rule            // package repositories found on the host and in the image
	Loaded     map[string]*lists.Loaded // named policies' lists
}

// Rules assembles the policy's rules, lowest layer first: the named
// policies in `use`, in that order (default: "default", the built-in list
// plus the package repositories discovered on the host and in the image;
// a [policies.NAME] policy gives its inline rules and its list, from
// lists, as the named layer with source "policy NAME"), then the presets'
// layer, each configuration file's rules as the user or project layer,
// then the runtime layer. It fails on an unknown policy name or an entry
// that does not parse: a sandbox whose policy is not what the user wrote
// must not start with some other policy.
func Rules(s RuleSources) ([]policy.Rule, error) {
	n, userConfig, rt, discovered, loaded := s.Network, s.UserConfig, s.Runtime, s.Discovered, s.Loaded
	var out []policy.Rule
	use := n.Use
	if len(use) == 0 {
		use = []string{"default"}
	}
	for _, name := range use {
		switch name {
		case "default":
			out = append(out, policy.Builtin()...)
			out = append(out, discovered...)
		case "none":
		default:
			p, ok := n.Policies[name]
			if !ok {
				return nil, fmt.Errorf("network.use: unknown policy %q; define it with [policies.%s] in moat.toml or config.toml, or use default or none", name, name)
			}
			rs, err := namedRules(p, loaded[name])
			if err != nil {
				return nil, fmt.Errorf("policy %s: %w", name, err)
			}
			out = append(out, rs...)
		}
	}
	out = append(out, PresetRules(s.Presets)...)
	for _, l := range n.Layers {
		layer := policy.LayerProject
		if userConfig != "" && l.Source == userConfig {
			layer = policy.LayerUser
		}
		for _, e := range []struct {
			entries []string
			a       policy.Action
		}{{l.Allow, policy.Allow}, {l.Block, policy.Block}} {
			rs, err := policy.FromEntries(e.entries, e.a, layer, l.Source)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", l.Source, err)
			}
			out = append(out, rs...)
		}
	}
	if rt != nil {
		for _, e := range []struct {
			entries []string
			a       policy.Action
		}{{rt.Allow, policy.Allow}, {rt.Block, policy.Block}} {
			rs, err := policy.FromEntries(e.entries, e.a, policy.LayerRuntime, "runtime")
			if err != nil {
				return nil, fmt.Errorf("runtime rules: %w", err)
			}
			out = append(out, rs...)
		}
	}
	return out, nil
}

// PresetRules are the hosts and telemetry blocks of the agent presets
// used in the sandbox, as the preset layer: above the named policies, so
// `use = ["none"]` does not take an agent's API away, and below the
// user's and the project's files, so either can block what a preset
// allows, or allow what it blocks.
func PresetRules(presets []string) []policy.Rule {
	var out []policy.Rule
	for _, name := range presets {
		p, err := preset.Lookup(name)
		if err != nil {
			continue // a preset this moat no longer knows
		}
		// Its telemetry blocks too: a user's or project's allow, a higher
		// layer, overrides them.
		for _, e := range []struct {
			entries []string
			a       policy.Action
		}{{p.Hosts, policy.Allow}, {p.Block, policy.Block}} {
			rs, err := policy.FromEntries(e.entries, e.a, policy.LayerPreset, "preset "+name)
			if err != nil {
				// The presets' entries are tested (preset.TestPresetsAreValid).
				panic(fmt.Sprintf("preset %s: %v", name, err))
			}
			out = append(out, rs...)
		}
	}
	return out
}

// ApplyRuleChange changes the runtime layer of rec's sandbox: allow and
// block add entries (an entry is in one list at most, so allowing a
// blocked entry moves it), remove takes them out of both. Entries are
// checked first; nothing changes if one is bad.
func ApplyRuleChange(rec *state.Record, op string, entries []string) error {
	if rec.Rules == nil {
		rec.Rules = &state.RuntimeRules{}
	}
	rt := rec.Rules
	for _, e := range entries {
		if _, err := policy.ParseEntry(e); err != nil {
			return fmt.Errorf("%q: %w", e, err)
		}
	}
	del := func(list []string, e string) []string {
		return slices.DeleteFunc(list, func(s string) bool { return strings.EqualFold(s, e) })
	}
	switch op {
	case "allow", "block":
		for _, e := range entries {
			rt.Allow, rt.Block = del(rt.Allow, e), del(rt.Block, e)
			if op == "allow" {
				rt.Allow = append(rt.Allow, e)
			} else {
				rt.Block = append(rt.Block, e)
			}
		}
	case "remove":
		for _, e := range entries {
			n := len(rt.Allow) + len(rt.Block)
			rt.Allow, rt.Block = del(rt.Allow, e), del(rt.Block, e)
			if len(rt.Allow)+len(rt.Block) == n {
				return fmt.Errorf("%q is not a runtime rule of this sandbox (rules from moat.toml or config.toml are changed there; see: moat network list %s)", e, rec.Name)
			}
		}
	default:
		return fmt.Errorf("unknown rule operation %q: use allow, block or remove", op)
	}
	return nil
}

// network is the daemon's gate and what it needs to recompile its policy.
type network struct {
	o      NetworkOptions
	dir    string
	record func() (*state.Record, error) // the daemon's record (record.go)
	gate   *gate.Gate
	res    *gate.Resolver
	audit  *audit.Log
	ledger *audit.Ledger

	// holds is the interactive gate's held connections; hub sends the
	// gate's decisions to its watchers (watch.go).
	holds *gate.Holds
	hub   watchHub

	// mu serialises recompiles (a runtime change racing a discovery);
	// discovered is the discovered repositories and grants the allows a
	// watcher gave for this run, both guarded by mu.
	mu         sync.Mutex
	discovered []policy.Rule
	grants     []string

	named *namedLists // named policies' lists (policies.go)

	// settled closes once the start's own work is done: the host's
	// tools asked (discoverHost), or at once when they are not. discover
	// asks them, once: discoveryDelay after the guest runs, or as soon
	// as the gate is about to refuse a destination no rule decides
	// (settling). Nil when the host's tools are not asked.
	settled  chan struct{}
	discover func()
	// hurry, once a connection waits for the host's tools, gives them
	// the usual CPU priority (hostTools.hurry).
	hurry func()
	// late is set when a connection waited discoveryWait for the tools
	// in vain: later ones no longer wait for them.
	late atomic.Bool
}

// discoveryDelay is how long after the start the host's tools are asked
// for the package registries they use. `npm config get` alone takes a
// third of a second of CPU: on the start path it came out of runsc's boot
// (150 ms of a cold `moat run` on 2 cores), and right after it, even at
// the lowest priority, out of the first command (10-13 ms of a cold
// `moat run -- true`). The gate asks sooner when it needs the answer.
const discoveryDelay = time.Second

// discoveryWait bounds how long a connection waits for the host's tools
// before it is decided without what they would add. Each tool has 10 s;
// they usually answer within a second. A variable for tests.
var discoveryWait = 5 * time.Second

// settling is the gate's Options.Settling: a destination no rule decides
// waits until the host's tools have answered (asking them now if that has
// not started yet), at most discoveryWait. Once one connection has waited
// that long in vain, the others are decided at once: tools that hang
// must not make every refusal take seconds.
func (n *network) settling(ctx context.Context) bool {
	select {
	case <-n.settled:
		return false
	default:
	}
	if n.discover == nil || n.late.Load() {
		return false
	}
	n.discover()
	if n.hurry != nil {
		n.hurry()
	}
	t := time.NewTimer(discoveryWait)
	defer t.Stop()
	select {
	case <-n.settled:
		return true
	case <-t.C:
		n.late.Store(true)
	case <-ctx.Done():
	}
	return false
}

// startNetwork builds the gate. It fails if the policy does not compile:
// no policy means no sandbox, never a sandbox with an open network.
func (d *daemon) startNetwork(ctx context.Context) (*network, error) {
	o := d.o.Network
	servers := o.Upstream
	if len(servers) == 0 {
		s, err := gate.ServersFromResolvConf("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("reading the host's resolvers: %w", err)
		}
		servers = s
	}
	al, err := audit.OpenWith(state.AuditPath(d.o.Dir), audit.Options{
		MaxBytes: int64(o.Audit.MaxBytes), Retention: o.Audit.Retention, Logger: d.log.With("component", "audit")})
	if err != nil {
		return nil, fmt.Errorf("opening the audit log: %w", err)
	}
	n := &network{o: o, dir: d.o.Dir, record: d.record, audit: al, ledger: audit.NewLedger(1024), settled: make(chan struct{})}
	for _, root := range o.DiscoverRoots {
		n.discovered = append(n.discovered, policy.Discover(root, nil, func(string) string { return "" })...)
	}
	n.startLists(ctx, d)
	p, err := n.compile()
	if err != nil {
		al.Close()
		return nil, err
	}
	roots, err := upstreamRoots(o.Config.Trust)
	if err != nil {
		al.Close()
		return nil, err
	}
	n.res = gate.NewResolver(gate.ResolverOptions{Servers: servers})
	lim := d.gateLimits()
	n.holds = gate.NewHolds(gate.HoldsOptions{Timeout: holdTimeout(), Max: lim.holds})
	al.Tap(n.tap)
	n.gate = gate.New(gate.Options{
		Holds:         n.holds,
		Report:        o.Config.Mode == config.ModeReport,
		Certs:         d.ca,
		Credentials:   d.creds,
		Inspect:       o.Config.Inspect,
		UpstreamRoots: roots,
		Sandbox:       filepath.Base(d.o.Dir),
		Policy:        p,
		Resolver:      n.res,
		HostAddrs:     d.hostAddrs(),
		Audit:         al,
		Ledger:        n.ledger,
		Log:           d.log.With("component", "gate"),
		Settling:      n.settling,
		// Declared MCP servers: their calls are decided one by one.
		MCP: gate.MCPServers(o.Config.MCP),

		// What the gate holds for the sandbox at once (gatelimits.go).
		MaxConnections: lim.conns,
	})
	if o.DiscoverHost {
		// The host's tools are asked off the start path, at the lowest
		// CPU priority (see discoveryDelay). Until they answer, the
		// built-in list and the repositories read from files apply, and
		// a destination neither allows waits for them (settling): a
		// registry only they know, GOPROXY in the environment say, is
		// not refused to a first command or a set-up hook.
		var once sync.Once
		n.discover = func() {
			once.Do(func() {
				d.tasks.Go("discovering the host's repositories", func() {
					defer close(n.settled)
					n.discoverHost(ctx, d)
				})
			})
		}
		// A connection that waits for the tools raises their priority.
		var hurryOnce sync.Once
		n.hurry = func() {
			hurryOnce.Do(func() {
				if d.keeper == nil {
					d.tools.hurry()
					return
				}
				d.tasks.Go("hurrying the host's tools", func() {
					if _, err := d.keeper.call(ctx, "hurry", nil, nil); err != nil {
						d.log.Warn("asking the keeper to hurry the host's tools", "err", err)
					}
				})
			})
		}
		d.tasks.Go("discovery's delay", func() {
			select {
			case <-d.booted:
			case <-ctx.Done():
				return
			}
			t := time.NewTimer(discoveryDelay)
			defer t.Stop()
			select {
			case <-t.C:
				n.discover()
			case <-ctx.Done():
			}
		})
	} else {
		close(n.settled)
	}
	d.tasks.Go("preresolving", func() { n.gate.RunPreresolve(ctx) })
	return n, nil
}

// compile rebuilds the policy from the record's runtime rules.
func (n *network) compile() (*policy.Policy, error) {
	rec, err := n.record()
	if err != nil {
		return nil, err
	}
	rules, err := Rules(RuleSources{Network: n.o.Config, UserConfig: n.o.UserConfig, Presets: rec.Presets,
		Runtime: rec.Rules, Discovered: n.discovered, Loaded: n.named.get()})
	if err != nil {
		return nil, err
	}
	rules = append(rules, n.grantRules()...)
	// Lowest layer first, as `moat network list` shows them.
	slices.SortStableFunc(rules, func(a, b policy.Rule) int { return int(a.Layer) - int(b.Layer) })
	return policy.Compile(rules), nil
}

func (n *network) recompile() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, err := n.compile()
	if err != nil {
		return err
	}
	n.gate.SetPolicy(p)
	return nil
}

// discoverHost adds what the host's tools say (hostTools, run by the
// keeper: the gate process's jail runs no program) to the discovered
// layer.
func (n *network) discoverHost(ctx context.Context, d *daemon) {
	var found []policy.Rule
	if d.keeper == nil {
		found = d.tools.discover(ctx)
	} else {
		var rs []discoveredRule
		if _, err := d.keeper.call(ctx, "discover", nil, &rs); err != nil {
			d.log.Warn("asking the keeper for the host's package repositories", "err", err)
			return
		}
		for _, r := range rs {
			got, err := policy.ParseEntry(r.Entry)
			if err != nil {
				d.log.Warn("a discovered repository moat cannot write as a rule", "entry", r.Entry, "err", err)
				continue
			}
			got.Action, got.Layer, got.Source = policy.Allow, policy.LayerNamed, r.Source
			found = append(found, got)
		}
	}
	n.mu.Lock()
	n.discovered = mergeRules(n.discovered, found)
	n.mu.Unlock()
	if err := n.recompile(); err != nil {
		d.log.Warn("recompiling the policy after discovery", "err", err)
	}
}

// hostTools runs the host's package tools (go env, npm config) for
// discovery, each bounded in time, at the lowest CPU priority until a
// connection waits for their answer (hurry): on a busy host a tool at
// that priority may not run for seconds, and a connection's wait is
// bounded by discoveryWait, not by them.
type hostTools struct {
	mu      sync.Mutex
	hurried bool
	running map[int]bool // the tools' pids while they run
}

// discover asks the host's tools which package repositories they use.
func (h *hostTools) discover(ctx context.Context) []policy.Rule {
	return policy.Discover("/", func(name string, args ...string) (string, error) {
		return h.run(ctx, name, args...)
	}, os.Getenv)
}

// run runs one tool and returns its output.
func (h *hostTools) run(ctx context.Context, name string, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out strings.Builder
	cmd := exec.CommandContext(cctx, name, args...)
	cmd.Stdout = &out
	// A daemon that stops (or is killed) while a tool still runs
	// takes it along; cancelling cctx alone left it running on its
	// own when the daemon exited first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	pid := cmd.Process.Pid
	h.mu.Lock()
	if !h.hurried {
		unix.Setpriority(unix.PRIO_PROCESS, pid, 19)
	}
	if h.running == nil {
		h.running = map[int]bool{}
	}
	h.running[pid] = true
	h.mu.Unlock()
	err := cmd.Wait()
	h.mu.Lock()
	delete(h.running, pid)
	h.mu.Unlock()
	return out.String(), err
}

// hurry gives the tools running now, and those to come, the usual CPU
// priority. Unprivileged (rootless), a process cannot raise a priority
// it lowered: the tools then stay at the lowest.
func (h *hostTools) hurry() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hurried = true
	for pid := range h.running {
		unix.Setpriority(unix.PRIO_PROCESS, pid, 0)
	}
}

func mergeRules(a, b []policy.Rule) []policy.Rule {
	seen := map[string]bool{}
	var out []policy.Rule
	for _, r := range append(slices.Clone(a), b...) {
		k := r.Action.String() + " " + r.Entry
		if !seen[k] {
			seen[k] = true
			out = append(out, r)
		}
	}
	return out
}

func (n *network) close() {
	n.res.Close()
	n.audit.Close()
}

func (d *daemon) handleRules(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, rulesBody(d.net.gate.Policy()))
}

func rulesBody(p *policy.Policy) control.Rules {
	out := control.Rules{Schema: control.Schema, Rules: []control.Rule{}}
	if p != nil {
		out.Rules = control.RulesOf(p.Rules())
	}
	return out
}

func (d *daemon) handleChangeRules(w http.ResponseWriter, r *http.Request) {
	var ch control.RuleChange
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&ch); err != nil {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: "reading the rule change: " + err.Error()})
		return
	}
	err := d.updateRecord(func(rec *state.Record) error {
		return ApplyRuleChange(rec, ch.Op, ch.Entries)
	})
	if err != nil {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
		return
	}
	if err := d.net.recompile(); err != nil {
		// Fail closed: the old policy stays, and the caller is told.
		writeJSON(w, http.StatusInternalServerError, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
		return
	}
	d.log.Info("network rules changed", "op", ch.Op, "entries", ch.Entries)
	writeJSON(w, http.StatusOK, rulesBody(d.net.gate.Policy()))
}

func (d *daemon) handleDenials(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, control.Denials{Schema: control.Schema, Total: d.net.ledger.Total(), Entries: d.net.ledger.Entries()})
}
