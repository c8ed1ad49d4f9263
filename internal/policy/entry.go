package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// ErrEntry is matched by every error from ParseEntry and NormalizeName:
// errors.Is(err, ErrEntry).
var ErrEntry = errors.New("invalid rule entry")

// EntryError says what is wrong with an entry and what to write instead.
type EntryError struct {
	Entry string // as written
	Msg   string
}

func (e *EntryError) Error() string { return fmt.Sprintf("%q: %s", e.Entry, e.Msg) }

func (e *EntryError) Is(target error) bool { return target == ErrEntry }

func entryErr(entry, format string, args ...any) error {
	return &EntryError{Entry: entry, Msg: fmt.Sprintf(format, args...)}
}

const entryHint = `write a name ("example.com"), a wildcard ("*.example.com"), either with a port ("example.com:443") or methods and a path ("GET,HEAD example.com/api/*"), an IP address or a CIDR ("10.20.0.0/16")`

// ParseEntry parses one allow or block entry. It checks syntax only:
// Action, Layer and Source are left zero for the caller. Accepted forms:
//
//	example.com            one name, any port
//	*.example.com          every subdomain at any depth, not example.com itself
//	example.com:443        (and *.example.com:443) one port
//	192.0.2.1, 192.0.2.1:443, 192.0.2.0/24, 0.0.0.0/0:25
//	2001:db8::1, [2001:db8::1]:443, 2001:db8::/32, [2001:db8::/32]:443
//
// and request rules, for names only: [METHODS ]name[:port][/path-glob]
//
//	GET,HEAD github.com/*          these methods, any path
//	read github.com                GET, HEAD and OPTIONS (read-only), any path
//	POST api.example.com/v1/messages
//	api.example.com:443/v1/*       any method, paths under /v1/
//
// METHODS is a comma-separated list of HTTP methods from the IANA
// registry, in any case (stored upper case), or "read". The path starts
// with "/"; "*" matches any run of characters, "/" included; it is
// stored normalized (see NormalizePath) and may not hold a query, "//",
// or "." and ".." segments, which a normalized request path never has.
//
// An IPv6 address with a port needs brackets: "2001:db8::1:443" is the
// address 2001:db8::1:443. Everything else is refused with a message
// that says what to write: URLs, user info, "*" alone, "*foo.com",
// ports outside 1-65535, CIDRs with host bits set, IPv4 shorthand like
// "2130706433" or "127.1" (a name rule for it would match nothing, an
// address rule would surprise), IPv4-mapped IPv6, zones, methods or
// paths on an address.
func ParseEntry(s string) (Rule, error) {
	r := Rule{Entry: s}
	if s == "" {
		return r, entryErr(s, "empty entry; remove it")
	}
	if t := strings.TrimSpace(s); t != s {
		if t != "" && !hasControl(t) {
			return r, entryErr(s, "contains white space; write %q", t)
		}
		return r, entryErr(s, "contains white space or control characters; %s", entryHint)
	}
	if hasControl(s) {
		return r, entryErr(s, "contains white space or control characters; %s", entryHint)
	}
	if !strings.Contains(s, " ") {
		// The common case, and the one a list of 100 000 names takes:
		// no methods.
		if strings.ContainsAny(s, ".:/[") || !methodsAlone(s) {
			return parseTarget(r, s, s)
		}
	}
	fields := strings.Fields(s)
	switch len(fields) {
	case 1:
		if methodsAlone(s) {
			// A shell splits `moat network allow NAME GET x.com/*` in
			// two entries; taken apart, "x.com/*" would allow every method.
			return r, entryErr(s, "HTTP methods, not a host; a request rule is one entry: the methods, a space, the name and any path, e.g. \"%s example.com/path\" (quoted in a shell)", s)
		}
		return parseTarget(r, s, s)
	case 2:
		methods, err := parseMethods(s, fields[0], fields[1])
		if err != nil {
			return r, err
		}
		r.Methods = methods
		return parseTarget(r, s, fields[1])
	}
	if _, err := parseMethods(s, strings.Join(fields[:len(fields)-1], ""), fields[len(fields)-1]); err == nil {
		return r, entryErr(s, "white space inside the list of methods; write %q", strings.Join(fields[:len(fields)-1], "")+" "+fields[len(fields)-1])
	}
	return r, entryErr(s, `contains white space; write one rule per entry, with any methods before the name, e.g. "GET,HEAD example.com/path"`)
}

