package dockerrt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
)

// Names of a sandbox's Docker objects. Frozen: Down finds an older moat's
// objects by them (and by the label).
func (r *Record) InternalNet() string { return "moat-" + r.Name + "-int" }
func (r *Record) EgressNet() string   { return "moat-" + r.Name + "-egress" }
func (r *Record) GateName() string    { return "moat-" + r.Name + "-gate" }
func (r *Record) WorkName() string    { return "moat-" + r.Name + "-work" }

// NetName is the network holder's container: it owns the workload's
// network namespace, which moat isolates before the workload joins it
// (engine/sandbox.go says why).
func (r *Record) NetName() string { return "moat-" + r.Name + "-net" }

// Label marks every object of a sandbox, with its name as the value.
const Label = "moat.sandbox"

// Paths inside the gate container: its directory, from the sandbox's
// state directory (gate/), holds the configuration, the tenant's policy
// and the service's state (CA, audit).
const (
	gateDir    = "/moat-gate"
	gateConfig = gateDir + "/gate.toml"
	gatePolicy = gateDir + "/policy.toml"
	// gatePresets is the tenant's lowest policy file: the sandbox's
	// presets (preset.go).
	gatePresets = gateDir + "/preset.toml"
	gateState   = gateDir + "/state"
	// gateControl is the gate service's control socket, where moat
	// pushes the values of env: and command: secrets (ControlSocket).
	gateControl = gateDir + "/control/control.sock"
	// tenant is the workload's tenant name in the gate's configuration.
	tenant = "workload"
)

// subnetPool is where internal subnets are taken from, a /24 each: a
// private range Docker's default address pools (172.17.0.0/12 and
// 192.168.0.0/16) leave alone.
var subnetPool = netip.MustParsePrefix("10.213.0.0/16")

// ErrNoSubnet is returned when every /24 of the pool is taken.
var ErrNoSubnet = errors.New("no free /24 in " + subnetPool.String() + " for the sandbox's internal network")

// PickSubnet returns the first /24 of the pool that overlaps none of used
// (the host's routes and Docker's networks).
func PickSubnet(used []netip.Prefix) (netip.Prefix, error) {
	base := subnetPool.Addr().As4()
	for i := 0; i < 256; i++ {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{base[0], base[1], byte(i), 0}), 24)
		free := true
		for _, u := range used {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			return p, nil
		}
	}
	return netip.Prefix{}, ErrNoSubnet
}

// HostAt is the address n of subnet (.1 bridge, .2 gate, .3 workload).
func HostAt(subnet netip.Prefix, n byte) netip.Addr {
	a := subnet.Addr().As4()
	a[3] = n
	return netip.AddrFrom4(a)
}

// Place puts the sandbox on subnet: the gate at .2, the workload at .3,
// and the internal bridge's interface named after the sandbox, at most 15
// bytes (an interface name's limit) whatever the name's length.
func (r *Record) Place(subnet netip.Prefix) {
	r.Subnet = subnet
	r.GateIP, r.WorkloadIP = HostAt(subnet, 2), HostAt(subnet, 3)
	sum := sha256.Sum256([]byte(r.Name))
	r.Bridge = "moat" + hex.EncodeToString(sum[:4])
}

// AssignRange is the part of subnet Docker assigns containers addresses
// from: its lower half (.1 bridge, .2 gate, .3 workload are in it).
func AssignRange(subnet netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(subnet.Masked().Addr(), subnet.Bits()+1)
}

// NamesRange is the gate's names range on subnet: its upper half, which
// Docker never assigns (AssignRange). The gate answers each name with an
// address of it, and decides TCP to it on any port by the name
// (docs/gate-service.md, "Other ports"); the workload's one route, to
// its subnet, covers it, and the gate answers ARP for it.
func NamesRange(subnet netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(HostAt(subnet, 128), subnet.Bits()+1)
}

// GateArgs are the gate container's arguments to moat-gate, its image's
// entry point.
func GateArgs() []string { return []string{"serve", "--config", gateConfig} }

// GateConfig is the gate service's configuration for a sandbox: listeners
// on the gate's internal address only (the egress side serves nobody),
// the subnet's upper half as its names range, one tenant, the workload's
// address, whose secrets named in pushed have their values pushed over
// the control socket.
func GateConfig(subnet netip.Prefix, gate, workload netip.Addr, upstream []netip.AddrPort, pushed []string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Written by moat for a sandbox on Docker; replaced at each start.\n")
	fmt.Fprintf(&b, "[service]\nstate_dir = %q\nnames = %q\ncontrol = %q\n\n", gateState, NamesRange(subnet).String(), gateControl)
	fmt.Fprintf(&b, "[listen]\ndns = [\"%s:53\"]\nhttp = [\"%s:80\"]\nhttps = [\"%s:443\"]\n\n", gate, gate, gate)
	if len(upstream) > 0 {
		var us []string
		for _, u := range upstream {
			us = append(us, fmt.Sprintf("%q", u.String()))
		}
		fmt.Fprintf(&b, "[upstream]\ndns = [%s]\n\n", strings.Join(us, ", "))
	}
	fmt.Fprintf(&b, "[tenants.%s]\nsources = [\"%s\"]\npolicy = [%q, %q]\n", tenant, workload, gatePresets, gatePolicy)
	// Refusal pages: the workload's rules come from the project's
	// moat.toml and the user's config.toml, copied in at each session.
	fmt.Fprintf(&b, "rules_at = %q\n", "moat.toml or your config.toml, applied at the next session")
	if len(pushed) > 0 {
		var ps []string
		for _, p := range pushed {
			ps = append(ps, fmt.Sprintf("%q", p))
		}
		fmt.Fprintf(&b, "pushed = [%s]\n", strings.Join(ps, ", "))
	}
	return b.Bytes()
}

