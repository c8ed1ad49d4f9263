package gateserve

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
)

// Config is the service's configuration file, checked. Every path in it is
// absolute.
type Config struct {
	Path string // the file it was read from

	// StateDir holds the CA (ca/, never in the jail), and the default
	// audit logs (audit/) and placeholder files (placeholders/).
	StateDir string
	// UID and GID are what the service runs as once it has bound its
	// listeners; never root.
	UID, GID int
	// CACert is where the CA's certificate (its public part only) is
	// written for clients to trust.
	CACert string
	// Answer is the address DNS answers with; invalid: each DNS
	// listener's own address.
	Answer netip.Addr
	// Audit is where clients that are no tenant's are recorded.
	Audit string
	// Names, when valid, is an IPv4 range the service owns on the
	// clients' network: DNS answers each name with an address of it
	// bound to the name (per tenant), and a connection to that address
	// on any TCP port is decided by the name. Invalid: every name is
	// answered with the service's own address, and only its listeners'
	// ports are served.
	Names netip.Prefix
	// Control, when set, is the control socket (control.go): a unix
	// socket only the user who started the service may use, to push
	// secret values and ask for a reload.
	Control string

	DNS, HTTP, HTTPS []netip.AddrPort
	Metrics          netip.AddrPort // invalid: no metrics listener
	// Upstream is the resolvers asked for allowed names; empty: the
	// nameservers of /etc/resolv.conf.
	Upstream []netip.AddrPort

	Tenants []Tenant // sorted by name

	// Kube, when set, makes the service's tenants the sandbox pods of a
	// Kubernetes cluster (kube.go): each pod's address is its tenant,
	// found by watching Pods and agent-sandbox's objects. Tenants is
	// then empty: a subnet tenant covering pods would serve a pod the
	// watch does not know yet, which must get nothing.
	Kube *Kube
}

// Kube is [kubernetes]: where the cluster is and which pods are served.
type Kube struct {
	// Kubeconfig is a kubeconfig file; "": the pod's own ServiceAccount
	// (in-cluster).
	Kubeconfig string
	// Node limits the pods served to those scheduled on it (a DaemonSet's
	// gate serves its own node); "": every node.
	Node string
	// Audit is the one audit log of every sandbox's records, which name
	// the sandbox and its claim.
	Audit string
}

// Tenant is one client of the service, known by its source addresses.
type Tenant struct {
	Name    string
	Sources []netip.Prefix
	// Policy is moat.toml-syntax files, lowest layer first: their
	// [network], [policies], [secrets] and [audit] tables.
	Policy []string
	// Audit is the tenant's audit log; Placeholders the file its
	// secrets' placeholders are written to (NAME=placeholder lines), for
	// whoever starts its clients.
	Audit, Placeholders string
	// Pushed names secrets of the tenant's policy files whose values the
	// service does not read from their source: they come over the
	// control socket, in memory only (control.go).
	Pushed []string
	// RulesAt is where a person adds an allow rule for the tenant, which
	// its refusal pages name: the last (top) policy file unless the
	// configuration says otherwise (moat's Docker runtime names the
	// project's files; a cluster template, its policy ConfigMap).
	RulesAt string
}

// defaultUID is nobody's: a uid that owns nothing.
const defaultUID = 65534

type rawConfig struct {
	Service  rawService           `toml:"service"`
	Listen   rawListen            `toml:"listen"`
	Upstream rawUpstream          `toml:"upstream"`
	Tenants  map[string]rawTenant `toml:"tenants"`
	Kube     *rawKube             `toml:"kubernetes"`
}

type rawKube struct {
	Kubeconfig *string `toml:"kubeconfig"`
	Node       *string `toml:"node"`
	Audit      *string `toml:"audit"`
}

type rawService struct {
	StateDir *string `toml:"state_dir"`
	UID      *int64  `toml:"uid"`
	GID      *int64  `toml:"gid"`
	CACert   *string `toml:"ca_cert"`
	Answer   *string `toml:"answer"`
	Audit    *string `toml:"audit"`
	Names    *string `toml:"names"`
	Control  *string `toml:"control"`
}

