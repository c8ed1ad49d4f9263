// Package policy decides, for the egress gate, whether a guest may reach a
// name or an address. It exists so the decision is one pure function of
// the rules, apart from the packet plumbing that asks for it: the gate,
// DNS, the dial-time check and the interactive prompt all ask the same
// compiled Policy and therefore cannot disagree.
//
// Rules come in layers, lowest first: the built-in default list, named
// policies, agent presets, the user's config, the project's config,
// runtime grants. The highest layer that has an opinion (any rule
// matching the destination) decides; inside that layer the most specific
// matching rule decides, and a block beats an allow of equal specificity.
// Nothing matching means deny.
//
// # Request rules
//
// A rule that names HTTP methods or a path ("GET,HEAD github.com/*",
// "read github.com", "block DELETE api.example.com/*") is a request rule:
// it is decided per HTTP request, on a connection the gate terminates,
// by Request. Name still decides the connection, and counts request rules
// like this:
//
//   - An allow request rule is an opinion about its whole name. It lets
//     the connection through (so the gate can look at the requests), and
//     it restricts the name: in its layer, a request that no allow of at
//     least the same specificity matches is denied, and lower layers are
//     not asked. Otherwise a built-in allow of github.com would undo a
//     user's "GET,HEAD github.com/*".
//   - A block request rule is an opinion only about the requests it
//     matches. A layer whose only rules for a name are such blocks leaves
//     the name, and every request the blocks do not match, to the layers
//     below: "block DELETE api.example.com/*" in the user's config must
//     not take away the GETs a preset allows.
//
// Decision.Inspect says whether a connection must be terminated and its
// requests decided one by one; when it is false every request on the
// connection would get the connection's verdict, so the gate may splice.
//
// Inside a layer a request is decided by the most specific rule that
// matches it, compared by name (exact over wildcard, deeper wildcard over
// shallower), then port (a rule with one over one without), then path (a
// longer literal prefix before the first "*"; an exact path over a glob
// with the same prefix; no path last), then methods (a list over any
// method); a block wins an exact tie. The restriction an allow request
// rule puts on its name ranks as a block of that name and port below
// every path: a bare allow of the same name and port outranks it (the
// request rule then adds nothing), a wildcard allow does not, and a
// request rule of the same name that matches always does. When the
// restriction decides, the Decision names the restricting allow rule:
// it is what the refusal page should show as the way in.
//
// Paths are matched after normalization (see NormalizePath), and twice:
// once as written by the usual rules (RFC 3986), once read as loosely as
// any server might (every escape decoded, repeatedly, backslash as slash,
// path parameters dropped, case folded, trailing slash dropped). A
// request is allowed only if both readings allow it, so an encoded slash,
// an encoded percent or odd case can make a block match but never widen
// an allow. A path that cannot be read at all (a bad escape) is matched
// only by rules without a path, and by blocks.
//
// Everything here is free of I/O except discover.go, which reads package
// manager configuration to find the mirrors a sandbox needs.
package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
)

// Action is what a rule says about the destinations it matches: Allow
// or Block. The zero Action is invalid and decides like Block.
type Action uint8

// Allow is both an Action and a Verdict, so it is an untyped constant:
// rule.Action == Allow and decision.Verdict == Allow both read as meant.
const Allow = 1

// Block is the Action of a block rule.
const Block Action = 2

