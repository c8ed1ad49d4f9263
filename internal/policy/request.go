package policy

import (
	"errors"
	"strings"
)

// This file decides single HTTP requests on connections the gate
// terminates: request rules, path normalization and path globs. The
// semantics are in the package doc.

// reqRule is a request rule compiled for matching.
type reqRule struct {
	methods []string // upper case; nil: any method
	// The path glob in the two readings (see the package doc); both nil
	// pieces and any set: the rule has no path.
	strict, loose glob
	// pathRank orders paths inside a layer: 0 is the restriction an
	// allow request rule puts on its name (see request), 1 any path,
	// then 2 + twice the literal prefix before the first "*", +1 for a
	// path without "*". The strict reading's prefix counts for both
	// readings so that both agree on which rule is more specific.
	pathRank uint32
}

// glob is a path pattern where "*" matches any run of bytes, "/"
// included. pieces are the literal texts between the stars; one piece
// means no star, an exact path.
type glob struct {
	any    bool // no path in the rule: every path, even one that does not normalize
	none   bool // a hand-built allow with a broken path: matches nothing
	pieces []string
}

// maxPrefixRank caps the prefix length that counts for specificity, so
// the rank fits its bits; no real rule comes near.
const maxPrefixRank = 1 << 20

// compileRequest compiles the request rule r, whose Methods are already
// upper case.
func compileRequest(r *Rule) *reqRule {
	rr := &reqRule{methods: r.Methods, pathRank: 1}
	if r.Path == "" {
		rr.strict.any, rr.loose.any = true, true
		return rr
	}
	norm, err := normalizeGlob(r.Path)
	if err != nil {
		// Only a hand-built rule gets here. Fail closed: an allow that
		// cannot be read allows nothing, a block blocks every path.
		if r.Action == Allow {
			rr.strict.none, rr.loose.none = true, true
		} else {
			rr.strict.pieces, rr.loose.pieces = []string{"", ""}, []string{"", ""}
		}
		rr.pathRank = 2
		return rr
	}
	rr.strict.pieces = strings.Split(norm, "*")
	rr.loose.pieces = looseGlob(rr.strict.pieces)
	rr.pathRank = 2 + 2*uint32(min(len(rr.strict.pieces[0]), maxPrefixRank))
	if len(rr.strict.pieces) == 1 {
		rr.pathRank++
	}
	return rr
}

// match reports whether path (already in the glob's reading) matches.
func (g *glob) match(path string) bool {
	switch {
	case g.any:
		return true
	case g.none:
		return false
	case len(g.pieces) == 1:
		return path == g.pieces[0]
	}
	first, last := g.pieces[0], g.pieces[len(g.pieces)-1]
	if !strings.HasPrefix(path, first) {
		return false
	}
	path = path[len(first):]
	if !strings.HasSuffix(path, last) {
		return false
	}
	path = path[:len(path)-len(last)]
	// With "*" the only metacharacter, taking each middle piece at its
	// first occurrence leaves the most room for the rest: greedy is exact.
	for _, mid := range g.pieces[1 : len(g.pieces)-1] {
		i := strings.Index(path, mid)
		if i < 0 {
			return false
		}
		path = path[i+len(mid):]
	}
	return true
}

// reading is one request as one reading of its path sees it.
type reading struct {
	method string
	path   string
	ok     bool // the path normalized; if not, only path-less rules and blocks match it
	loose  bool
}

