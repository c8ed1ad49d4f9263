package peek

import (
	"fmt"
)

// MaxHelloBytes bounds the stream bytes (record headers included) that may
// carry one ClientHello. Real ones are 0.5–2 KiB, post-quantum key shares
// included; 64 KiB leaves room for large PSK identities while keeping what
// the gate buffers per pending connection small. Past it ParseClientHello
// returns ErrTooLarge, never ErrNeedMore.
const MaxHelloBytes = 64 << 10

const (
	recordHeaderLen  = 5
	maxRecordLen     = 1 << 14 // RFC 8446 §5.1: TLSPlaintext.length MUST NOT exceed 2^14
	contentHandshake = 22
	typeClientHello  = 1
	maxMinorVersion  = 0x0f // record versions 3.0 … 3.15; clients send 3.1 or 3.3

	extServerName = 0
	extALPN       = 16
	extECH        = 0xfe0d // encrypted_client_hello, RFC 9849
)

// ClientHello is what the gate needs from a TLS ClientHello.
type ClientHello struct {
	// SNI is the server_name host_name, lower case without a trailing dot;
	// empty when the extension is absent. With ECH it is the outer (public)
	// name, not the name the client is really after.
	SNI string
	// ECH is set when the encrypted_client_hello extension is present: the
	// real server name is encrypted and SNI cannot be trusted to name it.
	ECH bool
	// ALPN lists the offered application protocols in the client's order.
	ALPN []string
}

// ParseClientHello parses the ClientHello at the start of b, the bytes the
// guest has sent so far. The ClientHello may be fragmented across several
// handshake records and those across any number of reads; bytes after it
// are ignored.
func ParseClientHello(b []byte) (ClientHello, error) {
	msg, err := reassemble(b)
	if err != nil {
		return ClientHello{}, err
	}
	return parseHello(msg)
}

// reassemble collects handshake records from the start of b until they hold
// one whole handshake message, checks that it is a ClientHello and returns
// its body.
func reassemble(b []byte) ([]byte, error) {
	var hs []byte // handshake bytes from the records so far
	need := -1    // handshake bytes that make up the ClientHello, once known
	for off := 0; ; {
		if off+recordHeaderLen+1 > MaxHelloBytes {
			return nil, fmt.Errorf("ClientHello over %d bytes: %w", MaxHelloBytes, ErrTooLarge)
		}
		h := b[off:min(off+recordHeaderLen, len(b))]
		if err := checkRecordHeader(h, off == 0); err != nil {
			return nil, err
		}
		n := int(h[3])<<8 | int(h[4])
		switch {
		case n == 0:
			// RFC 8446 §5.1: no zero-length handshake fragments. Allowing them
			// would also let a guest make the gate loop on empty records.
			return nil, fmt.Errorf("%w ClientHello: empty handshake record", ErrMalformed)
		case n > maxRecordLen:
			return nil, fmt.Errorf("%w ClientHello: record of %d bytes", ErrMalformed, n)
		case off+recordHeaderLen+n > MaxHelloBytes:
			return nil, fmt.Errorf("ClientHello over %d bytes: %w", MaxHelloBytes, ErrTooLarge)
		}
		off += recordHeaderLen
		if len(b)-off < n {
			if need < 0 {
				// Refuse a wrong type or an impossible length now rather than
				// after buffering the whole record.
				partial := append(hs[:len(hs):len(hs)], b[off:min(off+4, len(b))]...)
				if _, err := handshakeLen(partial); err != nil {
					return nil, err
				}
			}
			return nil, ErrNeedMore
		}
		hs = append(hs, b[off:off+n]...)
		off += n
		if need < 0 {
			var err error
			if need, err = handshakeLen(hs); err != nil && err != ErrNeedMore {
				return nil, err
			}
		}
		if need >= 0 && len(hs) >= need {
			// Handshake bytes past the ClientHello would be a second message
			// in the client's first flight, which TLS does not have; they are
			// none of the gate's business either way.
			return hs[4:need], nil
		}
	}
}

// handshakeLen returns the length of the ClientHello message, its 4-byte
// header included, that hs starts with.
func handshakeLen(hs []byte) (int, error) {
	if len(hs) >= 1 && hs[0] != typeClientHello {
		return -1, fmt.Errorf("handshake message of type %d: %w", hs[0], ErrNotTLS)
	}
	if len(hs) < 4 {
		return -1, ErrNeedMore
	}
	need := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
	if need+recordHeaderLen > MaxHelloBytes {
		return -1, fmt.Errorf("ClientHello of %d bytes: %w", need, ErrTooLarge)
	}
	return need, nil
}

// checkRecordHeader checks as much of a record header as h holds, so that a
// stream that is not TLS is told apart from the first byte on. first says
// whether this is the stream's first record: there a wrong type means "not
// TLS"; later it means a record was interleaved into the ClientHello.
func checkRecordHeader(h []byte, first bool) error {
	bad := ErrMalformed
	if first {
		bad = ErrNotTLS
	}
	if len(h) >= 1 && h[0] != contentHandshake {
		return fmt.Errorf("record of type %d: %w", h[0], bad)
	}
	if len(h) >= 2 && h[1] != 3 {
		return fmt.Errorf("record version %d.x: %w", h[1], bad)
	}
	if len(h) >= 3 && h[2] > maxMinorVersion {
		return fmt.Errorf("record version 3.%d: %w", h[2], bad)
	}
	if len(h) < recordHeaderLen {
		return ErrNeedMore
	}
	return nil
}

