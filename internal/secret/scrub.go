package secret

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// Scrubbing replaces every value with its placeholder in what comes back
// from an upstream (ATTACKS 23: a server that echoes the request, an
// error page that quotes the credential it refused). A value is looked
// for in these forms, each replaced by the placeholder in the same form:
//
//   - as is;
//   - JSON-escaped, as encoders write it: minimal escaping, Go's HTML-safe
//     escaping (\u003c for <), "\/" for "/" (PHP), and \uXXXX for every
//     non-ASCII character (Python's default);
//   - percent-encoded, as in a query (space as +) and as in a path (space
//     as %20), which is how an echoed URL carries a value swapped into a
//     query parameter;
//   - in standard base64 as an echoed "Authorization: Basic" header
//     carries it: after "user:" and at the end, exactly (the decoded
//     echo reads "user:<placeholder>");
//   - in standard and URL-safe base64 anywhere else, at each of the three
//     alignments a value can have in a base64 stream: every character
//     whose bits all come from the value is replaced. The characters at
//     either edge mix the value's first and last bytes with their
//     neighbours' and are kept, so at most the first byte's high bits and
//     the last two bytes of the value can be read back from such an echo.
//
// Not covered: a value the server transforms otherwise (compresses,
// hashes, re-encodes twice, splits, reverses, truncates), or whose body is
// compressed (Request asks bound hosts for identity encoding for this
// reason; a body the gate does not decompress is passed through as is).
// Scrubbing is a guard against accidental echoes from the hosts a secret
// is bound to, not against a bound host that wants to leak it: the value
// goes only to hosts the user named, and that choice is the defence.

// Scrubs reports whether there is anything to scrub. When it is true,
// ScrubBody changes a body's length, so the caller must drop
// Content-Length from the response (and send it chunked, or as HTTP/2
// data frames without a length) before streaming the scrubbed body.
func (s *Set) Scrubs() bool {
	return s.matcher() != nil
}

func (s *Set) matcher() *matcher {
	if s == nil || s.st == nil {
		return nil
	}
	return s.st.snap.Load().scrub
}

// ScrubString returns v with every value replaced by its placeholder,
// for texts that reach the guest or a log outside a body: error
// messages, status lines, trailers.
func (s *Set) ScrubString(v string) string {
	m := s.matcher()
	if m == nil || len(v) < m.minLen {
		return v
	}
	out, _ := m.replace(nil, []byte(v), true)
	return string(out)
}

// ScrubHeader replaces every value by its placeholder in h's values, in
// place. Use it for response headers and trailers.
func (s *Set) ScrubHeader(h http.Header) {
	m := s.matcher()
	if m == nil {
		return
	}
	for _, vs := range h {
		for i, v := range vs {
			if len(v) >= m.minLen {
				out, _ := m.replace(nil, []byte(v), true)
				vs[i] = string(out)
			}
		}
	}
}

// ScrubBody returns r with every value replaced by its placeholder, as
// a stream: it holds back at most the length of the longest form of a
// value less one byte, and only while those bytes could be the start of
// one, so each Read returns everything that arrived that cannot be part
// of a value yet to be completed (server-sent events are not delayed).
// The whole body is never buffered. It works with the values current
// when it is called. Closing it closes r. See Scrubs about
// Content-Length.
//
// When r fails with an error other than io.EOF, the bytes held back are
// dropped, not passed on: they may be the first part of a value.
func (s *Set) ScrubBody(r io.ReadCloser) io.ReadCloser {
	m := s.matcher()
	if m == nil {
		return r
	}
	return &scrubReader{r: r, m: m}
}

// readSize is how much ScrubBody asks its source for at a time: what
// io.Copy uses, so scrubbing does not change the size of writes.
const readSize = 32 << 10

type scrubReader struct {
	r   io.ReadCloser
	m   *matcher
	in  []byte // bytes held back from the last read, then the new ones
	out []byte // scrubbed bytes not yet returned
	off int    // of out
	err error
}

func (z *scrubReader) Read(p []byte) (int, error) {
	for {
		if z.off < len(z.out) {
			n := copy(p, z.out[z.off:])
			z.off += n
			return n, nil
		}
		if z.err != nil {
			return 0, z.err
		}
		if len(p) == 0 {
			return 0, nil
		}
		if z.in == nil {
			z.in = make([]byte, 0, readSize+z.m.maxLen)
		}
		n, err := z.r.Read(z.in[len(z.in):cap(z.in)])
		z.in = z.in[:len(z.in)+n]
		var hold int
		z.out, hold = z.m.replace(z.out[:0], z.in, err == io.EOF)
		z.off = 0
		z.in = z.in[:copy(z.in, z.in[hold:])]
		if err != nil {
			z.err = err
			z.in = nil // on EOF empty already; on a failure, dropped
		}
	}
}

