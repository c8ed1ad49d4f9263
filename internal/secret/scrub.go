package secret

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"slices"
	"strings"
)

// Scrubbing replaces every value with its placeholder in what comes back
// from an upstream (threat model 23: a server that echoes the request, an
// error page that quotes the credential it refused): header names and
// values, bodies, trailers, 1xx responses. A value is looked for in
// these forms:
//
//   - as is, and as lower-case hex and upper-case hex;
//   - in standard and URL-safe base64, padded or not, at each of the
//     three alignments a value can have in a base64 stream. Every
//     character that holds a bit of the value is replaced, the ones at
//     either edge, which mix the value's bits with its neighbours', by
//     characters that keep the neighbours' bits, so the stream still
//     decodes and decodes to the placeholder. The placeholder and the
//     value differ in length, so where more data follows, the
//     placeholder is followed by one or two spaces that keep the rest of
//     the stream in step; at the padded end of a stream (an echoed
//     "Authorization: Basic"), it decodes to the placeholder exactly;
//   - any of the above with any of its bytes escaped, some or all:
//     percent-encoding in either case (and "+" for a space), JSON escapes
//     (\/, \" and the like, \u00XX in either case, surrogate pairs), \xXX,
//     and HTML character references (decimal, hex, and the named ones of
//     ASCII punctuation). The match decodes escapes as it goes
//     (unescape.go), so mixes no encoder writes are found too.
//
// Header names are matched without regard to case, since HTTP/2
// lower-cases them and Go capitalises them; a name that held a value is
// replaced by its lower-case scrubbed form.
//
// An escaped placeholder needs no escaping (it is letters, digits and
// "-"); where a replacement has characters that do ("+" and "/" of
// base64), they are escaped the way the match's first escape was, so the
// text decodes the way it did before.
//
// Not covered: a value the server transforms otherwise (compresses,
// hashes, encrypts, re-encodes twice, splits, reverses, truncates, breaks
// into lines), or whose body is compressed (Request asks bound hosts for
// identity encoding for this reason, and the gate decompresses gzip and
// deflate and drops an answer in any other encoding). Scrubbing is a
// guard against accidental echoes from the hosts a secret is bound to,
// not against a bound host that wants to leak it: the value goes only to
// hosts the user named, and that choice is the defence.

// Scrubs reports whether there is anything to scrub. When it is true,
// ScrubBody changes a body's length, so the caller must drop
// Content-Length from the response (and send it chunked, or as HTTP/2
// data frames without a length) before streaming the scrubbed body.
func (s *Set) Scrubs() bool {
	return s.scrubber() != nil
}

func (s *Set) scrubber() *scrubber {
	if s == nil || s.st == nil {
		return nil
	}
	return s.st.snap.Load().scrub
}

// ScrubString returns v with every value replaced by its placeholder,
// for texts that reach the guest or a log outside a body: error
// messages, status lines, trailers.
func (s *Set) ScrubString(v string) string {
	sc := s.scrubber()
	if sc == nil {
		return v
	}
	return sc.str(v)
}

// ScrubHeader replaces every value by its placeholder in h's values and
// names, in place. Use it for response headers, trailers and 1xx
// responses.
func (s *Set) ScrubHeader(h http.Header) {
	sc := s.scrubber()
	if sc == nil {
		return
	}
	for k, vs := range h {
		for i, v := range vs {
			vs[i] = sc.str(v)
		}
		if nk := sc.name(k); nk != k {
			// Not canonicalised: "Moat-Ph-…" would not be the
			// placeholder. HTTP/2 lower-cases names anyway.
			delete(h, k)
			h[nk] = append(h[nk], vs...)
		}
	}
}

