package peek

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	mrand "math/rand/v2"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
)

// captureConn is the edge a real crypto/tls client writes its ClientHello
// into; reads fail, so the handshake stops right after.
type captureConn struct{ buf bytes.Buffer }

func (c *captureConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (c *captureConn) Write(b []byte) (int, error)      { return c.buf.Write(b) }
func (c *captureConn) Close() error                     { return nil }
func (c *captureConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *captureConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *captureConn) SetDeadline(time.Time) error      { return nil }
func (c *captureConn) SetReadDeadline(time.Time) error  { return nil }
func (c *captureConn) SetWriteDeadline(time.Time) error { return nil }

// realHello returns the first flight of a crypto/tls client.
func realHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c := &captureConn{}
	if err := tls.Client(c, cfg).Handshake(); err == nil {
		t.Fatal("handshake with no server succeeded")
	}
	if c.buf.Len() == 0 {
		t.Fatal("client wrote nothing")
	}
	return c.buf.Bytes()
}

// handshakeBytes strips the record framing off a stream of handshake records.
func handshakeBytes(t testing.TB, stream []byte) []byte {
	t.Helper()
	var hs []byte
	for len(stream) > 0 {
		if len(stream) < 5 || stream[0] != 22 {
			t.Fatalf("not a handshake record: % x", stream[:min(5, len(stream))])
		}
		n := int(stream[3])<<8 | int(stream[4])
		hs = append(hs, stream[5:5+n]...)
		stream = stream[5+n:]
	}
	return hs
}

// reframe splits handshake bytes into records whose sizes size returns.
func reframe(hs []byte, size func() int) []byte {
	var out []byte
	for len(hs) > 0 {
		n := min(size(), len(hs))
		out = append(out, 22, 3, 1, byte(n>>8), byte(n))
		out = append(out, hs[:n]...)
		hs = hs[n:]
	}
	return out
}

// echConfigList builds an ECHConfigList (RFC 9849 §4) for a fresh X25519
// key, enough for crypto/tls to send a real ECH ClientHello.
func echConfigList(t testing.TB, publicName string) []byte {
	t.Helper()
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub := key.PublicKey().Bytes()
	var c []byte
	c = append(c, 7)      // config_id
	c = be16(c, 0x0020)   // DHKEM(X25519, HKDF-SHA256)
	c = be16(c, len(pub)) //
	c = append(c, pub...) //
	c = be16(c, 4)        // cipher suites:
	c = be16(c, 1)        //   HKDF-SHA256
	c = be16(c, 1)        //   AES-128-GCM
	c = append(c, 0)      // maximum_name_length
	c = append(c, byte(len(publicName)))
	c = append(c, publicName...)
	c = be16(c, 0) // extensions
	cfg := be16(be16(nil, 0xfe0d), len(c))
	cfg = append(cfg, c...)
	return append(be16(nil, len(cfg)), cfg...)
}

func be16(b []byte, v int) []byte { return append(b, byte(v>>8), byte(v)) }