func (rr *reqRule) matches(rd *reading, allow bool) bool {
	if rr.methods != nil {
		found := false
		for _, m := range rr.methods {
			if m == rd.method {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	g := &rr.strict
	if rd.loose {
		g = &rr.loose
	}
	if g.any {
		return true
	}
	if !rd.ok {
		// A path that cannot be read: blocks match it, allows do not.
		return !allow
	}
	return g.match(rd.path)
}

// Request decides one HTTP request to name on port, on a connection the
// gate terminates (Name said Inspect). method is the request's method as
// sent; path is its request target in origin form ("/a/b?q"): the query
// and fragment are not matched, and the path is normalized here (see
// NormalizePath), so the caller may pass it raw.
//
// The decision follows the package doc: the highest layer with an
// opinion about this request decides, where plain rules and allow
// request rules are always an opinion and block request rules only about
// the requests they match. Inside the layer the most specific rule wins
// (name, then port, then path, then method list, block on a tie). When
// an allow request rule restricts the name and nothing allows the
// request, the Decision denies and Rule is that allow rule: what the
// 403 page should show as the way in. A request whose path cannot be
// normalized is matched only by rules without a path and by blocks.
//
// The path is read twice, strictly and loosely, and the request is
// allowed only if both readings allow it; method case counts in the
// strict reading only. Inspect is always false. A nil Policy denies.
func (p *Policy) Request(name string, port uint16, method, path string) Decision {
	if p == nil {
		return Decision{}
	}
	n, err := NormalizeName(name)
	if err != nil {
		return Decision{}
	}
	sp, serr := NormalizePath(path)
	strict := p.request(n, port, &reading{method: method, path: sp, ok: serr == nil})
	if strict.Verdict != Allow {
		return strict
	}
	lp, lok := loosePath(path)
	loose := p.request(n, port, &reading{method: strings.ToUpper(method), path: lp, ok: lok, loose: true})
	if loose.Verdict != Allow {
		return loose
	}
	return strict
}

// request decides one reading of a request: the highest-ranked of the
// candidate rules, where an allow request rule that does not match
// stands for a block of its name below every path (pathRank 0).
func (p *Policy) request(n string, port uint16, rd *reading) Decision {
	var buf [32]int32
	cands := p.blockRules(n, p.nameRules(n, buf[:0]))
	best, found, bestRank, verdict := int32(0), false, uint64(0), Deny
	var scratch Rule
	for _, i := range cands {
		r := p.rule(i, &scratch)
		if r.Port != 0 && r.Port != port {
			continue
		}
		allow := r.Action == Allow
		rank := uint64(r.Layer)<<48 | uint64(narrowOf(r))<<40
		if r.Port != 0 {
			rank |= 1 << 39
		}
		v := Deny
		rr := p.reqAt(i)
		switch {
		case rr == nil:
			rank |= 1 << 2
			if allow {
				v = Allow
			} else {
				rank |= 1
			}
		case rr.matches(rd, allow):
			rank |= uint64(rr.pathRank) << 2
			if rr.methods != nil {
				rank |= 2
			}
			if allow {
				v = Allow
			} else {
				rank |= 1
			}
		case allow:
			rank |= 1 // the restriction: pathRank 0, a block
		default:
			continue // a block that does not match has no opinion
		}
		// Strictly greater keeps the first of two equal rules.
		if !found || rank > bestRank {
			best, found, bestRank, verdict = i, true, rank, v
		}
	}
	if !found {
		return Decision{}
	}
	return Decision{Verdict: verdict, Rule: p.ruleOut(best)}
}

// blockRules appends the block request rules whose name pattern matches
// n, as nameRules does for the others.
func (p *Policy) blockRules(n string, out []int32) []int32 {
	if p.req == nil {
		return out
	}
	out = append(out, p.bexact[n]...)
	for i := 0; i < len(n); i++ {
		if n[i] == '.' {
			out = append(out, p.bwild[n[i+1:]]...)
		}
	}
	return out
}

// inspects reports whether a connection to n on port, allowed by rule
// w, must be inspected: whether some request on it could be decided
// otherwise. That is so when w is itself a request rule, when a block
// request rule sits in a higher layer (the layers above w have no other
// opinion about n, or they would have decided), or when a request rule
// in w's layer is at least as narrow in name and port as w (a narrower
// one, or an equal one with a path or methods, outranks w for the
// requests it matches). Request rules below w never decide.
func (p *Policy) inspects(n string, port uint16, w *Rule) bool {
	if w.IsRequest() {
		return true
	}
	if port == 0 {
		// The decision was for w's port, or for a port nobody names.
		port = w.Port
	}
	wn, wp := narrowOf(w), w.Port != 0
	var buf [32]int32
	for _, i := range p.blockRules(n, p.nameRules(n, buf[:0])) {
		if p.reqAt(i) == nil {
			continue
		}
		r := &p.rules[i]
		if r.Port != 0 && r.Port != port {
			continue
		}
		if r.Layer > w.Layer {
			return true
		}
		if rn := narrowOf(r); r.Layer == w.Layer && (rn > wn || rn == wn && (r.Port != 0 || !wp)) {
			return true
		}
	}
	return false
}

// ErrPath is matched by every error from NormalizePath. Its messages
// never quote the path: a path can carry a token.
var ErrPath = errors.New("invalid request path")

type pathError string

func (e pathError) Error() string        { return "invalid request path: " + string(e) }
func (e pathError) Is(target error) bool { return target == ErrPath }

// NormalizePath returns the form request paths are matched in, so that
// two spellings of one resource cannot be told apart by a rule
// (RFC 3986 §6.2.2): the query and fragment cut off; escapes of
// unreserved characters (letters, digits, "-", ".", "_", "~") decoded,
// other escapes kept with upper-case hex; characters a path may not
// carry raw (space, quotes, backslash, non-ASCII, ...) escaped; "." and
// ".." segments resolved (".." never climbs above "/"); empty segments
// ("//") dropped, a trailing "/" kept. An encoded "/" (%2F) or "%"
// (%25) stays encoded: as a separate segment it is a different path to
// a server that does not decode it. Request also reads every path
// loosely (see the package doc), which is where %2F counts as "/".
//
// It fails on a path that does not start with "/" (the asterisk form
// "*" included) and on a "%" not followed by two hex digits. The result
// is idempotent: NormalizePath of it returns it unchanged.
func NormalizePath(raw string) (string, error) {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i]
	}
	if raw == "" || raw[0] != '/' {
		return "", pathError(`not an absolute path; a request path in origin form starts with "/"`)
	}
	s, ok := canon(raw)
	if !ok {
		return "", pathError(`a "%" not followed by two hex digits; escape "%" as "%25"`)
	}
	return resolve(s, false), nil
}

// canon returns the strict reading's spelling of the characters of p:
// unreserved escapes decoded, other escapes upper-case, characters that
// may not appear raw escaped. "*", a glob's metacharacter, is a
// sub-delimiter and stays raw. It fails on a bad escape.
func canon(p string) (string, bool) {
	clean := true
	for i := 0; i < len(p); i++ {
		if c := p[i]; c == '%' || !pathRaw(c) {
			clean = false
			break
		}
	}
	if clean {
		return p, true
	}
	var b strings.Builder
	b.Grow(len(p) + 8)
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '%':
			if i+2 >= len(p) || unhex(p[i+1]) < 0 || unhex(p[i+2]) < 0 {
				return "", false
			}
			v := byte(unhex(p[i+1])<<4 | unhex(p[i+2]))
			i += 2
			if unreserved(v) {
				b.WriteByte(v)
			} else {
				writeEscape(&b, v)
			}
		case pathRaw(c):
			b.WriteByte(c)
		default:
			writeEscape(&b, c)
		}
	}
	return b.String(), true
}