// ScrubBody returns r with every value replaced by its placeholder, as
// a stream: it holds back only bytes that could be the start of a value
// in one of its forms, and at most the longest such form, so each Read
// returns everything that arrived that cannot be part of a value yet to
// be completed (server-sent events are not delayed). The whole body is
// never buffered. It works with the values current when it is called.
// Closing it closes r. See Scrubs about Content-Length.
//
// When r fails with an error other than io.EOF, the bytes held back are
// dropped, not passed on: they may be the first part of a value.
func (s *Set) ScrubBody(r io.ReadCloser) io.ReadCloser {
	sc := s.scrubber()
	if sc == nil {
		return r
	}
	return &scrubReader{r: &scrubReader{r: r, m: sc.esc}, m: sc.lit}
}

// scrubber is the two passes every text goes through: escaped forms
// first, near the bytes an escape starts with, then the plain forms
// anywhere, by the much faster literal matcher. names is the same for
// header names, with every pattern lower-cased.
type scrubber struct {
	esc    *escMatcher
	lit    *matcher
	names  *scrubber
	minLen int // shortest pattern: a shorter text cannot hold one
}

func newScrubber(pats []pattern) *scrubber {
	if len(pats) == 0 {
		return nil
	}
	sc := &scrubber{esc: newEscMatcher(pats), lit: newMatcher(pats), minLen: len(pats[0].from)}
	for _, p := range pats {
		sc.minLen = min(sc.minLen, len(p.from))
	}
	return sc
}

func (sc *scrubber) str(v string) string {
	if len(v) < sc.minLen {
		return v
	}
	a, _ := sc.esc.replace(nil, []byte(v), true)
	out, _ := sc.lit.replace(nil, a, true)
	return string(out)
}

// name is k scrubbed without regard to case: k itself when it holds no
// value, else its lower-case form scrubbed.
func (sc *scrubber) name(k string) string {
	if len(k) < sc.minLen {
		return k
	}
	lk := strings.ToLower(k)
	if out := sc.names.str(lk); out != lk {
		return out
	}
	return k
}

// maxHold is the most ScrubBody holds back, both passes together.
func (sc *scrubber) maxHold() int { return sc.esc.maxHold() + sc.lit.maxHold() }

// replacer is one pass of scrubbing: see matcher.replace.
type replacer interface {
	replace(dst, b []byte, final bool) (out []byte, hold int)
	maxHold() int
}

// readSize is how much ScrubBody asks its source for at a time: what
// io.Copy uses, so scrubbing does not change the size of writes.
const readSize = 32 << 10

type scrubReader struct {
	r   io.ReadCloser
	m   replacer
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
			// The hold of an escaped form can reach maxUnit times a
			// value's length; the buffer grows to it only when a match
			// in progress needs it.
			z.in = make([]byte, 0, readSize+min(z.m.maxHold(), readSize))
		}
		if cap(z.in)-len(z.in) < readSize/2 {
			z.in = slices.Grow(z.in, readSize)
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

// newScrubber builds the scrubber for every value and retired value in
// snap, each to its secret's placeholder. When two secrets share a
// value, the first by name gives the placeholder.
func (st *state) newScrubber(snap *snapshot) *scrubber {
	var pats, lower []pattern
	seen, seenLower := map[string]bool{}, map[string]bool{}
	for i, d := range st.defs {
		vals := append([]value{snap.values[i]}, snap.retired[i]...)
		for _, v := range vals {
			for _, p := range forms(v, []byte(d.placeholder)) {
				if !seen[string(p.from)] {
					seen[string(p.from)] = true
					pats = append(pats, p)
				}
				lp := pattern{bytes.ToLower(p.from), bytes.ToLower(p.to)}
				if !seenLower[string(lp.from)] {
					seenLower[string(lp.from)] = true
					lower = append(lower, lp)
				}
			}
		}
	}
	sc := newScrubber(pats)
	if sc != nil {
		sc.names = newScrubber(lower)
	}
	return sc
}

// forms returns the patterns that replace v by ph in each plain form the
// package comment lists; their escaped forms are matched by decoding.
func forms(v, ph []byte) []pattern {
	var out []pattern
	add := func(from, to []byte) {
		if len(from) >= minValueBytes {
			out = append(out, pattern{from, to})
		}
	}
	add(v, ph)
	add([]byte(hex.EncodeToString(v)), []byte(hex.EncodeToString(ph)))
	add(bytes.ToUpper([]byte(hex.EncodeToString(v))), bytes.ToUpper([]byte(hex.EncodeToString(ph))))
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for _, p := range base64Forms(enc, v, ph) {
			add(p.from, p.to)
		}
	}
	return out
}