// String is the word written in audit records; frozen.
func (a Action) String() string {
	switch a {
	case Allow:
		return "allow"
	case Block:
		return "block"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Layer is where a rule came from; a higher layer overrides a lower one.
// Layer values are only ever compared with each other, in this process:
// audit records and the control API carry Layer.String(), and runtime
// rules are persisted as entries, so the numbers may change between
// versions (LayerPreset was inserted in the middle).
type Layer uint8

const (
	LayerBuiltin Layer = iota // compiled into moat
	LayerNamed                // named policies from network.use, and discovered mirrors
	LayerPreset               // agent presets ("preset claude"): hosts `moat run claude` needs; user and project rules override them
	LayerUser                 // ~/.config/moat/config.toml
	LayerProject              // the project's moat.toml
	LayerRuntime              // moat network allow/block and interactive grants
)

// String is the word written in audit records; frozen.
func (l Layer) String() string {
	switch l {
	case LayerBuiltin:
		return "builtin"
	case LayerNamed:
		return "policy"
	case LayerPreset:
		return "preset"
	case LayerUser:
		return "user"
	case LayerProject:
		return "project"
	case LayerRuntime:
		return "runtime"
	}
	return fmt.Sprintf("Layer(%d)", uint8(l))
}

// Rule is one entry of an allow or block list. ParseEntry fills Entry,
// Name, Wildcard, Port, Prefix, Methods and Path; the caller sets Action,
// Layer and Source.
type Rule struct {
	Entry    string // as written, e.g. "*.Example.com:443"
	Action   Action
	Layer    Layer
	Source   string // "moat.toml:12", "policy default", "discovered: /etc/apt/sources.list", "runtime"
	Name     string // normalized (see NormalizeName); "" for address rules
	Wildcard bool   // "*.name": any subdomain depth, not the apex
	Port     uint16 // 0 = any port
	// Prefix is valid only for address rules; one address is a /32 or /128.
	Prefix netip.Prefix
	// Methods and Path make a name rule a request rule (see the package
	// doc). Methods are upper case, nil for any method; "read" is
	// already expanded to GET, HEAD, OPTIONS. Path is a glob in the form
	// NormalizePath gives, starting with "/", where "*" matches any run
	// of characters including "/"; "" means any path.
	Methods []string
	Path    string
}

// IsAddr reports whether r is an address (IP or CIDR) rule.
func (r *Rule) IsAddr() bool { return r.Name == "" && r.Prefix.IsValid() }

// IsRequest reports whether r is a request rule: it names methods or a
// path.
func (r *Rule) IsRequest() bool { return len(r.Methods) > 0 || r.Path != "" }

// Verdict is the outcome of a decision: Allow or Deny. Its zero value is
// Deny, so a Decision nobody filled in denies: the gate fails closed.
type Verdict uint8

// Deny is the Verdict of a denied destination, and the zero Verdict.
const Deny Verdict = 0

// String is the word written in audit records; frozen.
func (v Verdict) String() string {
	if v == Allow {
		return "allow"
	}
	return "deny"
}

// Decision is a verdict and the rule that gave it. Rule is nil when no
// rule had an opinion and the default (deny) applied. Rule points into
// the Policy; callers must not modify it.
//
// Inspect is set by Name on an allow whose requests are not all decided
// alike: the gate must terminate the connection and ask Request for each
// request. It is kept in this small struct, not in a second call,
// because Name is on every connection's path.
type Decision struct {
	Verdict Verdict
	Inspect bool
	Rule    *Rule
}

// Policy is a compiled, immutable rule set, safe for concurrent use.
// Callers that change rules compile a new Policy and swap a pointer
// (atomic.Pointer), so a decision never sees half an update. A nil
// *Policy denies everything: no policy means no egress.
type Policy struct {
	// rules are the rules that are not plain name rules (addresses,
	// ports, request rules), pos their places in Compile's input.
	rules []Rule
	pos   []int32
	rank  []uint32 // per rule, see rankOf

	// bulk are the plain name rules ("name", "*.name": no port, methods
	// or path), stored in 40 bytes instead of a Rule's 136: they are what
	// a blocklist of 100 000 names is made of, and as Rules the names
	// alone would cost more than the 30 MiB a list may. Indices into the
	// maps below are refs: i >= 0 is rules[i], i < 0 is bulk[^i].
	bulk   []bulkRule
	groups []ruleGroup // the Action, Layer and Source bulk rules share
	// made holds the Rule of a bulk rule once a Decision has named it,
	// so every Decision naming it points at the same Rule, as for the
	// others. 8 bytes a rule, and only the rules that decide are made.
	made []atomic.Pointer[Rule]

	exact refIndex // name → rules "name" and "name:port"
	wild  refIndex // suffix → rules "*.suffix" and "*.suffix:port"

	// Address rules by prefix length, so a lookup masks the address once
	// per length in use instead of scanning every rule.
	addr  map[netip.Prefix][]int32
	lens4 []int // prefix lengths in use for IPv4 rules, longest first
	lens6 []int

	// Request rules. req is nil when there are none, so a policy without
	// them pays one nil check on Name. Allow request rules are in exact
	// and wild like plain rules (they are an opinion about the name);
	// block request rules are only in bexact and bwild, where Name does
	// not look unless it has to work out Inspect.
	req    []*reqRule // per rule; nil for plain rules
	bexact map[string][]int32
	bwild  map[string][]int32
}

// Compile builds a Policy from rules, which already carry Action, Layer
// and Source. Rules() returns them in the same order. Compile trusts the
// parsed fields (Name, Wildcard, Port, Prefix) as ParseEntry made them,
// but normalizes Name again so a hand-built rule cannot silently match
// nothing for want of lower case, and upper-cases Methods.
//
// A hand-built rule that ParseEntry would refuse fails closed: an
// address rule with methods or a path is dropped if it allows and
// blocks the whole address if it blocks (the gate cannot read requests
// to an address); a request rule whose Path is not a valid glob matches
// no request if it allows and every path if it blocks.
func Compile(rules []Rule) *Policy {
	p := &Policy{
		exact: refIndex{m: map[string]int64{}},
		wild:  refIndex{m: map[string]int64{}},
		addr:  map[netip.Prefix][]int32{},
	}
	groups := map[ruleGroup]uint16{}
	p.bulk = make([]bulkRule, 0, len(rules))
	bulkRefs := make([]int32, 0, len(rules)) // per bulk rule, its ref, to index after the others
	for i := range rules {
		r := &rules[i]
		name := r.Name
		if name != "" {
			if n, err := NormalizeName(name); err == nil {
				name = n
			}
		}
		if name != "" && r.Methods == nil && r.Path == "" && r.Port == 0 && !r.Prefix.IsValid() {
			g := ruleGroup{r.Action, r.Layer, r.Source}
			gi, ok := groups[g]
			if !ok && len(p.groups) < 1<<16-1 {
				gi, ok = uint16(len(p.groups)), true
				groups[g] = gi
				p.groups = append(p.groups, g)
			}
			if ok {
				p.bulk = append(p.bulk, bulkRule{entry: r.Entry, name: name, pos: int32(i), group: gi, wild: r.Wildcard})
				bulkRefs = append(bulkRefs, ^int32(len(p.bulk)-1))
				continue
			}
		}
		// A copy: the caller's rules are not touched.
		c := *r
		c.Name = name
		if c.Methods != nil {
			c.Methods = upperAll(c.Methods)
		}
		p.rules = append(p.rules, c)
		p.pos = append(p.pos, int32(i))
	}
	p.bulk = slices.Clip(p.bulk)
	p.rank = make([]uint32, len(p.rules))
	seen4, seen6 := map[int]bool{}, map[int]bool{}
	for i := range p.rules {
		r := &p.rules[i]
		if r.Name != "" && r.IsRequest() {
			p.addRequest(int32(i))
			continue
		}
		if r.Name == "" && r.IsRequest() && r.Action == Allow {
			continue
		}
		p.rank[i] = rankOf(r, false)
		switch {
		case r.Name != "" && r.Wildcard:
			p.wild.add(r.Name, int32(i))
		case r.Name != "":
			p.exact.add(r.Name, int32(i))
		case r.Prefix.IsValid():
			pfx := r.Prefix.Masked()
			r.Prefix = pfx
			p.addr[pfx] = append(p.addr[pfx], int32(i))
			if pfx.Addr().Is4() {
				seen4[pfx.Bits()] = true
			} else {
				seen6[pfx.Bits()] = true
			}
		}
	}
	// No bulk rule ties with another rule (a rule with a port, or a
	// request rule, ranks apart), so indexing them after the others
	// keeps "the first of two equal rules" meaning the first written.
	for _, ref := range bulkRefs {
		b := &p.bulk[^ref]
		if b.wild {
			p.wild.add(b.name, ref)
		} else {
			p.exact.add(b.name, ref)
		}
	}
	p.made = make([]atomic.Pointer[Rule], len(p.bulk))
	p.lens4, p.lens6 = sortedLens(seen4), sortedLens(seen6)
	return p
}

// refIndex maps a name to the refs of its rules. Most names have one
// rule, so the map holds that ref itself (as its uint32 bit pattern, 0 to
// 2^32-1) and only a name with more points (a negative value v) at
// more[^v]: a map of slices would cost a slice header and an allocation
// more per name, a third of a big list's memory.
type refIndex struct {
	m    map[string]int64
	more [][]int32
}

func (x *refIndex) add(name string, ref int32) {
	v, ok := x.m[name]
	switch {
	case !ok:
		x.m[name] = int64(uint32(ref))
	case v >= 0:
		x.more = append(x.more, []int32{int32(uint32(v)), ref})
		x.m[name] = ^int64(len(x.more) - 1)
	default:
		x.more[^v] = append(x.more[^v], ref)
	}
}

func (x *refIndex) appendTo(out []int32, name string) []int32 {
	v, ok := x.m[name]
	switch {
	case !ok:
		return out
	case v >= 0:
		return append(out, int32(uint32(v)))
	}
	return append(out, x.more[^v]...)
}

// bulkRule is a plain name rule; see Policy.bulk.
type bulkRule struct {
	entry string
	name  string
	pos   int32
	group uint16
	wild  bool
}

type ruleGroup struct {
	action Action
	layer  Layer
	source string
}

// rule returns the rule ref names. A bulk rule is written into scratch,
// so a lookup allocates nothing; a Decision gets its own copy (ruleOut).
func (p *Policy) rule(ref int32, scratch *Rule) *Rule {
	if ref >= 0 {
		return &p.rules[ref]
	}
	b := &p.bulk[^ref]
	g := &p.groups[b.group]
	*scratch = Rule{Entry: b.entry, Action: g.action, Layer: g.layer, Source: g.source, Name: b.name, Wildcard: b.wild}
	return scratch
}

// ruleOut is the rule ref names, for a Decision: a pointer into the
// Policy, the same one each time.
func (p *Policy) ruleOut(ref int32) *Rule {
	if ref >= 0 {
		return &p.rules[ref]
	}
	m := &p.made[^ref]
	if r := m.Load(); r != nil {
		return r
	}
	m.CompareAndSwap(nil, p.rule(ref, new(Rule)))
	return m.Load()
}

// rankAt is rankOf for the rule ref names.
func (p *Policy) rankAt(ref int32) uint32 {
	if ref >= 0 {
		return p.rank[ref]
	}
	var r Rule
	return rankOf(p.rule(ref, &r), false)
}

// reqAt is the compiled request part of the rule ref names, nil for a
// rule that is not a request rule.
func (p *Policy) reqAt(ref int32) *reqRule {
	if ref < 0 || p.req == nil {
		return nil
	}
	return p.req[ref]
}

func sortedLens(m map[int]bool) []int {
	var out []int
	for b := 128; b >= 0; b-- {
		if m[b] {
			out = append(out, b)
		}
	}
	return out
}

// addRequest indexes the request rule i.
func (p *Policy) addRequest(i int32) {
	if p.req == nil {
		p.req = make([]*reqRule, len(p.rules))
		p.bexact, p.bwild = map[string][]int32{}, map[string][]int32{}
	}
	r := &p.rules[i]
	p.req[i] = compileRequest(r)
	p.rank[i] = rankOf(r, true)
	if r.Action == Allow {
		if r.Wildcard {
			p.wild.add(r.Name, i)
		} else {
			p.exact.add(r.Name, i)
		}
		return
	}
	if r.Wildcard {
		p.bwild[r.Name] = append(p.bwild[r.Name], i)
	} else {
		p.bexact[r.Name] = append(p.bexact[r.Name], i)
	}
}

// rankOf orders rules that match the same destination when Name and Addr
// decide: a higher rank decides. From most to least significant: the
// layer (the highest layer with an opinion wins), how narrow the pattern
// is (narrowOf), whether the rule names a port (a port narrows the same
// pattern), and last the kind: an allow request rule, then a block, then
// an allow. A block wins a tie with an allow; an allow request rule wins
// a tie with a block because some requests get past the block (a request
// rule ranks above a bare rule of its name in Request), so the
// connection must be let through to be inspected.
func rankOf(r *Rule, request bool) uint32 {
	rank := uint32(r.Layer)<<16 | narrowOf(r)<<3
	if r.Port != 0 {
		rank |= 4
	}
	switch {
	case request && r.Action == Allow:
		rank |= 2
	case r.Action != Allow:
		rank |= 1
	}
	return rank
}

// narrowOf says how narrow a rule's pattern is: an exact name beats any
// wildcard, a deeper wildcard suffix beats a shallower one, a longer
// prefix beats a shorter one.
func narrowOf(r *Rule) uint32 {
	switch {
	case r.Name != "" && !r.Wildcard:
		return 255 // above any wildcard: a name has at most 127 labels
	case r.Name != "":
		return uint32(labels(r.Name))
	default:
		return uint32(r.Prefix.Bits()) + 1
	}
}

func labels(name string) int {
	n := 1
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			n++
		}
	}
	return n
}