// hasControl reports whether s holds an ASCII control character; tabs
// and line breaks are control characters here, only " " separates.
func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// httpMethods is the IANA HTTP method registry (RFC 9110 §16.1), less
// "*" and PRI, which name no request. A typo must be an error rather
// than a method nobody sends: "block DELTE ..." would block nothing.
var httpMethods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true, "CONNECT": true,
	"OPTIONS": true, "TRACE": true, "PATCH": true, "QUERY": true,
	// WebDAV, CalDAV, DeltaV and relatives.
	"ACL": true, "BASELINE-CONTROL": true, "BIND": true, "CHECKIN": true, "CHECKOUT": true,
	"COPY": true, "LABEL": true, "LINK": true, "LOCK": true, "MERGE": true, "MKACTIVITY": true,
	"MKCALENDAR": true, "MKCOL": true, "MKREDIRECTREF": true, "MKWORKSPACE": true, "MOVE": true,
	"ORDERPATCH": true, "PROPFIND": true, "PROPPATCH": true, "REBIND": true, "REPORT": true,
	"SEARCH": true, "UNBIND": true, "UNCHECKOUT": true, "UNLINK": true, "UNLOCK": true,
	"UPDATE": true, "UPDATEREDIRECTREF": true, "VERSION-CONTROL": true,
}

// commonMethods are the method words refused as an entry of their own
// (see methodsAlone). Rarer methods (COPY, LOCK, SEARCH, ...) stay valid
// single-label host names.
var commonMethods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true, "PATCH": true,
	"OPTIONS": true, "CONNECT": true, "TRACE": true, "READ": true,
}

// methodsAlone reports whether s, an entry without white space, is only
// a list of methods: several, or one common one.
func methodsAlone(s string) bool {
	toks := strings.Split(s, ",")
	for _, tok := range toks {
		u := strings.ToUpper(tok)
		if !commonMethods[u] && (len(toks) == 1 || !httpMethods[u]) {
			return false
		}
	}
	return true
}

// readMethods are what "read" stands for: the methods that do not
// change anything on a server that follows RFC 9110.
var readMethods = []string{"GET", "HEAD", "OPTIONS"}

// parseMethods reads the METHODS word of a request rule; target is the
// word after it, for the examples in messages.
func parseMethods(s, list, target string) ([]string, error) {
	if strings.ContainsAny(list, ".:/*[") {
		if strings.HasPrefix(target, "/") {
			return nil, entryErr(s, "white space between the name and its path; write %q", list+target)
		}
		return nil, entryErr(s, `contains white space; write one rule per entry, with any methods before the name, e.g. "GET,HEAD example.com/path"`)
	}
	var out []string
	add := func(m string) {
		for _, x := range out {
			if x == m {
				return
			}
		}
		out = append(out, m)
	}
	for tok := range strings.SplitSeq(list, ",") {
		switch {
		case tok == "":
			return nil, entryErr(s, "an empty method in %q; separate methods with single commas, e.g. \"GET,HEAD %s\"", list, target)
		case strings.EqualFold(tok, "read"):
			for _, m := range readMethods {
				add(m)
			}
		case httpMethods[strings.ToUpper(tok)]:
			add(strings.ToUpper(tok))
		default:
			return nil, entryErr(s, "%q is not an HTTP method (white space separates methods from the name); write methods such as GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, or \"read\" for GET, HEAD and OPTIONS: e.g. \"GET,HEAD %s\"", tok, target)
		}
	}
	return out, nil
}

// errAddrRequest explains why a request rule cannot name an address.
const errAddrRequest = `methods and paths apply to names only: the gate reads requests only on connections it terminates, and it terminates TLS by the name the client asked for (SNI), never by address; write a name, e.g. "GET,HEAD example.com/api/*", or the address alone`