func (z *scrubReader) Close() error { return z.r.Close() }

// newScrubber builds the matcher for every value and retired value in
// snap, each to its secret's placeholder. When two secrets share a
// value, the first by name gives the placeholder.
func (st *state) newScrubber(snap *snapshot) *matcher {
	var pats []pattern
	seen := map[string]bool{}
	for i, d := range st.defs {
		vals := append([]value{snap.values[i]}, snap.retired[i]...)
		for _, v := range vals {
			for _, p := range forms(v, []byte(d.placeholder)) {
				if !seen[string(p.from)] {
					seen[string(p.from)] = true
					pats = append(pats, p)
				}
			}
		}
	}
	return newMatcher(pats)
}

// forms returns the patterns that replace v by ph in each form the
// package comment lists. Forms equal to v are left out.
func forms(v, ph []byte) []pattern {
	var out []pattern
	add := func(from, to []byte) {
		if len(from) >= minValueBytes {
			out = append(out, pattern{from, to})
		}
	}
	add(v, ph)
	// The placeholder's characters are the same in every escaping, so
	// an escaped value is replaced by the bare placeholder.
	for _, esc := range []func([]byte) []byte{jsonMinimal, jsonHTML, jsonSlash, jsonASCII, queryEscape, pathEscape} {
		if e := esc(v); !bytes.Equal(e, v) {
			add(e, ph)
		}
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for a := range 3 {
			add(base64Core(enc, a, v), base64Core(enc, a, ph))
		}
	}
	for a := range 3 {
		add(base64Tail(a, v), base64Tail(a, ph))
		add(base64Tail(a, append([]byte{':'}, v...)), base64Tail(a, append([]byte{':'}, ph...)))
	}
	return out
}

// skipChars is, for data starting at byte a of a base64 group, how many
// of the group's characters carry bits of earlier bytes.
var skipChars = [3]int{0, 2, 3}

// base64Core is the characters of enc's encoding of v, starting at byte
// a (0-2) of a group, whose bits all come from v: from the first
// character not mixed with earlier bytes to the end of v's last whole
// group. The same for the placeholder at the same alignment keeps the
// stream's group structure, so the replaced stream still decodes.
func base64Core(enc *base64.Encoding, a int, v []byte) []byte {
	x := append(make([]byte, a), v...)
	x = x[:len(x)/3*3]
	return []byte(enc.EncodeToString(x)[skipChars[a]:])
}

// base64Tail is the standard, padded encoding of v from byte a of a
// group to the end, for v at the end of what was encoded, as a password
// is in Basic credentials: there the last group, padding and all, is v's
// alone.
func base64Tail(a int, v []byte) []byte {
	x := append(make([]byte, a), v...)
	return []byte(base64.StdEncoding.EncodeToString(x)[skipChars[a]:])
}

// jsonMinimal escapes what JSON requires: quote, backslash, controls.
func jsonMinimal(v []byte) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(string(v)) //nolint:errcheck // a string always encodes
	return unquote(b.Bytes())
}

// jsonHTML is Go's default, which also escapes <, > and &.
func jsonHTML(v []byte) []byte {
	b, _ := json.Marshal(string(v))
	return unquote(b)
}

// jsonSlash is the minimal escaping with "/" written as "\/".
func jsonSlash(v []byte) []byte {
	return bytes.ReplaceAll(jsonMinimal(v), []byte("/"), []byte(`\/`))
}

// jsonASCII is the minimal escaping with every non-ASCII character as
// \uXXXX (UTF-16 surrogate pairs above U+FFFF), as Python writes it.
func jsonASCII(v []byte) []byte {
	m := jsonMinimal(v)
	var b strings.Builder
	for len(m) > 0 {
		r, size := utf8.DecodeRune(m)
		switch {
		case r < utf8.RuneSelf:
			b.WriteByte(m[0])
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\ufffd`)
		case r > 0xffff:
			r -= 0x10000
			fmt.Fprintf(&b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		m = m[size:]
	}
	return []byte(b.String())
}

func unquote(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return b[1 : len(b)-1]
}

func queryEscape(v []byte) []byte { return []byte(url.QueryEscape(string(v))) }
func pathEscape(v []byte) []byte  { return []byte(url.PathEscape(string(v))) }
