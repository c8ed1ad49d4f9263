package peek

import (
	"errors"
	"strings"
	"testing"
)

func TestParseHTTPHead(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Request
		wantErr error
	}{
		{"origin form", "GET /a?b HTTP/1.1\r\nHost: example.com\r\n\r\n",
			Request{Method: "GET", Target: "/a?b", Host: "example.com"}, nil},
		{"host port", "GET / HTTP/1.1\r\nUser-Agent: x\r\nhost: Example.COM.:8080\r\nAccept: */*\r\n\r\nbody",
			Request{Method: "GET", Target: "/", Host: "example.com", Port: 8080}, nil},
		{"host ows", "GET / HTTP/1.1\r\nHost:\t example.com \t\r\n\r\n",
			Request{Method: "GET", Target: "/", Host: "example.com"}, nil},
		{"ipv4 host", "GET / HTTP/1.1\r\nHost: 192.0.2.7:81\r\n\r\n",
			Request{Method: "GET", Target: "/", Host: "192.0.2.7", Port: 81}, nil},
		{"ipv6 host", "GET / HTTP/1.1\r\nHost: [2001:DB8::1]:8443\r\n\r\n",
			Request{Method: "GET", Target: "/", Host: "2001:db8::1", Port: 8443}, nil},
		{"ipv6 host no port", "GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n",
			Request{Method: "GET", Target: "/", Host: "::1"}, nil},
		{"absolute form", "GET http://Example.com/x HTTP/1.1\r\nHost: example.com\r\n\r\n",
			Request{Method: "GET", Target: "http://Example.com/x", Host: "example.com"}, nil},
		{"absolute form default port in host", "GET http://example.com/ HTTP/1.1\r\nHost: example.com:80\r\n\r\n",
			Request{Method: "GET", Target: "http://example.com/", Host: "example.com"}, nil},
		{"absolute form port", "GET http://example.com:8080 HTTP/1.1\r\nHost: example.com:8080\r\n\r\n",
			Request{Method: "GET", Target: "http://example.com:8080", Host: "example.com", Port: 8080}, nil},
		{"absolute form https", "GET HTTPS://example.com?q HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
			Request{Method: "GET", Target: "HTTPS://example.com?q", Host: "example.com"}, nil},
		{"http/1.0 without host", "GET / HTTP/1.0\r\n\r\n",
			Request{Method: "GET", Target: "/"}, nil},
		{"http/1.0 absolute", "GET http://a.example/ HTTP/1.0\r\n\r\n",
			Request{Method: "GET", Target: "http://a.example/", Host: "a.example"}, nil},
		{"connect", "CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n",
			Request{Method: "CONNECT", Target: "a.example:443", Host: "a.example", Port: 443}, nil},
		{"connect host without port", "CONNECT a.example:443 HTTP/1.1\r\nHost: a.example\r\n\r\n",
			Request{Method: "CONNECT", Target: "a.example:443", Host: "a.example", Port: 443}, nil},
		{"options star", "OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n",
			Request{Method: "OPTIONS", Target: "*", Host: "a.example"}, nil},
		{"unknown method token", "PROPFIND /d HTTP/1.1\r\nHost: a.example\r\n\r\n",
			Request{Method: "PROPFIND", Target: "/d", Host: "a.example"}, nil},
		{"obs-text in other header", "GET / HTTP/1.1\r\nX: caf\xc3\xa9\r\nHost: a.example\r\n\r\n",
			Request{Method: "GET", Target: "/", Host: "a.example"}, nil},
		{"empty header value", "GET / HTTP/1.1\r\nX:\r\nHost: a.example\r\n\r\n",
			Request{Method: "GET", Target: "/", Host: "a.example"}, nil},

		{"duplicate host", "GET / HTTP/1.1\r\nHost: allowed.example\r\nHost: evil.example\r\n\r\n", Request{}, ErrMalformed},
		{"duplicate host same", "GET / HTTP/1.1\r\nHost: a.example\r\nHOST: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"missing host", "GET / HTTP/1.1\r\nX: y\r\n\r\n", Request{}, ErrMalformed},
		{"empty host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", Request{}, ErrBadName},
		{"absolute conflicts with host", "GET http://allowed.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", Request{}, ErrMalformed},
		{"absolute port conflicts", "GET http://a.example/ HTTP/1.1\r\nHost: a.example:8080\r\n\r\n", Request{}, ErrMalformed},
		{"connect conflicts", "CONNECT a.example:443 HTTP/1.1\r\nHost: b.example:443\r\n\r\n", Request{}, ErrMalformed},
		{"connect without port", "CONNECT a.example HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrBadName},
		{"userinfo", "GET http://allowed.example@evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", Request{}, ErrMalformed},
		{"userinfo with password", "GET http://u:p@a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"percent in host", "GET / HTTP/1.1\r\nHost: ex%61mple.com\r\n\r\n", Request{}, ErrBadName},
		{"percent in target authority", "GET http://ex%61mple.com/ HTTP/1.0\r\n\r\n", Request{}, ErrBadName},
		{"ipv6 zone", "GET / HTTP/1.1\r\nHost: [fe80::1%25eth0]\r\n\r\n", Request{}, ErrBadName},
		{"unbracketed ipv6", "GET / HTTP/1.1\r\nHost: ::1\r\n\r\n", Request{}, ErrBadName},
		{"ipv4 in brackets", "GET / HTTP/1.1\r\nHost: [192.0.2.1]\r\n\r\n", Request{}, ErrBadName},
		{"bytes after bracket", "GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n", Request{}, ErrBadName},
		{"unclosed bracket", "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", Request{}, ErrBadName},
		{"empty port", "GET / HTTP/1.1\r\nHost: a.example:\r\n\r\n", Request{}, ErrBadName},
		{"port zero", "GET / HTTP/1.1\r\nHost: a.example:0\r\n\r\n", Request{}, ErrBadName},
		{"port too big", "GET / HTTP/1.1\r\nHost: a.example:65536\r\n\r\n", Request{}, ErrBadName},
		{"port sign", "GET / HTTP/1.1\r\nHost: a.example:+80\r\n\r\n", Request{}, ErrBadName},
		{"two ports", "GET / HTTP/1.1\r\nHost: a.example:80:81\r\n\r\n", Request{}, ErrBadName},
		{"host with space", "GET / HTTP/1.1\r\nHost: a.example b.example\r\n\r\n", Request{}, ErrBadName},
		{"host with slash", "GET / HTTP/1.1\r\nHost: a.example/x\r\n\r\n", Request{}, ErrBadName},
		{"host empty label", "GET / HTTP/1.1\r\nHost: a..example\r\n\r\n", Request{}, ErrBadName},
		{"host numeric tld", "GET / HTTP/1.1\r\nHost: 2130706433\r\n\r\n", Request{}, ErrBadName},
		{"host utf-8", "GET / HTTP/1.1\r\nHost: bücher.example\r\n\r\n", Request{}, ErrBadName},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: a.example\r\nX: a\r\n b\r\n\r\n", Request{}, ErrMalformed},
		{"obs-fold tab", "GET / HTTP/1.1\r\nX: a\r\n\tHost: evil.example\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"space before colon", "GET / HTTP/1.1\r\nHost : evil.example\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"no colon", "GET / HTTP/1.1\r\nHost a.example\r\n\r\n", Request{}, ErrMalformed},
		{"empty name", "GET / HTTP/1.1\r\n: x\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"nul in value", "GET / HTTP/1.1\r\nX: a\x00b\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"bare lf", "GET / HTTP/1.1\nHost: a.example\n\n", Request{}, ErrMalformed},
		{"bare lf in headers", "GET / HTTP/1.1\r\nHost: a.example\nX: y\r\n\r\n", Request{}, ErrMalformed},
		{"bare cr", "GET / HTTP/1.1\r\nHost: a.example\rX: y\r\n\r\n", Request{}, ErrMalformed},
		{"target with control byte", "GET /\x01 HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"target with utf-8", "GET /\xc3\xa9 HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"target other scheme", "GET ftp://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"target relative", "GET a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"star without options", "GET * HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrMalformed},
		{"absolute empty authority", "GET http:/// HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrBadName},

		{"http/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Request{}, ErrNotHTTP},
		{"version missing", "GET /\r\n\r\n", Request{}, ErrNotHTTP},
		{"version lower case", "GET / http/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrNotHTTP},
		{"double space", "GET  / HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrNotHTTP},
		{"extra field", "GET / x HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrNotHTTP},
		{"leading crlf", "\r\nGET / HTTP/1.1\r\nHost: a.example\r\n\r\n", Request{}, ErrNotHTTP},
		{"leading space", " GET / HTTP/1.1\r\n", Request{}, ErrNotHTTP},
		{"tls", "\x16\x03\x01\x02\x00", Request{}, ErrNotHTTP},
		{"ssh", "SSH-2.0-OpenSSH_9.6\r\n", Request{}, ErrNotHTTP},
		{"long method", strings.Repeat("A", 40), Request{}, ErrNotHTTP},

		{"need more: empty", "", Request{}, ErrNeedMore},
		{"need more: method", "GE", Request{}, ErrNeedMore},
		{"need more: line", "GET / HTTP/1.1\r\nHost: a.exa", Request{}, ErrNeedMore},
		{"need more: one crlf", "GET / HTTP/1.1\r\nHost: a.example\r\n", Request{}, ErrNeedMore},
		{"need more: cr", "GET / HTTP/1.1\r\nHost: a.example\r\n\r", Request{}, ErrNeedMore},

		{"too large", "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", MaxHeadBytes), Request{}, ErrTooLarge},
		{"too large complete", "GET / HTTP/1.1\r\nHost: a.example\r\nX: " + strings.Repeat("a", MaxHeadBytes) + "\r\n\r\n", Request{}, ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHTTPHead([]byte(tt.in))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			if err == nil {
				tt.want.HeaderEnd = strings.Index(tt.in, "\r\n\r\n") + 4
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseHTTPHeadPrefixes(t *testing.T) {
	in := []byte("POST /upload HTTP/1.1\r\nHost: up.example:8000\r\nContent-Length: 3\r\n\r\nabc")
	want := Request{Method: "POST", Target: "/upload", Host: "up.example", Port: 8000, HeaderEnd: len(in) - 3}
	for i := range want.HeaderEnd {
		if _, err := ParseHTTPHead(in[:i]); err != ErrNeedMore {
			t.Fatalf("prefix of %d bytes: got %v, want ErrNeedMore", i, err)
		}
	}
	for i := want.HeaderEnd; i <= len(in); i++ {
		if got, err := ParseHTTPHead(in[:i]); err != nil || got != want {
			t.Fatalf("prefix of %d bytes: got %+v, %v, want %+v", i, got, err, want)
		}
	}
}

func TestParseHTTPHeadSizeBound(t *testing.T) {
	head := "GET / HTTP/1.1\r\nHost: a.example\r\nX: "
	pad := MaxHeadBytes - len(head) - 4
	fits := head + strings.Repeat("a", pad) + "\r\n\r\n"
	if r, err := ParseHTTPHead([]byte(fits)); err != nil || r.HeaderEnd != MaxHeadBytes {
		t.Fatalf("head of exactly MaxHeadBytes: got %+v, %v", r, err)
	}
	over := head + strings.Repeat("a", pad+1) + "\r\n\r\n"
	if _, err := ParseHTTPHead([]byte(over)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("one byte over: got %v, want ErrTooLarge", err)
	}
	// The gate never has to buffer more than MaxHeadBytes to get an answer.
	if _, err := ParseHTTPHead([]byte(over[:MaxHeadBytes])); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("first MaxHeadBytes of an oversized head: got %v, want ErrTooLarge", err)
	}
}

func TestLooksLikeHTTP(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"GET / HTTP/1.1", true},
		{"GET ", true},
		{"CONNECT a:443 HTTP/1.1", true},
		{"PATCH /x", true},
		{"GET", false},
		{"get / HTTP/1.1", false},
		{"GETX / HTTP/1.1", false},
		{"PROPFIND / HTTP/1.1", false},
		{"PRI * HTTP/2.0", false},
		{"SSH-2.0-x", false},
		{"\x16\x03\x01", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := LooksLikeHTTP([]byte(tt.in)); got != tt.want {
			t.Errorf("LooksLikeHTTP(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