// Rules returns a copy of the rules in the order given to Compile.
func (p *Policy) Rules() []Rule {
	if p == nil {
		return nil
	}
	out := make([]Rule, len(p.rules)+len(p.bulk))
	for i, r := range p.rules {
		if r.Methods != nil {
			r.Methods = append([]string(nil), r.Methods...)
		}
		out[p.pos[i]] = r
	}
	for j := range p.bulk {
		p.rule(^int32(j), &out[p.bulk[j].pos])
	}
	return out
}

// Name decides whether name may be reached on port. The name is
// normalized here; one that is not a valid name is denied. Port 0 asks
// whether the name may be reached on any port at all, which is what DNS
// needs: a name is resolved iff some connection to it could be allowed.
// Name rules only: an address rule never allows a name.
//
// Request rules count as the package doc says: an allow request rule
// allows the connection and sets Inspect, a block request rule only sets
// Inspect on a connection it could affect.
func (p *Policy) Name(name string, port uint16) Decision {
	if p == nil {
		return Decision{}
	}
	n, err := NormalizeName(name)
	if err != nil {
		return Decision{}
	}
	var buf [16]int32
	d := p.decide(p.nameRules(n, buf[:0]), port, nil)
	if p.req != nil && d.Verdict == Allow {
		d.Inspect = p.inspects(n, port, d.Rule)
	}
	return d
}

