// Package forward decides a sandbox's port forwards: which host ports the
// daemon listens on for the guest (host → guest, like ssh -L) and which
// ports of the guest's gateway reach the host's loopback (guest → host,
// like ssh -R, the "reverse" forwards).
//
// It is pure: the forward specs a person types, the set of forwards in
// force (the configuration's, then the ones added at run time and kept in
// the sandbox's record) and the table the netstack's front end asks at
// each connection to the gateway. The listeners and the copying live in
// the daemon (internal/daemon/forward.go).
//
// A reverse forward opens exactly one host port on 127.0.0.1, named by
// the user: no ranges, no wildcards, no other host address, and nothing
// but TCP ports 1-65535. The daemon's control socket is a unix socket, so
// no forward can name it. The gateway's other ports stay refused, and the
// refusal is audited, so the guest can never reach the host's loopback
// as a whole (threat model 18-22).
package forward

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/state"
)

// Sources of a forward, as `moat forward list` shows them.
const (
	SourceConfig  = "config"  // [forwards] in moat.toml or config.toml
	SourceRuntime = "runtime" // moat forward add
)

// DefaultAddress is where host → guest forwards listen unless the user
// names another address: only this host's own processes reach them.
const DefaultAddress = "127.0.0.1"

// ErrSpec is wrapped by every error about a spec a person typed.
var ErrSpec = errors.New("bad port forward")

// Hint says how a spec is written.
const Hint = `write a port (3000) or HOST:GUEST (8080:80), ports 1-65535`

// Parse reads a spec: "PORT" (the same port on both sides) or
// "HOST:GUEST". pair says the spec named both ports, which makes a
// remove match both.
func Parse(spec string) (f state.Forward, pair bool, err error) {
	h, g, pair := strings.Cut(strings.TrimSpace(spec), ":")
	if !pair {
		g = h
	}
	hp, err1 := parsePort(h)
	gp, err2 := parsePort(g)
	if err1 != nil || err2 != nil {
		return state.Forward{}, false, fmt.Errorf("%w: %q is not a port forward; %s", ErrSpec, spec, Hint)
	}
	return state.Forward{Host: hp, Guest: gp}, pair, nil
}

// parsePort takes decimal digits only: ParseUint alone would take "+80"
// nowhere, but "0x50" or "80-90" must not slip through a later change.
func parsePort(s string) (uint16, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errors.New("not a port")
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, errors.New("not a port")
	}
	return uint16(n), nil
}

// CheckAddress checks the host address a host → guest forward listens
// on: an IP literal, so that what the user reads in `moat forward list`
// is exactly what is exposed. It returns the address as stored in a
// state.Forward: "" for DefaultAddress.
func CheckAddress(addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil || ip.Zone() != "" {
		return "", fmt.Errorf("%w: --address %q is not an IP address; write e.g. --address 127.0.0.1, or 0.0.0.0 for every address", ErrSpec, addr)
	}
	if ip.String() == DefaultAddress {
		return "", nil
	}
	return ip.String(), nil
}

// Entry is one forward in force.
type Entry struct {
	Reverse bool // guest → host
	state.Forward
	Source string // SourceConfig or SourceRuntime
}

// ListenPort is the port a forward listens on: the host's for host →
// guest, the gateway's for guest → host. No two forwards of one
// direction share it.
func (e Entry) ListenPort() uint16 {
	if e.Reverse {
		return e.Guest
	}
	return e.Host
}

// ListenAddress is the host address a host → guest forward listens on.
func (e Entry) ListenAddress() string {
	if e.Address == "" {
		return DefaultAddress
	}
	return e.Address
}

// Spec is the entry as a person writes it.
func (e Entry) Spec() string {
	if e.Host == e.Guest {
		return strconv.Itoa(int(e.Host))
	}
	return fmt.Sprintf("%d:%d", e.Host, e.Guest)
}

// Entries are the forwards in force: the configuration's first, then the
// runtime ones. A runtime forward on a port the configuration already
// uses (after `moat up --reconfigure` added it there) is left out: the
// configuration wins.
func Entries(cfg config.Forwards, rt *state.RuntimeForwards) []Entry {
	var out []Entry
	add := func(e Entry) {
		if !slices.ContainsFunc(out, func(o Entry) bool { return o.Reverse == e.Reverse && o.ListenPort() == e.ListenPort() }) {
			out = append(out, e)
		}
	}
	for _, f := range cfg.Ports {
		add(Entry{Forward: state.Forward{Host: f.Host, Guest: f.Guest}, Source: SourceConfig})
	}
	for _, f := range cfg.Reverse {
		add(Entry{Reverse: true, Forward: state.Forward{Host: f.Host, Guest: f.Guest}, Source: SourceConfig})
	}
	if rt != nil {
		for _, f := range rt.Ports {
			add(Entry{Forward: f, Source: SourceRuntime})
		}
		for _, f := range rt.Reverse {
			add(Entry{Reverse: true, Forward: f, Source: SourceRuntime})
		}
	}
	return out
}

