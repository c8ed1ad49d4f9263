// Package peek reads the name a guest connection is headed for from the first
// bytes the guest sends: the SNI of a TLS ClientHello, or the Host of an
// HTTP/1.x request head. It never terminates TLS and never writes: the gate
// buffers what the guest sent, asks peek, decides, and then replays the same
// bytes upstream.
//
// The parsers face an adversary (the guest chooses every byte), so they are
// strict where a lenient reading could let the gate and the upstream server
// see different names: duplicate SNI or Host, userinfo, percent-encoding,
// folded headers and bare line endings are errors, and every error means the
// gate denies. They take the stream as it has arrived so far and return
// ErrNeedMore until they can answer; an answer, once given, never changes as
// more bytes arrive. Sizes are bounded (MaxHelloBytes, MaxHeadBytes), so the
// gate never has to buffer more than that before it gets a verdict.
package peek

import (
	"errors"
	"fmt"
	"net/netip"
)

var (
	// ErrNeedMore means the bytes so far are a valid beginning: read more
	// and call again with everything read.
	ErrNeedMore = errors.New("need more bytes")
	// ErrNotTLS means the stream does not start with a TLS handshake record
	// carrying a ClientHello.
	ErrNotTLS = errors.New("not a TLS ClientHello")
	// ErrNotHTTP means the stream does not start with an HTTP/1.x request line.
	ErrNotHTTP = errors.New("not an HTTP/1.x request")
	// ErrTooLarge means the ClientHello or request head is larger than the
	// gate is willing to buffer.
	ErrTooLarge = errors.New("too large")
	// ErrMalformed means the stream is TLS or HTTP but breaks the format.
	ErrMalformed = errors.New("malformed")
	// ErrBadName means a host name (SNI, Host, request target) is not a
	// plain DNS name or IP literal the gate can decide on.
	ErrBadName = errors.New("bad host name")
)

// LooksLikeTLS reports whether b starts like a TLS handshake record:
// content type 22, record version 3.x. It needs 3 bytes.
func LooksLikeTLS(b []byte) bool {
	return len(b) >= 3 && b[0] == contentHandshake && b[1] == 3 && b[2] <= maxMinorVersion
}

// methods are the request methods LooksLikeHTTP recognises: RFC 9110's and
// PATCH. ParseHTTPHead accepts any token as a method; this list is only for
// telling HTTP from other protocols on ports where either may appear.
var methods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}

// LooksLikeHTTP reports whether b starts with a known request method
// followed by a space. It needs the whole method and the space.
func LooksLikeHTTP(b []byte) bool {
	for _, m := range methods {
		if len(b) > len(m) && string(b[:len(m)]) == m && b[len(m)] == ' ' {
			return true
		}
	}
	return false
}

// maxNameLen is the longest DNS name in text form without the trailing dot
// (RFC 1035: 255 octets on the wire).
const maxNameLen = 253

// normalizeName turns a host name from the wire into the form policy
// compares: lower case, no trailing dot. It accepts only [a-z0-9._-]
// (after folding case), so IDNs must arrive as punycode, and it rejects
// empty labels, labels over 63 bytes and names whose last label is all
// digits: those are not DNS names but IPv4 literals or the numeric forms
// inet_aton accepts ("2130706433", "127.1"), which a resolver could turn
// into an address the name rule never meant. When allowIPv4 is set a
// dotted-quad IPv4 literal is returned as is.
func normalizeName(raw []byte, allowIPv4 bool) (string, error) {
	if len(raw) > 0 && raw[len(raw)-1] == '.' {
		raw = raw[:len(raw)-1]
	}
	if len(raw) == 0 {
		return "", fmt.Errorf("%w: empty", ErrBadName)
	}
	if len(raw) > maxNameLen {
		return "", fmt.Errorf("%w: %d bytes long", ErrBadName, len(raw))
	}
	name := make([]byte, len(raw))
	labelLen, digitsOnly := 0, true
	for i, c := range raw {
		switch {
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
			digitsOnly = false
		case 'a' <= c && c <= 'z', c == '-', c == '_':
			digitsOnly = false
		case '0' <= c && c <= '9':
		case c == '.':
			if labelLen == 0 {
				return "", fmt.Errorf("%w %q: empty label", ErrBadName, raw)
			}
			labelLen, digitsOnly = 0, true
			name[i] = c
			continue
		default:
			return "", fmt.Errorf("%w %q: byte 0x%02x", ErrBadName, raw, c)
		}
		name[i] = c
		if labelLen++; labelLen > 63 {
			return "", fmt.Errorf("%w %q: label longer than 63 bytes", ErrBadName, raw)
		}
	}
	if labelLen == 0 {
		return "", fmt.Errorf("%w %q: empty label", ErrBadName, raw)
	}
	s := string(name)
	if digitsOnly {
		if a, err := netip.ParseAddr(s); allowIPv4 && err == nil && a.Is4() {
			return s, nil
		}
		return "", fmt.Errorf("%w %q: numeric last label (an address, not a name)", ErrBadName, s)
	}
	return s, nil
}