func TestParseClientHelloReal(t *testing.T) {
	tests := []struct {
		name string
		cfg  *tls.Config
		want ClientHello
	}{
		{"sni", &tls.Config{ServerName: "api.example.com"}, ClientHello{SNI: "api.example.com"}},
		{"sni case and dot", &tls.Config{ServerName: "API.Example.COM."}, ClientHello{SNI: "api.example.com"}},
		{"no sni", &tls.Config{InsecureSkipVerify: true}, ClientHello{}},
		{"alpn", &tls.Config{ServerName: "x.example", NextProtos: []string{"h2", "http/1.1"}}, ClientHello{SNI: "x.example", ALPN: []string{"h2", "http/1.1"}}},
		{"tls12 only", &tls.Config{ServerName: "old.example", MaxVersion: tls.VersionTLS12}, ClientHello{SNI: "old.example"}},
		{"ech", &tls.Config{ServerName: "secret.example", MinVersion: tls.VersionTLS13, EncryptedClientHelloConfigList: echConfigList(t, "public.example")},
			ClientHello{SNI: "public.example", ECH: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := realHello(t, tt.cfg)
			got, err := ParseClientHello(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			if !LooksLikeTLS(b) {
				t.Error("LooksLikeTLS = false")
			}
			if tt.want.ECH && bytes.Contains(b, []byte("secret.example")) {
				t.Error("inner name visible in ECH ClientHello")
			}
			// Every shorter prefix, as if each byte were its own TCP segment.
			for i := range len(b) {
				if _, err := ParseClientHello(b[:i]); err != ErrNeedMore {
					t.Fatalf("prefix of %d/%d bytes: got %v, want ErrNeedMore", i, len(b), err)
				}
			}
		})
	}
}

func TestParseClientHelloFragmented(t *testing.T) {
	hs := handshakeBytes(t, realHello(t, &tls.Config{ServerName: "frag.example", NextProtos: []string{"h2"}}))
	want := ClientHello{SNI: "frag.example", ALPN: []string{"h2"}}
	rng := mrand.New(mrand.NewPCG(1, 2))
	sizes := map[string]func() int{
		"1-byte records": func() int { return 1 },
		"3-byte records": func() int { return 3 }, // splits the 4-byte handshake header
		"7-byte records": func() int { return 7 },
		"random records": func() int { return 1 + rng.IntN(300) },
		"one big record": func() int { return 1 << 14 },
		"header then all": func() func() int {
			first := true
			return func() int {
				if first {
					first = false
					return 4
				}
				return 1 << 14
			}
		}(),
	}
	for name, size := range sizes {
		t.Run(name, func(t *testing.T) {
			stream := reframe(hs, size)
			// Segments of 1 byte and of random sizes, appended as a reader would.
			for _, seg := range []func() int{func() int { return 1 }, func() int { return 1 + rng.IntN(200) }} {
				var buf []byte
				for off := 0; off < len(stream); {
					n := min(seg(), len(stream)-off)
					buf = append(buf, stream[off:off+n]...)
					off += n
					got, err := ParseClientHello(buf)
					if off < len(stream) {
						if err != ErrNeedMore {
							t.Fatalf("after %d/%d bytes: got %v, want ErrNeedMore", off, len(stream), err)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("got %+v, want %+v", got, want)
					}
				}
			}
		})
	}
}

func TestParseClientHelloTrailingBytesIgnored(t *testing.T) {
	b := realHello(t, &tls.Config{ServerName: "a.example"})
	b = append(b, 20, 3, 3, 0, 1, 1)             // change_cipher_spec
	b = append(b, 23, 3, 3, 0, 3, 'x', 'y', 'z') // early application data
	got, err := ParseClientHello(b)
	if err != nil || got.SNI != "a.example" {
		t.Fatalf("got %+v, %v", got, err)
	}
}

// hello builds a ClientHello by hand; nil fields take sane defaults.
type hello struct {
	version   []byte
	sessionID []byte
	suites    []byte
	comp      []byte
	noExts    bool
	exts      []byte // the extensions block's contents
	extsLen   int    // overrides the block's length when non-zero
	trailing  []byte // after the extensions block, inside the message
	msgType   byte
}

func ext(typ int, data []byte) []byte {
	return append(be16(be16(nil, typ), len(data)), data...)
}

func sniExt(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0)
		list = be16(list, len(n))
		list = append(list, n...)
	}
	return ext(extServerName, append(be16(nil, len(list)), list...))
}

func (h hello) body() []byte {
	b := h.version
	if b == nil {
		b = []byte{3, 3}
	}
	b = append(b, make([]byte, 32)...)
	b = append(b, byte(len(h.sessionID)))
	b = append(b, h.sessionID...)
	suites := h.suites
	if suites == nil {
		suites = []byte{0x13, 0x01}
	}
	b = be16(b, len(suites))
	b = append(b, suites...)
	comp := h.comp
	if comp == nil {
		comp = []byte{0}
	}
	b = append(b, byte(len(comp)))
	b = append(b, comp...)
	if !h.noExts {
		n := len(h.exts)
		if h.extsLen != 0 {
			n = h.extsLen
		}
		b = be16(b, n)
		b = append(b, h.exts...)
	}
	return append(b, h.trailing...)
}

