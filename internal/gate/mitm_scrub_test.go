package gate

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// echoElsewhere echoes the request's credential everywhere a response
// can carry it but the body and header the proxy's usual path scrubs: a
// 103 Early Hints response (a value and a name), trailers announced and
// not, a header name; in the body, base64 at an offset; and, with
// ?enc=gzip or ?enc=br, a body in that encoding whatever the request
// asked for.
func echoElsewhere(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("place") {
		echoFuzz(w, r)
		return
	}
	if r.URL.Query().Has("ws") {
		wsEchoToken(w, r)
		return
	}
	auth := r.Header.Get("Authorization")
	token := strings.TrimPrefix(auth, "Bearer ")
	h := w.Header()
	h.Set("Link", "</style.css?k="+token+">; rel=preload")
	h.Set(token, "as-a-name")
	w.WriteHeader(http.StatusEarlyHints)
	h.Del("Link")
	h.Set("Trailer", "X-Trailer-Auth")
	body := "b64=" + base64.StdEncoding.EncodeToString([]byte("x"+token+"yz")) + " raw=" + token + "\n"
	switch enc := r.URL.Query().Get("enc"); enc {
	case "gzip":
		h.Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, body)
		zw.Close()
	case "br":
		h.Set("Content-Encoding", "br")
		io.WriteString(w, body) // not brotli: the gate must not pass it anyway
	default:
		io.WriteString(w, body)
	}
	h.Set("X-Trailer-Auth", auth)
	h.Set(http.TrailerPrefix+"X-Late-Auth", auth)
}

// TestInterceptScrubsTrailersAnd1xx checks that what a bound host echoes
// outside the answer's header and body, in trailers (HTTP/1.1 chunked
// and HTTP/2) and in a 103 response, reaches the guest scrubbed, and that
// a body compressed against the gate's wish is decompressed and scrubbed,
// or dropped when it cannot be read.
func TestInterceptScrubsTrailersAnd1xx(t *testing.T) {
	creds := testSecrets(t, false)
	ph := creds.Placeholders()["API_KEY"]
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) { o.Credentials = creds })
	for _, h2 := range []bool{false, true} {
		c := f.client(t, h2, f.roots)
		for _, enc := range []string{"", "gzip"} {
			var mu sync.Mutex
			var early []textproto.MIMEHeader
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
				Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
					mu.Lock()
					early = append(early, h)
					mu.Unlock()
					return nil
				},
			})
			req, _ := http.NewRequestWithContext(ctx, "GET", "https://api.test/echo-elsewhere?enc="+enc, nil)
			req.Header.Set("Authorization", "Bearer "+ph)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			seen := strings.ToLower(string(body) + headerText(resp.Header) + headerText(resp.Trailer))
			for _, h := range early {
				seen += strings.ToLower(headerText(http.Header(h)))
			}
			n1xx := len(early)
			mu.Unlock()
			what := map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2] + " enc=" + enc
			if strings.Contains(seen, strings.ToLower(canary)) {
				t.Errorf("%s: the value reached the guest:\n%s", what, seen)
			}
			if n1xx != 1 || !strings.Contains(seen, "k="+ph) {
				t.Errorf("%s: %d 1xx responses, want one with the placeholder:\n%s", what, n1xx, seen)
			}
			if got := resp.Trailer.Get("X-Trailer-Auth"); got != "Bearer "+ph {
				t.Errorf("%s: trailer X-Trailer-Auth = %q, want the placeholder", what, got)
			}
			if got := resp.Trailer.Get("X-Late-Auth"); got != "Bearer "+ph {
				t.Errorf("%s: trailer X-Late-Auth = %q, want the placeholder", what, got)
			}
			if dec := decodedB64(string(body)); !strings.Contains(dec, "x"+ph) {
				t.Errorf("%s: the base64 echo decodes to %q, want the placeholder whole", what, dec)
			}
			if resp.Header.Get("Content-Encoding") != "" {
				t.Errorf("%s: Content-Encoding %q reached the guest with a decoded body", what, resp.Header.Get("Content-Encoding"))
			}
		}
		// An encoding the gate cannot read: dropped.
		req, _ := http.NewRequest("GET", "https://api.test/echo-elsewhere?enc=br", nil)
		req.Header.Set("Authorization", "Bearer "+ph)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || strings.Contains(string(body), canary) {
			t.Errorf("h2=%v br: %d %q, want 502 without the value", h2, resp.StatusCode, body)
		}
		c.CloseIdleConnections()
	}
	var dropped int
	for _, r := range byProto(f.done(t), "http") {
		if strings.Contains(string(r.Reason), "cannot read to scrub") {
			dropped++
		}
	}
	if dropped != 2 {
		t.Errorf("%d audit records say an answer was dropped, want 2", dropped)
	}
}