// base64Fill pads ph with spaces to the length of v modulo 3, so that
// the base64 stream after it stays in step (see the package comment).
func base64Fill(v, ph []byte) []byte {
	f := append([]byte{}, ph...)
	for len(f)%3 != len(v)%3 {
		f = append(f, ' ')
	}
	return f
}

// base64Forms is v's base64 forms in enc, each with ph's: at each
// alignment a (0-2: the bytes before v in its group), with the edge
// characters (the ones mixing v's bits with its neighbours') for every
// value of the neighbours' bits in them, or without them (a stream cut
// there); and at the end of a padded stream.
func base64Forms(enc *base64.Encoding, v, ph []byte) []pattern {
	fill := base64Fill(v, ph)
	var out []pattern
	for a := range 3 {
		heads := edgeValues(headBits[a])
		tails := edgeValues(tailBits[(a+len(v))%3])
		for _, h := range heads {
			for _, t := range tails {
				out = append(out, pattern{base64Span(enc, a, h, v, t), base64Span(enc, a, h, fill, t)})
			}
		}
	}
	for a := range 3 {
		for _, h := range edgeValues(headBits[a]) {
			out = append(out, pattern{base64End(enc, a, h, v), base64End(enc, a, h, ph)})
		}
	}
	return out
}

// headBits is, for v at byte a of a group, how many bits of the
// character holding v's first bits come from the byte before it; tailBits
// is, for v ending at byte e of a group, how many bits of the character
// holding its last bits come from the byte after it.
var (
	headBits = [3]int{0, 2, 4}
	tailBits = [3]int{0, 4, 2}
)

// edgeValues is every value of an edge character's foreign bits, and -1
// for "no edge character"; just -1 when there is no edge character.
func edgeValues(bits int) []int {
	out := []int{-1}
	if bits == 0 {
		return out
	}
	for i := range 1 << bits {
		out = append(out, i)
	}
	return out
}

// base64Span is the characters of enc's encoding that hold v's bits, for
// v at byte a of a group: from the head character (whose foreign bits
// are h; h < 0: from the first character of v's alone) to the tail
// character (foreign bits t; t < 0: to the last character of v's alone).
func base64Span(enc *base64.Encoding, a, h int, v []byte, t int) []byte {
	x := make([]byte, a, a+len(v)+3)
	if h >= 0 {
		x[a-1] = byte(h) // the low bits of the byte before v
	}
	x = append(x, v...)
	post := [3]byte{}
	if t >= 0 {
		post[0] = byte(t) << (8 - tailBits[(a+len(v))%3])
	}
	x = append(x, post[:]...)
	s := enc.WithPadding(base64.NoPadding).EncodeToString(x)
	startBit, endBit := 8*a, 8*(a+len(v))
	start := (startBit + 5) / 6
	if h >= 0 {
		start = startBit / 6
	}
	end := endBit / 6
	if t >= 0 && endBit%6 != 0 {
		end++
	}
	return []byte(s[start:end])
}

// base64End is enc's padded encoding of v at the end of a stream, from
// the head character (as base64Span) to the padding.
func base64End(enc *base64.Encoding, a, h int, v []byte) []byte {
	x := make([]byte, a, a+len(v))
	if h >= 0 {
		x[a-1] = byte(h)
	}
	s := enc.EncodeToString(append(x, v...))
	start := (8*a + 5) / 6
	if h >= 0 {
		start = 8 * a / 6
	}
	return []byte(s[start:])
}