// parseHello parses a ClientHello body (RFC 8446 §4.1.2). Every length must
// match exactly: a parser that skips what it does not understand can be made
// to read a different SNI than the server will.
func parseHello(m []byte) (ClientHello, error) {
	c := cursor(m)
	malformed := func(what string) (ClientHello, error) {
		return ClientHello{}, fmt.Errorf("%w ClientHello: %s", ErrMalformed, what)
	}
	ver, ok := c.u16()
	if !ok || ver>>8 != 3 {
		return malformed("legacy version")
	}
	if _, ok := c.bytes(32); !ok {
		return malformed("random")
	}
	if sid, ok := c.vec8(); !ok || len(sid) > 32 {
		return malformed("session id")
	}
	if suites, ok := c.vec16(); !ok || len(suites) < 2 || len(suites)%2 != 0 {
		return malformed("cipher suites")
	}
	if comp, ok := c.vec8(); !ok || len(comp) < 1 {
		return malformed("compression methods")
	}
	var hello ClientHello
	if len(c) == 0 {
		return hello, nil // no extensions at all: TLS 1.2 allows it
	}
	exts, ok := c.vec16()
	if !ok || len(c) != 0 {
		return malformed("extensions length")
	}
	seen := make(map[int]bool)
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec16()
		if !ok1 || !ok2 {
			return malformed("extension length")
		}
		// RFC 8446 §4.2: at most one extension of each type. Two SNIs are
		// the classic way to make a middlebox and a server disagree.
		if seen[typ] {
			return malformed(fmt.Sprintf("duplicate extension %d", typ))
		}
		seen[typ] = true
		var err error
		switch typ {
		case extServerName:
			hello.SNI, err = parseSNI(data)
		case extALPN:
			hello.ALPN, err = parseALPN(data)
		case extECH:
			if len(data) == 0 {
				return malformed("empty encrypted_client_hello")
			}
			hello.ECH = true
		}
		if err != nil {
			return ClientHello{}, err
		}
	}
	return hello, nil
}

// parseSNI parses a server_name extension (RFC 6066 §3): exactly one entry,
// of type host_name.
func parseSNI(data cursor) (string, error) {
	list, ok := data.vec16()
	if !ok || len(data) != 0 || len(list) == 0 {
		return "", fmt.Errorf("%w ClientHello: server_name length", ErrMalformed)
	}
	var name string
	for len(list) > 0 {
		typ, ok1 := list.u8()
		host, ok2 := list.vec16()
		if !ok1 || !ok2 {
			return "", fmt.Errorf("%w ClientHello: server_name entry length", ErrMalformed)
		}
		if typ != 0 {
			return "", fmt.Errorf("%w ClientHello: server_name of type %d", ErrMalformed, typ)
		}
		if name != "" {
			return "", fmt.Errorf("%w ClientHello: two host_names in server_name", ErrMalformed)
		}
		n, err := normalizeName(host, false)
		if err != nil {
			return "", fmt.Errorf("SNI: %w", err)
		}
		name = n
	}
	return name, nil
}

// parseALPN parses an application_layer_protocol_negotiation extension
// (RFC 7301 §3.1): a non-empty list of non-empty names.
func parseALPN(data cursor) ([]string, error) {
	list, ok := data.vec16()
	if !ok || len(data) != 0 || len(list) == 0 {
		return nil, fmt.Errorf("%w ClientHello: ALPN length", ErrMalformed)
	}
	var protos []string
	for len(list) > 0 {
		p, ok := list.vec8()
		if !ok || len(p) == 0 {
			return nil, fmt.Errorf("%w ClientHello: ALPN entry", ErrMalformed)
		}
		protos = append(protos, string(p))
	}
	return protos, nil
}

// cursor reads big-endian integers and length-prefixed vectors off the front
// of a byte slice; every read reports whether the bytes were there.
type cursor []byte

func (c *cursor) u8() (int, bool) {
	if len(*c) < 1 {
		return 0, false
	}
	v := int((*c)[0])
	*c = (*c)[1:]
	return v, true
}

func (c *cursor) u16() (int, bool) {
	if len(*c) < 2 {
		return 0, false
	}
	v := int((*c)[0])<<8 | int((*c)[1])
	*c = (*c)[2:]
	return v, true
}

func (c *cursor) bytes(n int) (cursor, bool) {
	if len(*c) < n {
		return nil, false
	}
	v := (*c)[:n:n]
	*c = (*c)[n:]
	return v, true
}

func (c *cursor) vec8() (cursor, bool) {
	n, ok := c.u8()
	if !ok {
		return nil, false
	}
	return c.bytes(n)
}

func (c *cursor) vec16() (cursor, bool) {
	n, ok := c.u16()
	if !ok {
		return nil, false
	}
	return c.bytes(n)
}