func headerText(h http.Header) string {
	var b strings.Builder
	for k, vs := range h {
		b.WriteString(k + ": " + strings.Join(vs, ", ") + "\n")
	}
	return b.String()
}

// decodedB64 decodes the b64= field of echoElsewhere's body.
func decodedB64(body string) string {
	_, rest, _ := strings.Cut(body, "b64=")
	field, _, _ := strings.Cut(rest, " ")
	b, _ := base64.StdEncoding.DecodeString(field)
	return string(b)
}

// fuzzEncoding is a form a bound host may echo the value in, and how
// the guest reads it back.
type fuzzEncoding struct {
	enc func(string) string
	dec func(string) (string, error)
	// fill: base64 mid-stream decodes to the placeholder and up to two
	// spaces (see the secret package).
	fill bool
}

func perByteGate(s, format string) string {
	var b strings.Builder
	for i := range len(s) {
		fmt.Fprintf(&b, format, s[i])
	}
	return b.String()
}

var fuzzEncodings = []fuzzEncoding{
	{enc: func(s string) string { return s }, dec: func(s string) (string, error) { return s, nil }},
	{enc: func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
		dec: func(s string) (string, error) { b, err := base64.StdEncoding.DecodeString(s); return string(b), err }, fill: true},
	{enc: func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) },
		dec: func(s string) (string, error) { b, err := base64.RawURLEncoding.DecodeString(s); return string(b), err }, fill: true},
	{enc: func(s string) string { return perByteGate(s, "%%%02x") }, dec: url.PathUnescape},
	{enc: func(s string) string { return perByteGate(s, `\u%04X`) }, dec: func(s string) (string, error) {
		var out string
		err := json.Unmarshal([]byte(`"`+s+`"`), &out)
		return out, err
	}},
	{enc: func(s string) string { return perByteGate(s, "&#%d;") }, dec: func(s string) (string, error) { return html.UnescapeString(s), nil }},
	{enc: func(s string) string { return hex.EncodeToString([]byte(s)) }, dec: func(s string) (string, error) { b, err := hex.DecodeString(s); return string(b), err }},
}

var fuzzPlaces = []string{"header", "1xx", "trailer", "body"}

// echoFuzz echoes the request's bearer token as ?enc= encodes
// ?pre=+token+?post=, in ?place=: a header, a 103, a trailer, or the body
// written in ?chunk=-byte writes, each flushed.
func echoFuzz(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	enc, _ := strconv.Atoi(q.Get("enc"))
	text := fuzzEncodings[enc].enc(q.Get("pre") + token + q.Get("post"))
	h := w.Header()
	switch q.Get("place") {
	case "header":
		h.Set("X-Fuzz", text)
	case "1xx":
		h.Set("X-Fuzz", text)
		w.WriteHeader(http.StatusEarlyHints)
		h.Del("X-Fuzz")
	case "trailer":
		h.Set("Trailer", "X-Fuzz")
		io.WriteString(w, "see the trailer\n")
		h.Set("X-Fuzz", text)
	case "body":
		chunk, _ := strconv.Atoi(q.Get("chunk"))
		rc := http.NewResponseController(w)
		for len(text) > 0 {
			n := min(max(chunk, 1), len(text))
			io.WriteString(w, text[:n])
			rc.Flush()
			text = text[n:]
		}
	}
}