// parseTarget parses the part of entry s after any methods: t, which is
// s itself when there are none.
func parseTarget(r Rule, s, t string) (Rule, error) {
	if i := strings.Index(t, "://"); i >= 0 && !strings.Contains(t[:i], "/") {
		return r, entryErr(s, "a URL, not a rule; %s", urlHint(t))
	}
	host, path := t, ""
	if i := strings.IndexByte(t, '/'); i > 0 && nameish(t[:i]) {
		host, path = t[:i], t[i:]
	}
	r, err := parseHost(r, s, host)
	if err != nil {
		return r, err
	}
	if r.IsAddr() && r.Methods != nil {
		return r, entryErr(s, "%s", errAddrRequest)
	}
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		return r, entryErr(s, "a query or fragment is not matched, only the path; write %q", s[:len(s)-len(t)]+host+path[:i])
	}
	if path != "" {
		p, err := normalizeGlob(path)
		if err != nil {
			return r, entryErr(s, "%v", err)
		}
		r.Path = p
	}
	return r, nil
}

// nameish reports whether h, the text before the first "/" of an
// entry, is meant as a name (with or without a port), so that what
// follows is a path and not a CIDR's prefix length.
func nameish(h string) bool {
	if strings.HasPrefix(h, "[") || strings.Count(h, ":") > 1 {
		return false
	}
	a, _, _ := strings.Cut(h, ":")
	_, err := netip.ParseAddr(a)
	return err != nil
}

// parseHost parses a name or address with an optional port; s is the
// entry as written, for messages.
func parseHost(r Rule, s, t string) (Rule, error) {
	switch {
	case strings.Contains(t, "@"):
		_, host, _ := strings.Cut(t, "@")
		return r, entryErr(s, "user info is not part of a rule, rules match hosts; write %s", orExample(host))
	case t == "*" || t == "*.*":
		return r, entryErr(s, `a wildcard alone would match every name; write a domain's subdomains, e.g. "*.example.com"`)
	case strings.HasPrefix(t, "["):
		return parseBracketed(r, s, t)
	case strings.Contains(t, "/"):
		return parseCIDR(r, s, t)
	case strings.Count(t, ":") >= 2:
		return parseAddr(r, s, t, 0)
	}

	host, port := t, uint16(0)
	if h, ps, ok := strings.Cut(t, ":"); ok {
		p, err := parsePort(ps)
		if err != nil {
			return r, entryErr(s, "%v", err)
		}
		host, port = h, p
		if host == "" {
			return r, entryErr(s, "no host before the port; write e.g. \"example.com%s\"", t)
		}
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return parseAddr(r, s, ip.String(), port)
	}
	return parseName(r, s, host, port)
}

// parsePort accepts a decimal port 1-65535.
func parsePort(ps string) (uint16, error) {
	if ps == "" {
		return 0, errors.New(`empty port; write a port 1-65535 after the colon ("example.com:443") or leave the colon off for any port`)
	}
	for _, c := range []byte(ps) {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("port %q is not a number; write a port 1-65535, e.g. \":443\"", ps)
		}
	}
	n, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %s is out of range; write a port 1-65535, or leave the port off for any port", ps)
	}
	return uint16(n), nil
}

