package peek

import (
	"crypto/tls"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// checkStable checks the promise the gate relies on: once a prefix of the
// stream gives an answer (a result or an error other than ErrNeedMore), the
// whole stream gives the same answer.
func checkStable[T any](t *testing.T, parse func([]byte) (T, error), data []byte, cut int) {
	full, fullErr := parse(data)
	cut %= len(data) + 1
	part, partErr := parse(data[:cut])
	switch {
	case partErr == ErrNeedMore:
	case (partErr == nil) != (fullErr == nil):
		t.Fatalf("prefix of %d/%d bytes gave %v, whole gave %v", cut, len(data), partErr, fullErr)
	case partErr != nil && partErr.Error() != fullErr.Error():
		t.Fatalf("prefix of %d/%d bytes gave %v, whole gave %v", cut, len(data), partErr, fullErr)
	case partErr == nil && !reflect.DeepEqual(part, full):
		t.Fatalf("prefix of %d/%d bytes gave %+v, whole gave %+v", cut, len(data), part, full)
	}
}

// checkName checks that a name the parsers return is in normal form.
func checkName(t *testing.T, name string) {
	if name == "" {
		return
	}
	if strings.Contains(name, ":") { // IPv6 literal from a Host
		return
	}
	if strings.HasSuffix(name, ".") || strings.Contains(name, "..") || strings.HasPrefix(name, ".") || len(name) > maxNameLen {
		t.Fatalf("name %q not normalized", name)
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			t.Fatalf("name %q has byte 0x%02x", name, c)
		}
	}
}

func FuzzParseClientHello(f *testing.F) {
	for _, cfg := range []*tls.Config{
		{ServerName: "fuzz.example", NextProtos: []string{"h2", "http/1.1"}},
		{InsecureSkipVerify: true},
		{ServerName: "old.example", MaxVersion: tls.VersionTLS12},
		{ServerName: "secret.example", MinVersion: tls.VersionTLS13, EncryptedClientHelloConfigList: echConfigList(f, "public.example")},
	} {
		b := realHello(f, cfg)
		f.Add(b, uint(len(b)/2))
		f.Add(reframe(handshakeBytes(f, b), func() int { return 5 }), uint(100))
	}
	f.Add(hello{exts: sniExt("a.example", "b.example")}.record(), uint(0))
	f.Add(hello{exts: append(sniExt("a.example"), ext(extECH, []byte{0})...)}.record(), uint(0))
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0}, uint(3))
	f.Fuzz(func(t *testing.T, data []byte, cut uint) {
		h, err := ParseClientHello(data)
		if err == nil {
			checkName(t, h.SNI)
		} else if !errors.Is(err, ErrNeedMore) && !errors.Is(err, ErrNotTLS) && !errors.Is(err, ErrMalformed) &&
			!errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrBadName) {
			t.Fatalf("error %v matches no sentinel", err)
		}
		checkStable(t, ParseClientHello, data, int(cut%(1<<20)))
	})
}

func FuzzParseHTTPHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n",
		"GET http://a.example:8080/x HTTP/1.1\r\nHost: a.example:8080\r\nX: y\r\n\r\n",
		"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n",
		"GET http://u@a/ HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		f.Add([]byte(s), uint(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint) {
		r, err := ParseHTTPHead(data)
		if err == nil {
			checkName(t, r.Host)
			if r.HeaderEnd < 4 || r.HeaderEnd > len(data) || r.HeaderEnd > MaxHeadBytes || string(data[r.HeaderEnd-4:r.HeaderEnd]) != "\r\n\r\n" {
				t.Fatalf("HeaderEnd %d wrong for %q", r.HeaderEnd, data)
			}
		} else if !errors.Is(err, ErrNeedMore) && !errors.Is(err, ErrNotHTTP) && !errors.Is(err, ErrMalformed) &&
			!errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrBadName) {
			t.Fatalf("error %v matches no sentinel", err)
		}
		checkStable(t, ParseHTTPHead, data, int(cut%(1<<20)))
	})
}