// gateTables are the tables of moat.toml the gate service reads. [mcp]
// too: the gate decides a declared server's calls by tool, and allows
// its URL.
var gateTables = []string{"network", "policies", "audit", "secrets", "mcp"}

// Policy is the tenant's policy file and what the gate container needs
// for it.
type Policy struct {
	TOML []byte
	// SecretFiles are the files of file: secrets, which the gate
	// container gets read-only at the same paths: never copied.
	SecretFiles []string
	// Pushed maps the env: and command: secrets to their sources: moat
	// reads them on the host and pushes the values over the gate's
	// control socket (a container's environment would show them to
	// `docker inspect`).
	Pushed map[string]string
	// Dropped names the secrets left out: a file: source that is not
	// an absolute path.
	Dropped []string
	// Defined names every secret of the files, dropped ones too: a
	// preset's credential of such a name is not the preset's to set.
	Defined []string
}

// PushedNames are the names of pol's pushed secrets, sorted.
func (pol *Policy) PushedNames() []string {
	var out []string
	for n := range pol.Pushed {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// PolicyFile makes the tenant's policy from moat.toml-syntax files,
// lowest layer first: their [network], [policies] and [audit] tables, in
// one file (the service refuses a file with [sandbox] or [hooks]), later
// files' lists after earlier ones' as config.Merge would union them.
// trust maps each [network] trust path to the path the gate sees it at.
//
// [secrets] are kept, and a narrower file's secret replaces a wider
// one's whole, as config.Merge does: one read from a file (from =
// "file:/path") is the gate's to read, through a read-only bind; one
// from env: or command: is pushed (Policy.Pushed), since a container's
// environment is visible to `docker inspect` (docs/docker.md). A file:
// source that is not absolute is dropped.
func PolicyFile(files map[string][]byte, order []string, trust func(string) (string, error)) (*Policy, error) {
	merged := map[string]any{}
	pol := &Policy{Pushed: map[string]string{}}
	for _, name := range order {
		var doc map[string]any
		if err := toml.Unmarshal(files[name], &doc); err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		if secs, ok := doc["secrets"].(map[string]any); ok {
			for k, v := range secs {
				from, _ := v.(map[string]any)["from"].(string)
				// A wider file's secret of that name is replaced, not
				// kept: its source too.
				delete(pol.Pushed, k)
				if i := slices.Index(pol.Dropped, k); i >= 0 {
					pol.Dropped = slices.Delete(pol.Dropped, i, i+1)
				}
				if path, ok := strings.CutPrefix(from, "file:"); ok && filepath.IsAbs(path) {
					pol.SecretFiles = append(pol.SecretFiles, filepath.Clean(path))
					continue
				}
				if strings.HasPrefix(from, "env:") || strings.HasPrefix(from, "command:") {
					pol.Pushed[k] = from
					continue
				}
				pol.Dropped = append(pol.Dropped, k)
				delete(secs, k)
				// A wider file's secret of that name is replaced, not kept.
				if m, ok := merged["secrets"].(map[string]any); ok {
					delete(m, k)
				}
			}
		}
		for _, t := range gateTables {
			sub, ok := doc[t].(map[string]any)
			if !ok {
				continue
			}
			dst, _ := merged[t].(map[string]any)
			if dst == nil {
				dst = map[string]any{}
				merged[t] = dst
			}
			for k, v := range sub {
				if t == "network" && k == "trust" {
					list, _ := v.([]any)
					var out []any
					for _, p := range list {
						s, _ := p.(string)
						q, err := trust(s)
						if err != nil {
							return nil, err
						}
						out = append(out, q)
					}
					v = out
				}
				if old, ok := dst[k].([]any); ok && t != "secrets" {
					if nv, ok := v.([]any); ok {
						v = append(append([]any{}, old...), nv...)
					}
				}
				dst[k] = v
			}
		}
	}
	if s, ok := merged["secrets"].(map[string]any); ok {
		for k := range s {
			pol.Defined = append(pol.Defined, k)
		}
		if len(s) == 0 {
			delete(merged, "secrets")
		}
	}
	pol.Defined = append(pol.Defined, pol.Dropped...)
	slices.Sort(pol.Defined)
	pol.Defined = slices.Compact(pol.Defined)
	b, err := toml.Marshal(merged)
	if err != nil {
		return nil, err
	}
	pol.TOML = b
	slices.Sort(pol.SecretFiles)
	pol.SecretFiles = slices.Compact(pol.SecretFiles)
	slices.Sort(pol.Dropped)
	return pol, nil
}

// AuditPath is, on the host, the audit log the gate container writes for
// the workload of the sandbox whose state directory is dir: the service
// keeps one per tenant under its state directory (gate/state, mounted at
// gateState), named after the tenant.
func AuditPath(dir string) string {
	return filepath.Join(dir, "gate", "state", "audit", tenant+".jsonl")
}
