package peek

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
)

// MaxHeadBytes bounds an HTTP request head, request line to blank line
// included. 32 KiB is well above what clients send (Go's server allows 1 MiB,
// nginx 8 KiB per line by default) yet small enough to hold per pending
// connection. Past it ParseHTTPHead returns ErrTooLarge, never ErrNeedMore.
const MaxHeadBytes = 32 << 10

// maxMethodLen bounds the request method, so that a stream that is not HTTP
// is recognised after a few bytes rather than at MaxHeadBytes.
const maxMethodLen = 32

// Request is what the gate needs from an HTTP/1.x request head.
type Request struct {
	Method string // as sent; methods are case-sensitive
	Target string // the request target as sent
	// Host is the host the request is for, lower case without a trailing
	// dot, an IPv6 literal without brackets: from an absolute-form or
	// CONNECT target, else from the Host header. It is empty only for an
	// HTTP/1.0 request that names no host at all.
	Host string
	// Port is the port written next to that host, 0 when none was.
	Port uint16
	// HeaderEnd is the length of the head, blank line included; the body or
	// the next request starts there.
	HeaderEnd int
}

// ParseHTTPHead parses the HTTP/1.x request head at the start of b, the
// bytes the guest has sent so far. It returns ErrNeedMore until the blank
// line that ends the head has arrived, and ErrNotHTTP as soon as the first
// bytes cannot start a request line.
//
// Lines must end in CRLF. Rejected, because a server or proxy could read
// them differently from the gate: bare CR or LF, folded header lines,
// whitespace before a header's colon, more than one Host header, a Host that
// disagrees with an absolute-form target, userinfo in the target, a
// percent-encoded host, and HTTP/1.1 without a Host header.
func ParseHTTPHead(b []byte) (Request, error) {
	mlen, err := scanMethod(b)
	if err != nil {
		return Request{}, err
	}
	line, p, err := nextLine(b, 0)
	if err != nil {
		return Request{}, err
	}
	r := Request{Method: string(line[:mlen])}
	target, version, ok := strings.Cut(string(line[mlen+1:]), " ")
	if !ok || strings.Contains(version, " ") {
		return Request{}, fmt.Errorf("request line %q: %w", truncate(line), ErrNotHTTP)
	}
	if version != "HTTP/1.1" && version != "HTTP/1.0" {
		return Request{}, fmt.Errorf("version %q: %w", truncate([]byte(version)), ErrNotHTTP)
	}
	r.Target = target
	tgt, err := parseTarget(r.Method, target)
	if err != nil {
		return Request{}, err
	}

	var host *authority
	for {
		line, p, err = nextLine(b, p)
		if err != nil {
			return Request{}, err
		}
		if len(line) == 0 {
			break
		}
		name, value, err := parseField(line)
		if err != nil {
			return Request{}, err
		}
		if !strings.EqualFold(name, "host") {
			continue
		}
		if host != nil {
			return Request{}, fmt.Errorf("%w request: more than one Host header", ErrMalformed)
		}
		a, err := parseAuthority(value, false)
		if err != nil {
			return Request{}, fmt.Errorf("Host header: %w", err)
		}
		host = &a
	}
	r.HeaderEnd = p

	switch {
	case tgt.host != "" && host != nil && !sameAuthority(tgt, *host):
		return Request{}, fmt.Errorf("%w request: Host %q differs from target %q", ErrMalformed, host.String(), tgt.String())
	case tgt.host != "":
		r.Host, r.Port = tgt.host, tgt.port
	case host != nil:
		r.Host, r.Port = host.host, host.port
	case version == "HTTP/1.1":
		// RFC 9112 §3.2: a server MUST reject it.
		return Request{}, fmt.Errorf("%w request: HTTP/1.1 without a Host header", ErrMalformed)
	}
	return r, nil
}

// scanMethod checks that b starts with a method token and a space, and
// returns the method's length. It looks only at the bytes it needs, so a
// stream that is not HTTP fails here before its first line is complete.
func scanMethod(b []byte) (int, error) {
	for i := 0; i < len(b) && i <= maxMethodLen; i++ {
		switch c := b[i]; {
		case c == ' ' && i > 0:
			return i, nil
		case !isTchar(c):
			return 0, fmt.Errorf("byte 0x%02x in method: %w", c, ErrNotHTTP)
		}
	}
	if len(b) > maxMethodLen {
		return 0, fmt.Errorf("method longer than %d bytes: %w", maxMethodLen, ErrNotHTTP)
	}
	return 0, ErrNeedMore
}

// nextLine returns the CRLF-terminated line at b[p:], without the CRLF, and
// the offset after it.
func nextLine(b []byte, p int) ([]byte, int, error) {
	i := bytes.IndexByte(b[p:], '\n')
	if i < 0 {
		if len(b) >= MaxHeadBytes {
			return nil, 0, fmt.Errorf("request head over %d bytes: %w", MaxHeadBytes, ErrTooLarge)
		}
		return nil, 0, ErrNeedMore
	}
	end := p + i + 1
	if end > MaxHeadBytes {
		return nil, 0, fmt.Errorf("request head over %d bytes: %w", MaxHeadBytes, ErrTooLarge)
	}
	if i == 0 || b[end-2] != '\r' {
		return nil, 0, fmt.Errorf("%w request: line ends in LF without CR", ErrMalformed)
	}
	line := b[p : end-2]
	if bytes.IndexByte(line, '\r') >= 0 {
		return nil, 0, fmt.Errorf("%w request: CR inside a line", ErrMalformed)
	}
	return line, end, nil
}