// parseBracketed reads "[v6]" and "[v6]:port" from t; s is the entry as
// written.
func parseBracketed(r Rule, s, t string) (Rule, error) {
	end := strings.IndexByte(t, ']')
	if end < 0 {
		return r, entryErr(s, `unclosed "["; write an IPv6 address with a port as "[2001:db8::1]:443"`)
	}
	inner, rest := t[1:end], t[end+1:]
	var port uint16
	switch {
	case rest == "":
	case strings.HasPrefix(rest, ":"):
		p, err := parsePort(rest[1:])
		if err != nil {
			return r, entryErr(s, "%v", err)
		}
		port = p
	default:
		return r, entryErr(s, `unexpected %q after "]"; write "[2001:db8::1]" or "[2001:db8::1]:443"`, rest)
	}
	if a, bits, ok := strings.Cut(inner, "/"); ok {
		if ip, err := netip.ParseAddr(a); err != nil || !ip.Is6() {
			return r, entryErr(s, `%q is not an IPv6 prefix; brackets are for IPv6 only, write e.g. "[2001:db8::/32]:443"`, inner)
		}
		return parsePrefix(r, s, a, bits, port)
	}
	ip, err := netip.ParseAddr(inner)
	if err != nil || !ip.Is6() {
		return r, entryErr(s, `%q is not an IPv6 address; brackets are for IPv6 only, write e.g. "[2001:db8::1]:443"`, inner)
	}
	return parseAddr(r, s, inner, port)
}

// parseAddr reads one address (a /32 or /128) with an optional port.
func parseAddr(r Rule, s, addr string, port uint16) (Rule, error) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		if strings.Contains(addr, "%") {
			return r, entryErr(s, "a zone (%%...) is not part of a rule; write the address without it")
		}
		return r, entryErr(s, `not an IPv6 address; with a port, write "[2001:db8::1]:443"`)
	}
	if ip.Zone() != "" {
		return r, entryErr(s, "a zone (%%%s) is not part of a rule; write %s", ip.Zone(), ip.WithZone(""))
	}
	if ip.Is4In6() {
		return r, entryErr(s, "an IPv4-mapped IPv6 address; write the IPv4 address %s", ip.Unmap())
	}
	r.Prefix = netip.PrefixFrom(ip, ip.BitLen())
	r.Port = port
	return r, nil
}

// parseCIDR reads "ip/bits" or "ip/bits:port" from t; s is the entry as
// written. A path after an address gets a hint.
func parseCIDR(r Rule, s, t string) (Rule, error) {
	addr, bits, _ := strings.Cut(t, "/")
	var port uint16
	if b, ps, ok := strings.Cut(bits, ":"); ok {
		p, err := parsePort(ps)
		if err != nil {
			if _, aerr := netip.ParseAddr(addr); aerr == nil {
				return r, entryErr(s, "%v", err)
			}
		}
		bits, port = b, p
	}
	return parsePrefix(r, s, addr, bits, port)
}

// parsePrefix reads the parts of a CIDR split at "/"; s is the entry
// as written, for messages.
func parsePrefix(r Rule, s, addr, bits string, port uint16) (Rule, error) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		if addr == "" {
			return r, entryErr(s, `a path without a host; a rule names a host, and may add a path after it, e.g. "example.com/api/*"`)
		}
		return r, entryErr(s, "not a name or an address; write %s", orExample(addr))
	}
	if ip.Zone() != "" {
		return r, entryErr(s, "a zone (%%%s) is not part of a rule; write the prefix without it", ip.Zone())
	}
	n, err := strconv.Atoi(bits)
	if err != nil && (len(bits) > 3 || strings.ContainsAny(bits, "/*")) {
		return r, entryErr(s, "%s", errAddrRequest)
	}
	if err != nil || n < 0 || n > ip.BitLen() || bits != strconv.Itoa(n) {
		return r, entryErr(s, "bad prefix length /%s; write e.g. \"10.20.0.0/16\" or \"2001:db8::/32\"", bits)
	}
	pfx := netip.PrefixFrom(ip, n)
	if ip.Is4In6() && n >= 96 {
		v4 := netip.PrefixFrom(ip.Unmap(), n-96).Masked()
		return r, entryErr(s, "an IPv4-mapped IPv6 prefix; write the IPv4 prefix %s", v4)
	}
	if pfx != pfx.Masked() {
		return r, entryErr(s, "host bits are set; write %s for the network, or %s for the one address", pfx.Masked(), ip)
	}
	r.Prefix, r.Port = pfx, port
	return r, nil
}