func writeEscape(b *strings.Builder, c byte) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('%')
	b.WriteByte(hex[c>>4])
	b.WriteByte(hex[c&15])
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func unreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// pathRaw reports whether c may appear unescaped in a path: pchar and
// "/" (RFC 3986 §3.3).
func pathRaw(c byte) bool {
	if unreserved(c) {
		return true
	}
	switch c {
	case '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=', ':', '@', '/':
		return true
	}
	return false
}

// resolve drops empty, "." and ".." segments of p, which starts with
// "/" (RFC 3986 §5.2.4, with "//" collapsed). A last segment that is
// empty, "." or ".." leaves a trailing "/", as in the RFC; with loose,
// no trailing "/" is left at all, and path parameters (";..." to the
// end of a segment, which some servers drop) are cut off first.
func resolve(p string, loose bool) string {
	if resolved(p, loose) {
		return p // the common case: nothing to do, no allocation
	}
	segs := strings.Split(p[1:], "/")
	out := segs[:0]
	trail := false
	for i, s := range segs {
		if loose {
			s, _, _ = strings.Cut(s, ";")
		}
		last := i == len(segs)-1
		switch s {
		case "", ".":
			trail = last
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			trail = last
		default:
			out = append(out, s)
			trail = false
		}
	}
	r := "/" + strings.Join(out, "/")
	if trail && len(out) > 0 && !loose {
		r += "/"
	}
	return r
}