// Add adds a runtime forward to rt, refusing one whose listening port is
// taken by another forward of the same direction. Adding a forward that
// is already there is not an error. sandbox is the name errors' commands
// use.
func Add(rt *state.RuntimeForwards, cfg config.Forwards, sandbox string, reverse bool, f state.Forward) error {
	if reverse && f.Address != "" {
		return fmt.Errorf("%w: a reverse forward always reaches 127.0.0.1 on the host; drop --address", ErrSpec)
	}
	e := Entry{Reverse: reverse, Forward: f, Source: SourceRuntime}
	for _, o := range Entries(cfg, rt) {
		if o.Reverse != reverse || o.ListenPort() != e.ListenPort() {
			continue
		}
		if o.Forward == f {
			return nil
		}
		if o.Source == SourceConfig {
			return fmt.Errorf("%w: %s is already forwarded by [forwards] in moat.toml or config.toml (%s); pick another port",
				ErrSpec, describePort(reverse, e.ListenPort()), o.Spec())
		}
		return fmt.Errorf("%w: %s is already forwarded (%s); remove it first with: moat forward remove%s %s %d",
			ErrSpec, describePort(reverse, e.ListenPort()), o.Spec(), reverseFlag(reverse), sandbox, o.ListenPort())
	}
	if reverse {
		rt.Reverse = append(rt.Reverse, f)
	} else {
		rt.Ports = append(rt.Ports, f)
	}
	return nil
}

// Remove takes a runtime forward out of rt: the one listening on the
// spec's port, and when the spec named both ports, only if it forwards
// to the other. A forward from the configuration is refused with where
// to change it.
func Remove(rt *state.RuntimeForwards, cfg config.Forwards, sandbox string, reverse bool, f state.Forward, pair bool) (Entry, error) {
	e := Entry{Reverse: reverse, Forward: f}
	match := func(o Entry) bool {
		return o.Reverse == reverse && o.ListenPort() == e.ListenPort() && (!pair || (o.Host == f.Host && o.Guest == f.Guest))
	}
	for _, o := range Entries(cfg, nil) {
		if match(o) {
			return Entry{}, fmt.Errorf("%w: %s comes from [forwards] in moat.toml or config.toml; remove it there and run: moat up --reconfigure", ErrSpec, o.Spec())
		}
	}
	list := &rt.Ports
	if reverse {
		list = &rt.Reverse
	}
	for i, o := range *list {
		if match(Entry{Reverse: reverse, Forward: o}) {
			*list = slices.Delete(*list, i, i+1)
			return Entry{Reverse: reverse, Forward: o, Source: SourceRuntime}, nil
		}
	}
	return Entry{}, fmt.Errorf("%w: no %s forward added on %s; see: moat forward list %s", ErrSpec, direction(reverse), describePort(reverse, e.ListenPort()), sandbox)
}

func describePort(reverse bool, port uint16) string {
	if reverse {
		return fmt.Sprintf("gateway port %d", port)
	}
	return fmt.Sprintf("host port %d", port)
}

func direction(reverse bool) string {
	if reverse {
		return "guest → host"
	}
	return "host → guest"
}

func reverseFlag(reverse bool) string {
	if reverse {
		return " --reverse"
	}
	return ""
}

// CheckMCP refuses a reverse forward that would meet a host-local MCP
// server ([mcp.NAME] url = "http://127.0.0.1:PORT/..."): on the gateway's
// side the server owns its port, and a forward to the server's host port
// would carry raw bytes to it, around the rules its declaration sets.
func CheckMCP(servers map[string]config.MCPServer, f state.Forward) error {
	for _, s := range config.SortedMCP(servers) {
		switch {
		case !s.Local:
		case f.Guest == s.Port:
			return fmt.Errorf("%w: gateway port %d is MCP server %s's (%s); pick another guest port", ErrSpec, f.Guest, s.Name, s.Source)
		case f.Host == s.Port:
			return fmt.Errorf("%w: host port %d is MCP server %s's (%s), which the guest reaches through the gate's rules at 10.88.0.1:%d; a forward would bypass them", ErrSpec, f.Host, s.Name, s.Source, s.Port)
		}
	}
	return nil
}

// Table is the reverse forwards as the netstack's front end asks them:
// gateway port → host port. A Table is immutable; the daemon swaps in a
// new one on each change, so a lookup never takes a lock.
type Table map[uint16]uint16

// ReverseTable builds the table of the reverse entries.
func ReverseTable(es []Entry) Table {
	t := Table{}
	for _, e := range es {
		if e.Reverse {
			t[e.Guest] = e.Host
		}
	}
	return t
}

// Lookup returns the host port a connection to the gateway's port goes
// to; ok is false for every port that is not forwarded.
func (t Table) Lookup(gatewayPort uint16) (hostPort uint16, ok bool) {
	hostPort, ok = t[gatewayPort]
	return hostPort, ok && hostPort != 0
}