type rawListen struct {
	DNS     []string `toml:"dns"`
	HTTP    []string `toml:"http"`
	HTTPS   []string `toml:"https"`
	Metrics *string  `toml:"metrics"`
}

type rawUpstream struct {
	DNS []string `toml:"dns"`
}

type rawTenant struct {
	Sources      []string `toml:"sources"`
	Policy       []string `toml:"policy"`
	Audit        *string  `toml:"audit"`
	Placeholders *string  `toml:"placeholders"`
	Pushed       []string `toml:"pushed"`
	RulesAt      *string  `toml:"rules_at"`
}

// ErrInvalid is matched by every error about the file's content.
var ErrInvalid = errors.New("invalid gate service configuration")

// ConfigError is one problem in the file, where it is and what to do.
type ConfigError struct {
	Path string
	Line int // 0: not known
	Msg  string
}

func (e *ConfigError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
	}
	return e.Path + ": " + e.Msg
}

func (e *ConfigError) Is(target error) bool { return target == ErrInvalid }

// LoadConfig reads and checks the file at path.
func LoadConfig(path string) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("reading the gate service's configuration: %w", err)
	}
	return ParseConfig(abs, data)
}

// ParseConfig parses data, the content of the file at path. Unknown keys,
// wrong types and bad values are errors naming the line and what to write
// instead; all of them are reported, not only the first.
func ParseConfig(path string, data []byte) (*Config, error) {
	var raw rawConfig
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, decodeError(path, err)
	}
	c := &checker{path: path, data: data}
	cfg := c.check(&raw)
	if len(c.errs) > 0 {
		return nil, errors.Join(c.errs...)
	}
	return cfg, nil
}

func decodeError(path string, err error) error {
	var sm *toml.StrictMissingError
	if errors.As(err, &sm) {
		var errs []error
		for _, e := range sm.Errors {
			row, _ := e.Position()
			errs = append(errs, &ConfigError{Path: path, Line: row,
				Msg: fmt.Sprintf("unknown key %s; the keys are listed in docs/gate-service.md", strings.Join(e.Key(), "."))})
		}
		return errors.Join(errs...)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, _ := de.Position()
		return &ConfigError{Path: path, Line: row, Msg: de.Error() + " (see docs/gate-service.md for each key's type)"}
	}
	return &ConfigError{Path: path, Msg: err.Error()}
}

type checker struct {
	path string
	data []byte
	errs []error
}

// fail records a problem with key (a dotted path: "tenants.a.sources").
func (c *checker) fail(key, format string, args ...any) {
	c.errs = append(c.errs, &ConfigError{Path: c.path, Line: lineOf(c.data, key),
		Msg: key + ": " + fmt.Sprintf(format, args...)})
}