// FuzzInterceptScrubs has a bound host echo the value in a random form,
// with random text around it, in a header, a 103 response, a trailer or
// a body written in random pieces, over HTTP/1.1 or HTTP/2, and checks
// that what the guest receives decodes to the text with the placeholder
// whole, never the value. Its seeds run with every go test.
func FuzzInterceptScrubs(f *testing.F) {
	creds := testSecrets(f, false)
	ph := creds.Placeholders()["API_KEY"]
	fx := newMITMFixture(f, []string{"api.test"}, func(o *Options) { o.Credentials = creds })
	clients := map[bool]*http.Client{false: fx.client(f, false, fx.roots), true: fx.client(f, true, fx.roots)}
	for e := range fuzzEncodings {
		for p := range fuzzPlaces {
			f.Add([]byte("GH"), []byte("IJK"), uint8(e), uint8(p), uint8(e+p), e%2 == 0)
		}
	}
	const filler = "GHIJKLMNOPQRSTUVWXYZ"
	f.Fuzz(func(t *testing.T, pre, post []byte, enc, place, chunk uint8, h2 bool) {
		clean := func(b []byte) string {
			out := make([]byte, len(b)%16)
			for i := range out {
				out[i] = filler[int(b[i])%len(filler)]
			}
			return string(out)
		}
		p, q := clean(pre), clean(post)
		e := int(enc) % len(fuzzEncodings)
		where := fuzzPlaces[int(place)%len(fuzzPlaces)]
		var mu sync.Mutex
		var early []string
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
				mu.Lock()
				early = append(early, h.Get("X-Fuzz"))
				mu.Unlock()
				return nil
			},
		})
		u := fmt.Sprintf("https://api.test/echo-elsewhere?place=%s&enc=%d&pre=%s&post=%s&chunk=%d", where, e, p, q, chunk)
		req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
		req.Header.Set("Authorization", "Bearer "+ph)
		resp, err := clients[h2].Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		var got string
		switch where {
		case "header":
			got = resp.Header.Get("X-Fuzz")
		case "1xx":
			mu.Lock()
			if len(early) == 1 {
				got = early[0]
			}
			mu.Unlock()
		case "trailer":
			got = resp.Trailer.Get("X-Fuzz")
		case "body":
			got = string(body)
		}
		all := strings.ToLower(string(body) + headerText(resp.Header) + headerText(resp.Trailer) + strings.Join(early, " "))
		if strings.Contains(all, canary) {
			t.Fatalf("%s, encoding %d, h2=%v: the value reached the guest: %q", where, e, h2, all)
		}
		dec, err := fuzzEncodings[e].dec(got)
		rest, ok := strings.CutPrefix(dec, p+ph)
		if fuzzEncodings[e].fill {
			rest = strings.TrimPrefix(strings.TrimPrefix(rest, " "), " ")
		}
		if err != nil || !ok || rest != q {
			t.Fatalf("%s, encoding %d, h2=%v: the guest got %q, which decodes to %q (%v); want %q", where, e, h2, got, dec, err, p+ph+q)
		}
	})
}

// wsEchoToken upgrades to WebSocket and sends the request's bearer token
// back in two frames, a short one and one past 125 bytes (a 16-bit
// length), and whether it was offered compression.
func wsEchoToken(w http.ResponseWriter, r *http.Request) {
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	h := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(h[:]))
	brw.Write(wsFrame([]byte("token="+token+" extensions="+r.Header.Get("Sec-WebSocket-Extensions")), false))
	long := strings.Repeat("x", 200) + base64.StdEncoding.EncodeToString([]byte(token)) + strings.Repeat("y", 100)
	brw.Write(append([]byte{0x82, 126, byte(len(long) >> 8), byte(len(long))}, long...))
	brw.Flush()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.Copy(io.Discard, c) // until the guest closes
}

// wsReadLong reads one unmasked frame, of any length up to 64 KiB.
func wsReadLong(r *bufio.Reader) (byte, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(h[1] & 0x7f)
	if n == 126 {
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = int(b[0])<<8 | int(b[1])
	}
	p := make([]byte, n)
	_, err := io.ReadFull(r, p)
	return h[0], p, err
}

// TestInterceptScrubsWebSocketFrames checks that a value a bound host
// echoes in WebSocket messages reaches the guest as the placeholder, in
// frames whose lengths match, and that the host was not offered the
// compression that would hide it.
func TestInterceptScrubsWebSocketFrames(t *testing.T) {
	creds := testSecrets(t, false)
	ph := creds.Placeholders()["API_KEY"]
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) { o.Credentials = creds })
	c := f.client(t, false, f.roots)
	req, _ := http.NewRequest("GET", "https://api.test/echo-elsewhere?ws=1", nil)
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Sec-WebSocket-Extensions", "permessage-deflate")
	req.Header.Set("Authorization", "Bearer "+ph)
	resp, err := c.Transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("got %d %v", resp.StatusCode, resp.Header)
	}
	ws := resp.Body.(io.ReadWriteCloser)
	defer ws.Close()
	br := bufio.NewReader(ws)
	b0, first, err := wsReadLong(br)
	if err != nil || b0 != 0x81 || string(first) != "token="+ph+" extensions=" {
		t.Errorf("first frame %#x %q, %v; want the placeholder, and no extensions offered", b0, first, err)
	}
	b0, second, err := wsReadLong(br)
	if err != nil || b0 != 0x82 || !strings.Contains(string(second), base64.StdEncoding.EncodeToString([]byte(ph))[:20]) || strings.Contains(string(second), base64.StdEncoding.EncodeToString([]byte(canary))[:20]) {
		t.Errorf("second frame %#x %q, %v; want the placeholder's base64", b0, second, err)
	}
	if strings.Contains(string(first)+string(second), canary) {
		t.Errorf("the value reached the guest in a WebSocket frame")
	}
}