// parseName reads "name" or "*.name" (the port is already split off).
func parseName(r Rule, s, host string, port uint16) (Rule, error) {
	if strings.HasPrefix(host, "*.") {
		r.Wildcard = true
		host = host[2:]
	}
	if host == "" || strings.Contains(host, "*") {
		suffix := ""
		if i := strings.LastIndexByte(host, '*'); i >= 0 {
			suffix = strings.Trim(host[i+1:], ".")
			if suffix == "" {
				suffix = strings.Trim(host[:strings.IndexByte(host, '*')], ".")
			}
		}
		if suffix == "" {
			return r, entryErr(s, `a wildcard alone would match every name; write a domain's subdomains, e.g. "*.example.com"`)
		}
		return r, entryErr(s, "a wildcard must be a whole first label; write *.%s (every subdomain) or %s (the name itself)", suffix, suffix)
	}
	if ip, ok := parseIPv4Shorthand(host); ok {
		return r, entryErr(s, "IPv4 shorthand; write the dotted address %s", ip)
	}
	n, err := NormalizeName(host)
	if err != nil {
		// Re-aim the message at the entry as written, port and all.
		var ee *EntryError
		if errors.As(err, &ee) {
			return r, entryErr(s, "%s", ee.Msg)
		}
		return r, err
	}
	r.Name, r.Port = n, port
	return r, nil
}

// urlHint extracts the host (and a port, if one is written) from a URL
// so the message can say exactly what to write.
func urlHint(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Hostname() == "" {
		return `write the host name alone, e.g. "example.com"`
	}
	h := u.Hostname()
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if p := u.Port(); p != "" {
		h += ":" + p
	}
	return "write " + h
}

func orExample(host string) string {
	if host == "" {
		return `the host name alone, e.g. "example.com"`
	}
	if i := strings.IndexAny(host, "/?#"); i >= 0 {
		host = host[:i]
	}
	// scp-style "git@github.com:owner/repo": what follows the colon is
	// a path, not a port.
	if h, p, ok := strings.Cut(host, ":"); ok && strings.Count(host, ":") == 1 {
		if _, err := parsePort(p); err != nil {
			host = h
		}
	}
	if host == "" {
		return `the host name alone, e.g. "example.com"`
	}
	return host
}

// nameProfile maps Unicode names to punycode the way a resolver would
// (case folding, width mapping, NFC), but unlike idna.Lookup it allows
// "--" in the third and fourth places (CDN names such as
// "r4---sn-abc.example" use them) and underscores, which real host names
// carry though RFC 952 forbids them.
var nameProfile = idna.New(
	idna.MapForLookup(),
	idna.BidiRule(),
	idna.Transitional(false),
	idna.CheckHyphens(false),
	idna.StrictDomainName(false),
)

// maxName is the longest name in presentation form without the trailing
// dot: 255 octets on the wire less the length octets (RFC 1035 §2.3.4).
const maxName = 253

// NormalizeName returns the form names are compared in: lower case, one
// trailing dot stripped, internationalized labels as punycode. It refuses
// what is not a host name: empty labels, labels over 63 octets, names
// over 253, characters other than letters, digits, '-' and '_', and a
// last label that is a number (that is an IPv4 address in some
// spelling, and a name rule must never match an address).
func NormalizeName(s string) (string, error) {
	orig := s
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "", entryErr(orig, "empty name; %s", entryHint)
	}
	if !utf8.ValidString(s) {
		return "", entryErr(orig, "not valid UTF-8; %s", entryHint)
	}
	if needsIDNA(s) {
		a, err := nameProfile.ToASCII(s)
		if err != nil {
			return "", entryErr(orig, "not a valid internationalized name (%v); write the name as registered, e.g. \"bücher.example\" or its punycode \"xn--bcher-kva.example\"", err)
		}
		s = strings.TrimSuffix(a, ".")
	} else {
		s = strings.ToLower(s)
	}
	if len(s) > maxName {
		return "", entryErr(orig, "name is %d characters long; the most a name can have is %d", len(s), maxName)
	}
	for label := range strings.SplitSeq(s, ".") {
		switch {
		case label == "":
			return "", entryErr(orig, "empty label (two dots in a row, or a leading dot); write e.g. \"example.com\", or \"*.example.com\" for its subdomains")
		case len(label) > 63:
			return "", entryErr(orig, "label %q is %d characters long; the most is 63", label[:10]+"...", len(label))
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", entryErr(orig, "%q is not allowed in a name; %s", rune(c), entryHint)
			}
		}
	}
	last := s[strings.LastIndexByte(s, '.')+1:]
	if isNumber(last) {
		if ip, ok := parseIPv4Shorthand(s); ok {
			return "", entryErr(orig, "IPv4 shorthand; write the dotted address %s", ip)
		}
		return "", entryErr(orig, "the last label %q is a number, so this is neither a name nor an IPv4 address; %s", last, entryHint)
	}
	return s, nil
}