var tenantName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func (c *checker) check(raw *rawConfig) *Config {
	cfg := &Config{Path: c.path, UID: defaultUID}
	if raw.Service.StateDir == nil {
		c.fail("service.state_dir", "missing: name a directory for the CA and the audit logs, e.g. state_dir = \"/var/lib/moat-gate\"")
	} else {
		cfg.StateDir = c.absPath("service.state_dir", *raw.Service.StateDir)
	}
	if u := raw.Service.UID; u != nil {
		if *u <= 0 || *u > 1<<31-1 {
			c.fail("service.uid", "%d: the service drops to this uid after binding its ports; give an unprivileged one (not 0), e.g. 65534", *u)
		}
		cfg.UID = int(*u)
	}
	cfg.GID = cfg.UID
	if g := raw.Service.GID; g != nil {
		if *g <= 0 || *g > 1<<31-1 {
			c.fail("service.gid", "%d: give an unprivileged group (not 0), e.g. 65534", *g)
		}
		cfg.GID = int(*g)
	}
	if cfg.StateDir != "" {
		cfg.CACert = filepath.Join(cfg.StateDir, "ca.pem")
		cfg.Audit = filepath.Join(cfg.StateDir, "audit", "unknown.jsonl")
	}
	if p := raw.Service.CACert; p != nil {
		cfg.CACert = c.absPath("service.ca_cert", *p)
	}
	if p := raw.Service.Audit; p != nil {
		cfg.Audit = c.absPath("service.audit", *p)
	}
	if a := raw.Service.Answer; a != nil {
		ip, err := netip.ParseAddr(*a)
		if err != nil || !ip.Is4() || ip.IsUnspecified() {
			c.fail("service.answer", "%q: give the IPv4 address clients reach the service at, e.g. answer = \"10.0.0.1\"", *a)
		}
		cfg.Answer = ip
	}

	if n := raw.Service.Names; n != nil {
		cfg.Names = c.names(*n)
		if cfg.Names.IsValid() && cfg.Answer.IsValid() {
			c.fail("service.answer", "set with service.names, which answers each name with an address of its range; remove one of them")
		}
	}

	if p := raw.Service.Control; p != nil {
		cfg.Control = c.absPath("service.control", *p)
	}

	cfg.DNS = c.addrs("listen.dns", raw.Listen.DNS, 53)
	cfg.HTTP = c.addrs("listen.http", raw.Listen.HTTP, 80)
	cfg.HTTPS = c.addrs("listen.https", raw.Listen.HTTPS, 443)
	if len(cfg.DNS) == 0 {
		c.fail("listen.dns", "missing: clients find the service through its DNS; e.g. dns = [\"10.0.0.1:53\"]")
	}
	// With a names range, 80 and 443 reach the service at the range's
	// addresses; listeners of their own are optional.
	if len(cfg.HTTP)+len(cfg.HTTPS) == 0 && !cfg.Names.IsValid() {
		c.fail("listen.https", "missing: give at least one of listen.http and listen.https, e.g. https = [\"10.0.0.1:443\"], or service.names")
	}
	if !cfg.Answer.IsValid() && !cfg.Names.IsValid() {
		for _, ap := range cfg.DNS {
			if !ap.Addr().Is4() || ap.Addr().IsUnspecified() {
				c.fail("listen.dns", "%s: DNS answers with the address it was asked on, which must then be one IPv4 address; listen on it, or set service.answer", ap)
				break
			}
		}
	}
	if m := raw.Listen.Metrics; m != nil {
		if ap := c.addrs("listen.metrics", []string{*m}, 0); len(ap) == 1 {
			cfg.Metrics = ap[0]
		}
	}
	seen := map[netip.AddrPort]string{}
	for _, l := range []struct {
		key string
		aps []netip.AddrPort
	}{{"listen.dns", cfg.DNS}, {"listen.http", cfg.HTTP}, {"listen.https", cfg.HTTPS}, {"listen.metrics", []netip.AddrPort{cfg.Metrics}}} {
		for _, ap := range l.aps {
			if !ap.IsValid() || l.key == "listen.dns" {
				continue // DNS shares its address with nothing over TCP but itself
			}
			if other, dup := seen[ap]; dup {
				c.fail(l.key, "%s is also in %s; give each listener its own port", ap, other)
			}
			seen[ap] = l.key
		}
	}
	if cfg.Names.IsValid() {
		for _, l := range []struct {
			key string
			aps []netip.AddrPort
		}{{"listen.dns", cfg.DNS}, {"listen.http", cfg.HTTP}, {"listen.https", cfg.HTTPS}, {"listen.metrics", []netip.AddrPort{cfg.Metrics}}} {
			for _, ap := range l.aps {
				if ap.IsValid() && cfg.Names.Contains(ap.Addr()) {
					c.fail(l.key, "%s is inside service.names %s, whose every connection goes to the names listener; listen outside the range", ap, cfg.Names)
				}
			}
		}
	}
	cfg.Upstream = c.addrs("upstream.dns", raw.Upstream.DNS, 53)

	names := make([]string, 0, len(raw.Tenants))
	for n := range raw.Tenants {
		names = append(names, n)
	}
	slices.Sort(names)
	owner := map[netip.Prefix]string{}
	for _, name := range names {
		rt := raw.Tenants[name]
		key := "tenants." + name
		if !tenantName.MatchString(name) {
			c.fail(key, "%q is not a tenant name: use lower-case letters, digits, '-' and '_' (at most 63)", name)
			continue
		}
		t := Tenant{Name: name}
		if len(rt.Sources) == 0 {
			c.fail(key+".sources", "missing: give the tenant's client addresses or subnets, e.g. sources = [\"10.0.1.0/24\"]")
		}
		for _, s := range rt.Sources {
			p, err := parseSource(s)
			if err != nil {
				c.fail(key+".sources", "%v", err)
				continue
			}
			for q, other := range owner {
				if q.Overlaps(p) {
					c.fail(key+".sources", "%s overlaps %s of tenant %s; a client must belong to one tenant", p, q, other)
				}
			}
			if cfg.Names.IsValid() && cfg.Names.Overlaps(p) {
				c.fail(key+".sources", "%s overlaps service.names %s: a client cannot have an address of the range the service answers names with", p, cfg.Names)
			}
			owner[p] = name
			t.Sources = append(t.Sources, p)
		}
		if len(rt.Policy) == 0 {
			c.fail(key+".policy", "missing: give the tenant's policy files (moat.toml syntax), lowest layer first, e.g. policy = [\"/etc/moat-gate/%s.toml\"]", name)
		}
		for _, p := range rt.Policy {
			t.Policy = append(t.Policy, c.absPath(key+".policy", p))
		}
		if len(t.Policy) > 0 {
			t.RulesAt = t.Policy[len(t.Policy)-1]
		}
		if rt.RulesAt != nil {
			t.RulesAt = *rt.RulesAt
		}
		if cfg.StateDir != "" {
			t.Audit = filepath.Join(cfg.StateDir, "audit", name+".jsonl")
			t.Placeholders = filepath.Join(cfg.StateDir, "placeholders", name+".env")
		}
		if p := rt.Audit; p != nil {
			t.Audit = c.absPath(key+".audit", *p)
		}
		if p := rt.Placeholders; p != nil {
			t.Placeholders = c.absPath(key+".placeholders", *p)
		}
		t.Pushed = c.pushed(key+".pushed", rt.Pushed, cfg.Control)
		cfg.Tenants = append(cfg.Tenants, t)
	}
	if raw.Kube != nil {
		cfg.Kube = c.kube(raw.Kube, cfg)
	}
	return cfg
}