// nameRules appends the indices of the rules whose name pattern matches
// n: exact rules for n, and wildcard rules for every proper suffix of n
// (a.b.example.com looks up b.example.com, example.com and com). That is
// one map lookup per label however many rules there are.
func (p *Policy) nameRules(n string, out []int32) []int32 {
	out = p.exact.appendTo(out, n)
	for i := 0; i < len(n); i++ {
		if n[i] == '.' {
			out = p.wild.appendTo(out, n[i+1:])
		}
	}
	return out
}

// Addr decides whether ip may be reached on port by the address rules;
// name rules are not consulted. An IPv4-mapped IPv6 address is decided
// as the IPv4 address it carries, and a zone is ignored. Port 0 means
// any port, as for Name. Addr says nothing about special addresses
// (loopback, private, ...): the caller checks Special and OpensSpecial.
func (p *Policy) Addr(ip netip.Addr, port uint16) Decision {
	if p == nil || !ip.IsValid() {
		return Decision{}
	}
	var buf [16]int32
	return p.decide(p.addrRules(ip.Unmap().WithZone(""), buf[:0]), port, nil)
}

// addrRules appends the indices of the address rules whose prefix
// contains ip, one map lookup per prefix length in use.
func (p *Policy) addrRules(ip netip.Addr, out []int32) []int32 {
	lens := p.lens6
	if ip.Is4() {
		lens = p.lens4
	}
	for _, b := range lens {
		pfx, err := ip.Prefix(b)
		if err != nil {
			continue
		}
		out = append(out, p.addr[pfx]...)
	}
	return out
}

