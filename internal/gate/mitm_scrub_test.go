package gate

import (
	"compress/gzip"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
)

// echoElsewhere echoes the request's credential everywhere a response
// can carry it but the body and header the proxy's usual path scrubs: a
// 103 Early Hints response (a value and a name), trailers announced and
// not, a header name; in the body, base64 at an offset; and, with
// ?enc=gzip or ?enc=br, a body in that encoding whatever the request
// asked for.
func echoElsewhere(w http.ResponseWriter, r *http.Request) {
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
		if strings.Contains(r.Reason, "cannot read to scrub") {
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