// kube checks [kubernetes].
func (c *checker) kube(rk *rawKube, cfg *Config) *Kube {
	k := &Kube{}
	if len(cfg.Tenants) > 0 {
		c.fail("kubernetes", "set with [tenants]: with [kubernetes] each sandbox pod is a tenant of its own, and a subnet tenant would serve pods the service does not know yet; remove one of them")
	}
	if cfg.Names.IsValid() {
		c.fail("kubernetes", "set with service.names, which nothing routes to one pod on a cluster; remove service.names")
	}
	if cfg.Control != "" {
		c.fail("kubernetes", "set with service.control: a sandbox's secret values come from Kubernetes Secrets; remove service.control")
	}
	if p := rk.Kubeconfig; p != nil {
		k.Kubeconfig = c.absPath("kubernetes.kubeconfig", *p)
	}
	if n := rk.Node; n != nil {
		v := *n
		if name, ok := strings.CutPrefix(v, "env:"); ok {
			// A DaemonSet's pods share one configuration; each learns its
			// node from the downward API.
			var set bool
			if v, set = os.LookupEnv(name); !set || v == "" {
				c.fail("kubernetes.node", "%q: the variable %s is not set; give the pod env %s from fieldRef spec.nodeName", *n, name, name)
			}
		}
		k.Node = v
	}
	if cfg.StateDir != "" {
		k.Audit = filepath.Join(cfg.StateDir, "audit", "kubernetes.jsonl")
	}
	if p := rk.Audit; p != nil {
		k.Audit = c.absPath("kubernetes.audit", *p)
	}
	return k
}