// needsIDNA reports whether s has non-ASCII characters or a punycode
// label, which must be checked and mapped by the IDNA profile. Plain
// ASCII names take the fast path: NormalizeName runs on every packet's
// name.
func needsIDNA(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return true
		}
	}
	for label := range strings.SplitSeq(s, ".") {
		if len(label) >= 4 && strings.EqualFold(label[:4], "xn--") {
			return true
		}
	}
	return false
}

// isNumber reports whether a label reads as a number in inet_aton's
// grammar (decimal, octal with a leading 0, hex with 0x). The WHATWG URL
// standard treats a host whose last label is such a number as IPv4.
func isNumber(label string) bool {
	if label == "" {
		return false
	}
	if len(label) >= 2 && label[0] == '0' && (label[1] == 'x' || label[1] == 'X') {
		for _, c := range []byte(label[2:]) {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
		return true
	}
	for _, c := range []byte(label) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// parseIPv4Shorthand reads the inet_aton forms resolvers and browsers
// accept ("2130706433", "127.1", "0x7f.0.0.1", "0177.0.0.1") so an entry
// written that way gets the dotted address as a hint instead of becoming
// a name rule that matches nothing.
func parseIPv4Shorthand(s string) (netip.Addr, bool) {
	if i := strings.LastIndexByte(s, '.'); !isNumber(s[i+1:]) {
		return netip.Addr{}, false // the usual name: spare the split
	}
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		if !isNumber(p) {
			return netip.Addr{}, false
		}
		base, digits := 10, p
		switch {
		case len(p) >= 2 && (p[1] == 'x' || p[1] == 'X'):
			base, digits = 16, p[2:]
			if digits == "" {
				digits = "0"
			}
		case len(p) > 1 && p[0] == '0':
			base = 8
		}
		n, err := strconv.ParseUint(digits, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		nums[i] = n
	}
	// The last part fills the remaining bytes; earlier parts are bytes.
	var v uint64
	for i, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, false
		}
		v |= n << (8 * (3 - i))
	}
	last := nums[len(nums)-1]
	if last >= 1<<(8*(5-len(nums))) {
		return netip.Addr{}, false
	}
	v |= last
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// FromEntries parses entries into rules with the given action, layer and
// source. Any bad entry fails the whole list (all problems joined): half
// a policy must not be applied.
func FromEntries(entries []string, a Action, l Layer, source string) ([]Rule, error) {
	rules := make([]Rule, 0, len(entries))
	var errs []error
	for _, e := range entries {
		r, err := ParseEntry(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.Action, r.Layer, r.Source = a, l, source
		rules = append(rules, r)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", source, errors.Join(errs...))
	}
	return rules, nil
}

// AllowEntry is the allow entry a person would write for a destination:
// the name alone for the web ports (a name rule covers 80 and 443
// together, and port 0, unknown, too), name:port for other ports, and
// ip:port when there is no name. Every place that offers a rule (the
// refusal page, a failed command's hint, `moat network suggest`, the
// watcher's answers) writes it with this.
func AllowEntry(name string, addr netip.Addr, port uint16) string {
	if name == "" {
		return netip.AddrPortFrom(addr, port).String()
	}
	if port == 0 || port == 80 || port == 443 {
		return name
	}
	return name + ":" + strconv.Itoa(int(port))
}