func (h hello) handshake() []byte {
	body := h.body()
	typ := h.msgType
	if typ == 0 {
		typ = typeClientHello
	}
	return append([]byte{typ, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
}

func (h hello) record() []byte { return reframe(h.handshake(), func() int { return 1 << 14 }) }

func TestParseClientHelloHandMade(t *testing.T) {
	long := strings.Repeat("a", 63)
	name253 := strings.Repeat(long+".", 3) + strings.Repeat("b", 61)
	tests := []struct {
		name    string
		in      []byte
		want    ClientHello
		wantErr error
	}{
		{"minimal with sni", hello{exts: sniExt("x.example")}.record(), ClientHello{SNI: "x.example"}, nil},
		{"no extensions block", hello{noExts: true}.record(), ClientHello{}, nil},
		{"empty extensions block", hello{}.record(), ClientHello{}, nil},
		{"unknown extensions skipped", hello{exts: append(ext(0x1234, []byte{1, 2, 3}), sniExt("x.example")...)}.record(), ClientHello{SNI: "x.example"}, nil},
		{"underscore", hello{exts: sniExt("_acme.x.example")}.record(), ClientHello{SNI: "_acme.x.example"}, nil},
		{"punycode", hello{exts: sniExt("xn--bcher-kva.example")}.record(), ClientHello{SNI: "xn--bcher-kva.example"}, nil},
		{"253 bytes", hello{exts: sniExt(name253)}.record(), ClientHello{SNI: name253}, nil},
		{"253 bytes and dot", hello{exts: sniExt(name253 + ".")}.record(), ClientHello{SNI: name253}, nil},
		{"ech injected", hello{exts: append(sniExt("public.example"), ext(extECH, []byte{0, 1, 2})...)}.record(), ClientHello{SNI: "public.example", ECH: true}, nil},
		{"ech without sni", hello{exts: ext(extECH, []byte{0})}.record(), ClientHello{ECH: true}, nil},

		{"254 bytes", hello{exts: sniExt(name253 + "b")}.record(), ClientHello{}, ErrBadName},
		{"64-byte label", hello{exts: sniExt(long + "a.example")}.record(), ClientHello{}, ErrBadName},
		{"empty label", hello{exts: sniExt("a..example")}.record(), ClientHello{}, ErrBadName},
		{"leading dot", hello{exts: sniExt(".example")}.record(), ClientHello{}, ErrBadName},
		{"only a dot", hello{exts: sniExt(".")}.record(), ClientHello{}, ErrBadName},
		{"two trailing dots", hello{exts: sniExt("a.example..")}.record(), ClientHello{}, ErrBadName},
		{"empty name", hello{exts: sniExt("")}.record(), ClientHello{}, ErrBadName},
		{"space", hello{exts: sniExt("a b.example")}.record(), ClientHello{}, ErrBadName},
		{"nul", hello{exts: sniExt("allowed.example\x00.evil.example")}.record(), ClientHello{}, ErrBadName},
		{"utf-8", hello{exts: sniExt("bücher.example")}.record(), ClientHello{}, ErrBadName},
		{"slash", hello{exts: sniExt("a.example/x")}.record(), ClientHello{}, ErrBadName},
		{"ipv4 literal", hello{exts: sniExt("192.0.2.1")}.record(), ClientHello{}, ErrBadName},
		{"inet_aton number", hello{exts: sniExt("2130706433")}.record(), ClientHello{}, ErrBadName},
		{"inet_aton short form", hello{exts: sniExt("127.1")}.record(), ClientHello{}, ErrBadName},
		{"two sni extensions", hello{exts: append(sniExt("allowed.example"), sniExt("evil.example")...)}.record(), ClientHello{}, ErrMalformed},
		{"two host_names", hello{exts: sniExt("allowed.example", "evil.example")}.record(), ClientHello{}, ErrMalformed},
		{"sni type 1", hello{exts: ext(extServerName, []byte{0, 4, 1, 0, 1, 'a'})}.record(), ClientHello{}, ErrMalformed},
		{"sni empty list", hello{exts: ext(extServerName, []byte{0, 0})}.record(), ClientHello{}, ErrMalformed},
		{"sni empty extension", hello{exts: ext(extServerName, nil)}.record(), ClientHello{}, ErrMalformed},
		{"sni list longer than extension", hello{exts: ext(extServerName, []byte{0, 9, 0, 0, 1, 'a'})}.record(), ClientHello{}, ErrMalformed},
		{"sni list shorter than extension", hello{exts: ext(extServerName, []byte{0, 4, 0, 0, 1, 'a', 0})}.record(), ClientHello{}, ErrMalformed},
		{"sni name longer than list", hello{exts: ext(extServerName, []byte{0, 4, 0, 0, 9, 'a'})}.record(), ClientHello{}, ErrMalformed},
		{"alpn empty list", hello{exts: ext(extALPN, []byte{0, 0})}.record(), ClientHello{}, ErrMalformed},
		{"alpn empty name", hello{exts: ext(extALPN, []byte{0, 1, 0})}.record(), ClientHello{}, ErrMalformed},
		{"alpn overrun", hello{exts: ext(extALPN, []byte{0, 3, 5, 'h', '2'})}.record(), ClientHello{}, ErrMalformed},
		{"ech empty", hello{exts: ext(extECH, nil)}.record(), ClientHello{}, ErrMalformed},
		{"extensions length too long", hello{exts: sniExt("x.example"), extsLen: 100}.record(), ClientHello{}, ErrMalformed},
		{"extensions length too short", hello{exts: sniExt("x.example"), extsLen: 3}.record(), ClientHello{}, ErrMalformed},
		{"bytes after extensions", hello{exts: sniExt("x.example"), trailing: []byte{0}}.record(), ClientHello{}, ErrMalformed},
		{"truncated extension", hello{exts: []byte{0, 0, 0}}.record(), ClientHello{}, ErrMalformed},
		{"session id 33 bytes", hello{sessionID: make([]byte, 33)}.record(), ClientHello{}, ErrMalformed},
		{"odd cipher suites", hello{suites: []byte{0x13, 0x01, 0x13}}.record(), ClientHello{}, ErrMalformed},
		{"no cipher suites", hello{suites: []byte{}}.record(), ClientHello{}, ErrMalformed},
		{"no compression methods", hello{comp: []byte{}}.record(), ClientHello{}, ErrMalformed},
		{"legacy version 2.0", hello{version: []byte{2, 0}}.record(), ClientHello{}, ErrMalformed},
		{"server hello", hello{msgType: 2}.record(), ClientHello{}, ErrNotTLS},
		{"http", []byte("GET / HTTP/1.1\r\n"), ClientHello{}, ErrNotTLS},
		{"application data record", []byte{23, 3, 3, 0, 1, 0}, ClientHello{}, ErrNotTLS},
		{"ssl2 hello", []byte{0x80, 0x2e, 1, 3, 1}, ClientHello{}, ErrNotTLS},
		{"record version 4.0", []byte{22, 4, 0, 0, 1}, ClientHello{}, ErrNotTLS},
		{"record version 3.16", []byte{22, 3, 16, 0, 1}, ClientHello{}, ErrNotTLS},
		{"empty record", []byte{22, 3, 1, 0, 0}, ClientHello{}, ErrMalformed},
		{"oversized record", []byte{22, 3, 1, 0x40, 1}, ClientHello{}, ErrMalformed},
		{"huge handshake length", []byte{22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff}, ClientHello{}, ErrTooLarge},
		{"alert interleaved", append(reframe(hello{}.handshake()[:10], func() int { return 10 }), 21, 3, 3, 0, 2, 2, 40), ClientHello{}, ErrMalformed},
		{"needs more: one byte", []byte{22}, ClientHello{}, ErrNeedMore},
		{"needs more: header", []byte{22, 3, 1, 0, 40}, ClientHello{}, ErrNeedMore},
		{"needs more: empty", nil, ClientHello{}, ErrNeedMore},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseClientHello(tt.in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseClientHelloSizeBound(t *testing.T) {
	// A 20 KiB ClientHello (padding extension) parses in big records but
	// not as 1-byte records: six times the bytes, past MaxHelloBytes.
	hs := hello{exts: append(sniExt("big.example"), ext(21, make([]byte, 20<<10))...)}.handshake()
	big := reframe(hs, func() int { return 1 << 14 })
	if got, err := ParseClientHello(big); err != nil || got.SNI != "big.example" {
		t.Fatalf("big records: got %+v, %v", got, err)
	}
	tiny := reframe(hs, func() int { return 1 })
	if _, err := ParseClientHello(tiny); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("1-byte records: got %v, want ErrTooLarge", err)
	}
	// The gate never has to buffer more than MaxHelloBytes to get an answer.
	if _, err := ParseClientHello(tiny[:MaxHelloBytes]); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("1-byte records, first MaxHelloBytes: got %v, want ErrTooLarge", err)
	}
	// A hello that cannot fit is refused as soon as its length is known.
	huge := hello{exts: ext(21, make([]byte, MaxHelloBytes))}.handshake()
	if _, err := ParseClientHello(reframe(huge, func() int { return 1 << 14 })[:20]); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("huge: got %v, want ErrTooLarge", err)
	}
}

func TestLooksLikeTLS(t *testing.T) {
	tests := []struct {
		in   []byte
		want bool
	}{
		{[]byte{22, 3, 1}, true},
		{[]byte{22, 3, 3, 0, 5}, true},
		{[]byte{22, 3, 0}, true},
		{[]byte{22, 3}, false},
		{[]byte{22, 2, 0}, false},
		{[]byte{22, 3, 0x10}, false},
		{[]byte{23, 3, 3}, false},
		{[]byte("GET / HTTP/1.1"), false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := LooksLikeTLS(tt.in); got != tt.want {
			t.Errorf("LooksLikeTLS(% x) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