// secretName is what a [secrets] table's name may be (an environment
// variable's: the placeholder is handed out under it).
var secretName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// pushed checks a tenant's pushed secret names: well formed, each once,
// and a control socket to push them over. Whether each names a secret of
// the tenant's policy files is checked when they are read.
func (c *checker) pushed(key string, names []string, control string) []string {
	if len(names) > 0 && control == "" {
		c.fail(key, "needs service.control, the socket their values are pushed over; e.g. control = \"/run/moat-gate/control.sock\"")
	}
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		switch {
		case !secretName.MatchString(n):
			c.fail(key, "%q is not a secret's name; name a [secrets.NAME] table of the tenant's policy files", n)
		case seen[n]:
			c.fail(key, "%q is named twice", n)
		default:
			seen[n] = true
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// names checks service.names: an IPv4 subnet with host bits zero, from /8
// (a pool holds at most 65536 names anyway) to /30 (two addresses).
func (c *checker) names(s string) netip.Prefix {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil || !p.Addr().Is4():
		c.fail("service.names", "%q: give an IPv4 subnet the clients reach the service at, e.g. names = \"10.213.7.128/25\" (the upper half of their /24)", s)
	case p.Masked() != p:
		c.fail("service.names", "%q has host bits set; did you mean %s?", s, p.Masked())
	case p.Bits() < 8 || p.Bits() > 30:
		c.fail("service.names", "%q: give a subnet from /8 to /30, e.g. a /25", s)
	default:
		for _, bad := range notNames {
			if p.Overlaps(bad) {
				c.fail("service.names", "%q overlaps %s, which is no network's; give a range on the clients' network", s, bad)
				return netip.Prefix{}
			}
		}
		return p
	}
	return netip.Prefix{}
}

// notNames are ranges that cannot be a network's: the names range is
// routed to the service, and taking one of these would take it from the
// host (loopback) or mean nothing on a wire.
var notNames = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"), netip.MustParsePrefix("240.0.0.0/4"),
}

// parseSource reads an address (a /32 or /128) or a subnet written with
// its host bits zero.
func parseSource(s string) (netip.Prefix, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither an address nor a subnet; write e.g. \"10.0.1.7\" or \"10.0.1.0/24\"", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set; did you mean %s?", s, p.Masked())
	}
	return p, nil
}

// addrs parses ip:port listeners; a bare ip gets port def (0: a port is
// required).
func (c *checker) addrs(key string, list []string, def uint16) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range list {
		ap, err := netip.ParseAddrPort(s)
		if err != nil && def != 0 {
			if ip, err2 := netip.ParseAddr(s); err2 == nil {
				ap, err = netip.AddrPortFrom(ip, def), nil
			}
		}
		if err != nil || ap.Port() == 0 {
			c.fail(key, "%q: write an address and port, e.g. \"10.0.0.1:%d\"", s, max(def, 9153))
			continue
		}
		out = append(out, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	}
	return out
}

func (c *checker) absPath(key, p string) string {
	if !filepath.IsAbs(p) {
		c.fail(key, "%q: write an absolute path", p)
		return p
	}
	return filepath.Clean(p)
}

// lineOf finds the line that sets key ("tenants.a.sources") in a TOML
// document: the key's last part under the table of the rest, or the table
// header itself. 0 when it is not found (a key that is missing).
func lineOf(data []byte, key string) int {
	parts := strings.Split(key, ".")
	table, leaf := strings.Join(parts[:len(parts)-1], "."), parts[len(parts)-1]
	cur, header := "", 0
	for i, line := range strings.Split(string(data), "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "[") {
			cur = strings.Trim(strings.SplitN(l, "#", 2)[0], "[] \t")
			cur = strings.ReplaceAll(strings.ReplaceAll(cur, "\"", ""), " ", "")
			if cur == key {
				header = i + 1
			}
			continue
		}
		k, _, ok := strings.Cut(l, "=")
		if ok && cur == table && strings.Trim(strings.TrimSpace(k), "\"") == leaf {
			return i + 1
		}
	}
	if header > 0 {
		return header
	}
	if table != "" {
		return lineOf(data, table)
	}
	return 0
}