// parseField splits a header line into name and value (RFC 9112 §5).
func parseField(line []byte) (string, string, error) {
	if line[0] == ' ' || line[0] == '\t' {
		// RFC 9112 §5.2: obs-fold. Unfolding differs between implementations.
		return "", "", fmt.Errorf("%w request: folded header line", ErrMalformed)
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		return "", "", fmt.Errorf("%w request: header line without a name", ErrMalformed)
	}
	name := line[:colon]
	for _, c := range name {
		if !isTchar(c) {
			// Includes whitespace before the colon, "Host :", which RFC 9112
			// §5.1 says to reject.
			return "", "", fmt.Errorf("%w request: byte 0x%02x in header name %q", ErrMalformed, c, truncate(name))
		}
	}
	value := bytes.Trim(line[colon+1:], " \t")
	for _, c := range value {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return "", "", fmt.Errorf("%w request: control byte 0x%02x in header %q", ErrMalformed, c, name)
		}
	}
	return string(name), string(value), nil
}

// authority is a host and the port written next to it (0 if none).
type authority struct {
	host        string
	port        uint16
	defaultPort uint16 // what a missing port means where it came from
}

func (a authority) String() string {
	h := a.host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if a.port == 0 {
		return h
	}
	return fmt.Sprintf("%s:%d", h, a.port)
}

// sameAuthority reports whether the Host header h names the same host and
// port as the target's authority t, a missing port meaning the target's
// default.
func sameAuthority(t, h authority) bool {
	tp, hp := t.port, h.port
	if tp == 0 {
		tp = t.defaultPort
	}
	if hp == 0 {
		hp = t.defaultPort
	}
	return t.host == h.host && tp == hp
}

// parseTarget checks the request target (RFC 9112 §3.2) and returns the
// authority it names, if any.
func parseTarget(method, target string) (authority, error) {
	for i := 0; i < len(target); i++ {
		if c := target[i]; c <= ' ' || c >= 0x7f {
			return authority{}, fmt.Errorf("%w request: byte 0x%02x in target", ErrMalformed, c)
		}
	}
	switch {
	case method == "CONNECT":
		a, err := parseAuthority(target, true)
		if err != nil {
			return authority{}, fmt.Errorf("CONNECT target: %w", err)
		}
		a.defaultPort = a.port
		return a, nil
	case strings.HasPrefix(target, "/"):
		return authority{}, nil
	case target == "*":
		if method != "OPTIONS" {
			return authority{}, fmt.Errorf("%w request: target * with %s", ErrMalformed, method)
		}
		return authority{}, nil
	}
	scheme, rest, ok := strings.Cut(target, "://")
	var def uint16
	switch {
	case ok && strings.EqualFold(scheme, "http"):
		def = 80
	case ok && strings.EqualFold(scheme, "https"):
		def = 443
	default:
		return authority{}, fmt.Errorf("%w request: target %q is neither a path nor an http URL", ErrMalformed, truncate([]byte(target)))
	}
	auth := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		auth = rest[:i]
	}
	if strings.Contains(auth, "@") {
		// userinfo: "http://allowed.example@evil.example/" reads as one host
		// to a person and as another to a server.
		return authority{}, fmt.Errorf("%w request: userinfo in target", ErrMalformed)
	}
	a, err := parseAuthority(auth, false)
	if err != nil {
		return authority{}, fmt.Errorf("request target: %w", err)
	}
	a.defaultPort = def
	return a, nil
}

// parseAuthority parses host[:port], where host is a DNS name, an IPv4
// literal or a bracketed IPv6 literal.
func parseAuthority(s string, needPort bool) (authority, error) {
	if s == "" {
		return authority{}, fmt.Errorf("%w: empty", ErrBadName)
	}
	if strings.Contains(s, "%") {
		// Percent-encoded names and IPv6 zone ids: decoding is where a gate
		// and a server come to disagree.
		return authority{}, fmt.Errorf("%w %q: percent-encoding", ErrBadName, truncate([]byte(s)))
	}
	var a authority
	var port string
	hasPort := false
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return authority{}, fmt.Errorf("%w %q: unclosed [", ErrBadName, truncate([]byte(s)))
		}
		ip, err := netip.ParseAddr(s[1:end])
		if err != nil || !ip.Is6() {
			return authority{}, fmt.Errorf("%w %q: not an IPv6 address in brackets", ErrBadName, truncate([]byte(s)))
		}
		a.host = ip.String()
		switch rest := s[end+1:]; {
		case rest == "":
		case rest[0] == ':':
			port, hasPort = rest[1:], true
		default:
			return authority{}, fmt.Errorf("%w %q: bytes after ]", ErrBadName, truncate([]byte(s)))
		}
	} else {
		host := s
		if i := strings.IndexByte(s, ':'); i >= 0 {
			host, port, hasPort = s[:i], s[i+1:], true
		}
		name, err := normalizeName([]byte(host), true)
		if err != nil {
			return authority{}, err
		}
		a.host = name
	}
	if hasPort {
		p, ok := parsePort(port)
		if !ok {
			return authority{}, fmt.Errorf("%w %q: bad port", ErrBadName, truncate([]byte(s)))
		}
		a.port = p
	} else if needPort {
		return authority{}, fmt.Errorf("%w %q: no port", ErrBadName, truncate([]byte(s)))
	}
	return a, nil
}

// parsePort parses 1 to 5 decimal digits as a port from 1 to 65535.
func parsePort(s string) (uint16, bool) {
	if len(s) == 0 || len(s) > 5 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	if n == 0 || n > 65535 {
		return 0, false
	}
	return uint16(n), true
}

// isTchar reports whether c may appear in a token (RFC 9110 §5.6.2).
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// truncate keeps error messages about guest-chosen bytes short.
func truncate(b []byte) []byte {
	const n = 64
	if len(b) > n {
		return append(b[:n:n], "..."...)
	}
	return b
}