// resolved reports whether resolve would return p unchanged, or nearly:
// "/." also catches harmless names like "/.well-known".
func resolved(p string, loose bool) bool {
	if strings.Contains(p, "//") || strings.Contains(p, "/.") {
		return false
	}
	return !loose || !strings.Contains(p, ";") && (p == "/" || !strings.HasSuffix(p, "/"))
}

// maxDecode bounds how many times the loose reading decodes a path: a
// server that decodes twice is known, one that decodes nine times is
// not, and a path still changing after that is treated as unreadable.
const maxDecode = 8

// loosePath is the loose reading of raw: every escape decoded until
// nothing changes (a server may decode twice), "\" read as "/", ASCII
// case folded, path parameters dropped, dot segments resolved, "//"
// collapsed, no trailing "/". ok is false when raw is not an absolute
// path or decodes more than maxDecode times.
func loosePath(raw string) (string, bool) {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i]
	}
	if raw == "" || raw[0] != '/' {
		return "", false
	}
	s, ok := decodeFully(raw)
	if !ok {
		return "", false
	}
	s = looseChars(s)
	if s == "" || s[0] != '/' {
		return "", false
	}
	return resolve(s, true), true
}

// decodeFully decodes every valid escape in s, again and again until
// nothing changes; invalid ones stay as they are.
func decodeFully(s string) (string, bool) {
	for n := 0; strings.IndexByte(s, '%') >= 0; n++ {
		d := decodeOnce(s)
		if d == s {
			return s, true
		}
		if n == maxDecode {
			return "", false
		}
		s = d
	}
	return s, true
}

func decodeOnce(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && unhex(s[i+1]) >= 0 && unhex(s[i+2]) >= 0 {
			b.WriteByte(byte(unhex(s[i+1])<<4 | unhex(s[i+2])))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// looseChars reads "\" as "/" and folds ASCII case.
func looseChars(s string) string {
	if strings.IndexFunc(s, func(c rune) bool { return c == '\\' || c >= 'A' && c <= 'Z' }) < 0 {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		switch {
		case c == '\\':
			b[i] = '/'
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// looseGlob is the loose reading of a strict glob's pieces: decoded,
// "\" as "/", case folded, "//" collapsed, and a trailing "/" of the
// whole pattern dropped, as loosePath does to paths. Path parameters are
// left: a pattern that names one matches only in the strict reading.
func looseGlob(pieces []string) []string {
	out := make([]string, len(pieces))
	for i, pc := range pieces {
		d, ok := decodeFully(pc)
		if !ok {
			d = pc
		}
		d = looseChars(d)
		for strings.Contains(d, "//") {
			d = strings.ReplaceAll(d, "//", "/")
		}
		out[i] = d
	}
	if last := out[len(out)-1]; strings.HasSuffix(last, "/") && !(len(out) == 1 && last == "/") {
		out[len(out)-1] = strings.TrimSuffix(last, "/")
	}
	return out
}

// normalizeGlob checks a rule's path glob and returns it in the strict
// reading's spelling. The error message says what to write instead.
func normalizeGlob(g string) (string, error) {
	if g == "" || g[0] != '/' {
		return "", errors.New(`a path starts with "/"; write e.g. "example.com/api/*"`)
	}
	if strings.ContainsAny(g, "?#") {
		return "", errors.New(`a query or fragment is not matched, only the path; write the path alone`)
	}
	s, ok := canon(g)
	if !ok {
		return "", errors.New(`a "%" in the path is not followed by two hex digits; write an escape as "%2F", or "%25" for "%" itself`)
	}
	segs := strings.Split(s[1:], "/")
	for i, seg := range segs {
		switch {
		case seg == "" && i < len(segs)-1:
			return "", errors.New(`an empty path segment ("//") never matches: request paths are matched with "//" collapsed; write a single "/"`)
		case seg == "." || seg == "..":
			return "", errors.New(`a "." or ".." segment never matches: request paths are matched with them resolved; write the path they lead to`)
		}
	}
	loose := strings.Join(looseGlob(strings.Split(s, "*")), "*")
	for seg := range strings.SplitSeq(loose, "/") {
		if seg == "." || seg == ".." {
			return "", errors.New(`escaped slashes around a "." or ".." segment ("%2F..%2F") never match; write the path they lead to`)
		}
	}
	return s, nil
}

func upperAll(ms []string) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = strings.ToUpper(m)
	}
	return out
}
