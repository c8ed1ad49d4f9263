package secret

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// encoding is one way a server may write back what it received: enc
// encodes a whole text, dec reads it back as a client would.
type encoding struct {
	name string
	enc  func(string) string
	dec  func(string) (string, error)
	// fill: the value's base64 forms mid-stream decode to the
	// placeholder and up to two spaces (see the package comment).
	fill bool
}

func identity(s string) (string, error) { return s, nil }

func jsonDec(s string) (string, error) {
	var out string
	err := json.Unmarshal([]byte(`"`+s+`"`), &out)
	return out, err
}

func jsonMin(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

// perByte writes every byte of s with f, or as is where f gives "".
func perByte(s string, f func(i int, c byte) string) string {
	var b strings.Builder
	for i := range len(s) {
		if e := f(i, s[i]); e != "" {
			b.WriteString(e)
		} else {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

var namedEntity = map[byte]string{'/': "&sol;", '+': "&plus;", '&': "&amp;", '_': "&lowbar;", '.': "&period;", ':': "&colon;", '=': "&equals;"}

func b64(enc *base64.Encoding) (func(string) string, func(string) (string, error)) {
	return func(s string) string { return enc.EncodeToString([]byte(s)) },
		func(s string) (string, error) { b, err := enc.DecodeString(s); return string(b), err }
}

// encodings is every form the package comment promises to scrub.
func encodings() []encoding {
	stdE, stdD := b64(base64.StdEncoding)
	rawE, rawD := b64(base64.RawStdEncoding)
	urlE, urlD := b64(base64.URLEncoding)
	rurlE, rurlD := b64(base64.RawURLEncoding)
	hexD := func(s string) (string, error) { b, err := hex.DecodeString(s); return string(b), err }
	return []encoding{
		{name: "raw", enc: func(s string) string { return s }, dec: identity},
		{name: "json", enc: jsonMin, dec: jsonDec},
		{name: "json slash", enc: func(s string) string { return strings.ReplaceAll(jsonMin(s), "/", `\/`) }, dec: jsonDec},
		{name: `json \u00xx every byte`, enc: func(s string) string {
			return perByte(s, func(_ int, c byte) string { return fmt.Sprintf(`\u%04x`, c) })
		}, dec: jsonDec},
		{name: `json \u00XX every byte`, enc: func(s string) string {
			return perByte(s, func(_ int, c byte) string { return fmt.Sprintf(`\u%04X`, c) })
		}, dec: jsonDec},
		{name: "query escape", enc: url.QueryEscape, dec: url.QueryUnescape},
		{name: "path escape", enc: url.PathEscape, dec: url.PathUnescape},
		{name: "percent lower case", enc: func(s string) string {
			return perByte(s, func(_ int, c byte) string {
				if strings.IndexByte("/+&= ", c) >= 0 {
					return fmt.Sprintf("%%%02x", c)
				}
				return ""
			})
		}, dec: url.PathUnescape},
		{name: "percent every byte upper", enc: func(s string) string {
			return perByte(s, func(_ int, c byte) string { return fmt.Sprintf("%%%02X", c) })
		}, dec: url.PathUnescape},
		{name: "percent every byte lower", enc: func(s string) string {
			return perByte(s, func(_ int, c byte) string { return fmt.Sprintf("%%%02x", c) })
		}, dec: url.PathUnescape},
		{name: "percent every other byte", enc: func(s string) string {
			return perByte(s, func(i int, c byte) string {
				if i%2 == 1 {
					return fmt.Sprintf("%%%02X", c)
				}
				return ""
			})
		}, dec: url.PathUnescape},
		{name: "html escape", enc: html.EscapeString, dec: identityHTML},
		{name: "html decimal", enc: func(s string) string {
			return perByte(s, func(_ int, c byte) string { return fmt.Sprintf("&#%d;", c) })
		}, dec: identityHTML},
		{name: "html hex", enc: func(s string) string {
			return perByte(s, func(_ int, c byte) string { return fmt.Sprintf("&#x%X;", c) })
		}, dec: identityHTML},
		{name: "html named", enc: func(s string) string {
			return perByte(s, func(_ int, c byte) string { return namedEntity[c] })
		}, dec: identityHTML},
		{name: "base64", enc: stdE, dec: stdD, fill: true},
		{name: "base64 unpadded", enc: rawE, dec: rawD, fill: true},
		{name: "base64 url", enc: urlE, dec: urlD, fill: true},
		{name: "base64 url unpadded", enc: rurlE, dec: rurlD, fill: true},
		{name: "base64 in a query", enc: func(s string) string { return url.QueryEscape(stdE(s)) },
			dec: func(s string) (string, error) {
				u, err := url.QueryUnescape(s)
				if err != nil {
					return "", err
				}
				return stdD(u)
			}, fill: true},
		{name: "base64 in json with slashes", enc: func(s string) string { return strings.ReplaceAll(stdE(s), "/", `\/`) },
			dec: func(s string) (string, error) {
				u, err := jsonDec(s)
				if err != nil {
					return "", err
				}
				return stdD(u)
			}, fill: true},
		{name: "hex", enc: func(s string) string { return hex.EncodeToString([]byte(s)) }, dec: hexD},
		{name: "hex upper", enc: func(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) }, dec: hexD},
	}
}

func identityHTML(s string) (string, error) { return html.UnescapeString(s), nil }

// spaceValue is a third secret's value: a space, "&" and "+", which
// query encoding writes as "+", "%26" and "%2B".
const spaceValue = "maps-value+with spaces&stuff"

// filler is the text around a value in these tests: letters none of the
// test values has, so "the value is gone" and "the rest is intact" are
// checked exactly.
const filler = "GHIJKLMNOPQRSTUVWXYZ"

// checkScrubbed checks that got, decoded, is pre, the placeholder and
// post: the value is gone, the placeholder whole, and nothing else
// changed (but for the spaces a base64 form mid-stream adds).
func checkScrubbed(t testing.TB, e encoding, got, pre, ph, post string) {
	t.Helper()
	dec, err := e.dec(got)
	if err != nil {
		t.Fatalf("%s: the scrubbed text %q does not decode: %v", e.name, got, err)
	}
	rest, ok := strings.CutPrefix(dec, pre+ph)
	if e.fill && post != "" {
		rest = strings.TrimPrefix(strings.TrimPrefix(rest, " "), " ")
	} else if e.fill {
		rest = strings.TrimRight(rest, " ")
	}
	if !ok || rest != post {
		t.Fatalf("%s: the scrubbed text decodes to\n %q\nwant\n %q", e.name, dec, pre+ph+post)
	}
}

// TestScrubEncodings checks each form the package comment lists, for
// values with "/", "+", "&" and a space, after every number of bytes
// before it and after it up to 3 (every base64 alignment and edge).
func TestScrubEncodings(t *testing.T) {
	e := testEnv()
	e["MAPS"] = spaceValue
	s := mustResolve(t, testSecrets(), e)
	phs := s.Placeholders()
	values := map[string]string{canary: phs["API_KEY"], otherValue: phs["GH_TOKEN"], spaceValue: phs["MAPS_KEY"]}
	for _, enc := range encodings() {
		t.Run(enc.name, func(t *testing.T) {
			for v, ph := range values {
				for pre := range 4 {
					for post := range 4 {
						p, q := filler[:pre], filler[10:10+post]
						in := enc.enc(p + v + q)
						checkScrubbed(t, enc, s.ScrubString(in), p, ph, q)
						body := scrubAll(t, s, &chunkReader{data: []byte(in), n: 7})
						checkScrubbed(t, enc, body, p, ph, q)
					}
				}
			}
		})
	}
}

// TestScrubHeaderNames checks that a value used as a header's name is
// replaced, however it was capitalised on the way.
func TestScrubHeaderNames(t *testing.T) {
	s := mustResolve(t, testSecrets(), testEnv())
	ph := s.Placeholders()["GH_TOKEN"]
	for _, name := range []string{otherValue, strings.ToLower(otherValue), http.CanonicalHeaderKey(otherValue), "X-" + otherValue + "-Echo"} {
		h := http.Header{name: {"v"}, "Keep": {"k"}}
		s.ScrubHeader(h)
		for k := range h {
			if strings.Contains(strings.ToLower(k), strings.ToLower(otherValue)) {
				t.Errorf("%q: the header %q is still there", name, k)
			}
		}
		found := false
		for k, v := range h {
			if strings.Contains(k, ph) && len(v) == 1 && v[0] == "v" {
				found = true
			}
		}
		if !found || h.Get("Keep") != "k" {
			t.Errorf("%q: headers after scrubbing %q, want one named with %s", name, h, ph)
		}
	}
}

// FuzzScrubEncodings puts a value, in a random form, at a random place
// of random text, in a body cut into random reads, a header's value or
// a header's name, and checks that it never comes out and that the
// placeholder comes out whole. Its seeds run with every go test.
func FuzzScrubEncodings(f *testing.F) {
	e := testEnv()
	e["MAPS"] = spaceValue
	s := mustResolve(f, testSecrets(), e)
	phs := s.Placeholders()
	values := []string{canary, otherValue, spaceValue}
	ph := map[string]string{canary: phs["API_KEY"], otherValue: phs["GH_TOKEN"], spaceValue: phs["MAPS_KEY"]}
	encs := encodings()
	for i := range encs {
		for place := range 3 {
			f.Add([]byte("GHIJ"), []byte("KLM"), uint8(i), uint8(place), uint8(i%3), uint64(i))
		}
	}
	f.Add([]byte{}, []byte{}, uint8(15), uint8(0), uint8(0), uint64(0))
	f.Fuzz(func(t *testing.T, pre, post []byte, encIdx, place, valIdx uint8, seed uint64) {
		// The text around the value is drawn from letters no value has,
		// so that the result can be checked exactly.
		clean := func(b []byte) string {
			out := make([]byte, len(b)%64)
			for i := range out {
				out[i] = filler[int(b[i])%len(filler)]
			}
			return string(out)
		}
		p, q := clean(pre), clean(post)
		enc := encs[int(encIdx)%len(encs)]
		v := values[int(valIdx)%len(values)]
		in := enc.enc(p + v + q)
		switch place % 3 {
		case 0: // a body, in random reads
			rng := rand.New(rand.NewPCG(seed, seed))
			var sizes []int
			for n := 0; n < len(in); {
				k := rng.IntN(2*len(v)) + 1
				sizes = append(sizes, k)
				n += k
			}
			got := scrubAll(t, s, &chunkReader{data: []byte(in), sizes: sizes, n: len(in)})
			if want := s.ScrubString(in); got != want {
				t.Fatalf("%s: streamed %q, in one piece %q", enc.name, got, want)
			}
			checkScrubbed(t, enc, got, p, ph[v], q)
		case 1: // a header's value, a trailer's, a 1xx response's
			h := http.Header{"X-Echo": {in}}
			s.ScrubHeader(h)
			checkScrubbed(t, enc, h.Get("X-Echo"), p, ph[v], q)
		case 2: // a header's name, which the server's HTTP/2 lower-cased
			if enc.fill {
				return // lower-casing already destroyed the form
			}
			h := http.Header{strings.ToLower(in): {"x"}}
			s.ScrubHeader(h)
			folded := enc
			folded.dec = func(s string) (string, error) { d, err := enc.dec(s); return strings.ToLower(d), err }
			for k := range h {
				checkScrubbed(t, folded, k, strings.ToLower(p), ph[v], strings.ToLower(q))
			}
		}
	})
}