// decide picks the verdict among the rules cands (which all match the
// destination's name or address) for port. keep, if not nil, filters
// the candidates further.
//
// Port 0 asks whether any port is allowed. Only the ports some candidate
// names can be decided differently from each other; every other port is
// decided alike, by the portless rules alone. So it is enough to try each
// mentioned port and one unmentioned one.
func (p *Policy) decide(cands []int32, port uint16, keep func(*Rule) bool) Decision {
	if keep != nil {
		kept := cands[:0]
		var scratch Rule
		for _, i := range cands {
			if keep(p.rule(i, &scratch)) {
				kept = append(kept, i)
			}
		}
		cands = kept
	}
	if port != 0 {
		return p.at(cands, port)
	}
	var pbuf [16]uint16
	ports := pbuf[:0]
	for _, i := range cands {
		if i < 0 {
			continue // a bulk rule names no port
		}
		if pt := p.rules[i].Port; pt != 0 && !containsPort(ports, pt) {
			ports = append(ports, pt)
		}
	}
	var denied Decision
	for _, pt := range ports {
		d := p.at(cands, pt)
		if d.Verdict == Allow {
			return d
		}
		if denied.Rule == nil {
			denied = d
		}
	}
	if len(ports) < 65535 {
		// 0 here stands for a port no candidate names.
		d := p.at(cands, 0)
		if d.Verdict == Allow {
			return d
		}
		// The rule for ports nobody named says most about why the name
		// is denied; a port-specific block is the fallback.
		if d.Rule != nil {
			denied = d
		}
	}
	return denied
}

func containsPort(ports []uint16, pt uint16) bool {
	for _, x := range ports {
		if x == pt {
			return true
		}
	}
	return false
}

// at picks the highest-ranked candidate that matches port. Port 0 here
// is a port no rule names: only portless rules match it.
func (p *Policy) at(cands []int32, port uint16) Decision {
	best, found, bestRank := int32(0), false, uint32(0)
	for _, i := range cands {
		if i >= 0 && p.rules[i].Port != 0 && p.rules[i].Port != port {
			continue
		}
		// Strictly greater keeps the first of two identical rules, so
		// the decision names the rule the user wrote first.
		if rk := p.rankAt(i); !found || rk > bestRank {
			best, found, bestRank = i, true, rk
		}
	}
	if !found {
		return Decision{}
	}
	r := p.ruleOut(best)
	if r.Action == Allow {
		return Decision{Verdict: Allow, Rule: r}
	}
	return Decision{Verdict: Deny, Rule: r}
}
