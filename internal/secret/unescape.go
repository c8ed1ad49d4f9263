package secret

import (
	"bytes"
	"fmt"
	"unicode/utf8"
)

// Escaped forms. A server that echoes a value may escape any of its
// bytes, and not always all of them: url.PathEscape leaves "+" alone and
// encodes "/", a JSON encoder may write "/" as "\/" or every byte as
// \u00XX, an HTML template writes "+" as "&#43;", a hand-written encoder
// uses lower-case hex. Listing every mix of escaped and plain bytes is
// exponential in the value's length, so escMatcher decodes the text as it
// matches: each position of a pattern may be the byte itself or any
// escape that stands for it. Every escaped form holds an escape's first
// byte (%, \ or &), so the matcher looks only near those bytes, and the
// plain forms are left to the literal matcher, which is much faster.

// style is how a match's first escape was written, so that a replacement
// that needs escaping (base64 has "+" and "/") is written the same way
// and decodes the way the rest of the text does.
type style uint8

const (
	styleRaw style = iota
	stylePctUpper
	stylePctLower
	styleJSONUpper // \u002F
	styleJSONLower // \u002f
	styleJSONSlash // \/
	styleHexEsc    // \x2f
	styleHTMLDec   // &#47;
	styleHTMLHex   // &#x2f;
)

// escapeStarts are the bytes an escape starts with.
const escapeStarts = `%\&`

// maxUnit is the longest text one decoded byte can take: an HTML
// entity's name and its "&" and ";" (the longest name below is 16).
const maxUnit = 18

// maxEntityDigits bounds a numeric character reference: a code point
// has at most 7 decimal digits, and a few leading zeros are allowed.
const maxEntityDigits = 10

// htmlNamed maps the HTML named character references of ASCII
// punctuation, the ones an encoder may write for a byte of a token.
var htmlNamed = map[string]byte{
	"Tab": '\t', "NewLine": '\n', "nbsp": 0, // nbsp is not ASCII: see below
	"excl": '!', "quot": '"', "QUOT": '"', "num": '#', "dollar": '$', "percnt": '%',
	"amp": '&', "AMP": '&', "apos": '\'', "lpar": '(', "rpar": ')', "ast": '*', "midast": '*',
	"plus": '+', "comma": ',', "period": '.', "sol": '/', "colon": ':', "semi": ';',
	"lt": '<', "LT": '<', "equals": '=', "gt": '>', "GT": '>', "quest": '?', "commat": '@',
	"lsqb": '[', "lbrack": '[', "bsol": '\\', "rsqb": ']', "rbrack": ']', "Hat": '^',
	"lowbar": '_', "UnderBar": '_', "grave": '`', "DiacriticalGrave": '`', "lcub": '{',
	"lbrace": '{', "verbar": '|', "vert": '|', "VerticalLine": '|', "rcub": '}', "rbrace": '}',
	"hyphen": 0, "dash": 0, // U+2010, not "-": never part of an ASCII value
}

// unescape decodes the escape at the start of t into buf. It returns the
// bytes it stands for and its length in t; n == 0 when t does not start
// with an escape, n < 0 when t ends inside what may still become one.
func unescape(t []byte, buf *[8]byte) (out []byte, n int, st style) {
	if len(t) == 0 {
		return nil, 0, styleRaw
	}
	switch t[0] {
	case '%':
		if len(t) < 3 {
			if allHex(t[1:]) {
				return nil, -1, styleRaw
			}
			return nil, 0, styleRaw
		}
		b, ok := hexByte(t[1], t[2])
		if !ok {
			return nil, 0, styleRaw
		}
		buf[0] = b
		st = stylePctUpper
		if isLowerHex(t[1]) || isLowerHex(t[2]) {
			st = stylePctLower
		}
		return buf[:1], 3, st
	case '\\':
		return unescapeBackslash(t, buf)
	case '&':
		return unescapeEntity(t, buf)
	}
	return nil, 0, styleRaw
}

func unescapeBackslash(t []byte, buf *[8]byte) ([]byte, int, style) {
	if len(t) < 2 {
		return nil, -1, styleRaw
	}
	switch c := t[1]; c {
	case '"', '\\', '\'':
		buf[0] = c
		return buf[:1], 2, styleRaw
	case '/':
		buf[0] = '/'
		return buf[:1], 2, styleJSONSlash
	case 'b', 'f', 'n', 'r', 't':
		buf[0] = "\b\f\n\r\t"[bytes.IndexByte([]byte("bfnrt"), c)]
		return buf[:1], 2, styleRaw
	case 'x':
		if len(t) < 4 {
			if allHex(t[2:]) {
				return nil, -1, styleRaw
			}
			return nil, 0, styleRaw
		}
		b, ok := hexByte(t[2], t[3])
		if !ok {
			return nil, 0, styleRaw
		}
		buf[0] = b
		return buf[:1], 4, styleHexEsc
	case 'u':
		r, n := hex4(t[2:])
		if n <= 0 {
			return nil, n, styleRaw
		}
		st := styleJSONUpper
		if bytes.ContainsAny(t[2:6], "abcdef") {
			st = styleJSONLower
		}
		if r >= 0xd800 && r < 0xdc00 {
			// A high surrogate: the low one must follow.
			rest := t[6:]
			if len(rest) < 2 {
				if bytes.HasPrefix([]byte(`\u`), rest) {
					return nil, -1, styleRaw
				}
				return nil, 0, styleRaw
			}
			if rest[0] != '\\' || rest[1] != 'u' {
				return nil, 0, styleRaw
			}
			lo, m := hex4(rest[2:])
			if m <= 0 {
				return nil, m, styleRaw
			}
			if lo < 0xdc00 || lo >= 0xe000 {
				return nil, 0, styleRaw
			}
			r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
			return buf[:utf8.EncodeRune(buf[:], r)], 12, st
		}
		return buf[:utf8.EncodeRune(buf[:], r)], 6, st
	}
	return nil, 0, styleRaw
}

// hex4 reads four hex digits: n is 4, 0 when they are not hex, -1 when
// t ends before four.
func hex4(t []byte) (rune, int) {
	if len(t) < 4 {
		if allHex(t) {
			return 0, -1
		}
		return 0, 0
	}
	var r rune
	for _, c := range t[:4] {
		v, ok := hexVal(c)
		if !ok {
			return 0, 0
		}
		r = r<<4 | rune(v)
	}
	return r, 4
}

func unescapeEntity(t []byte, buf *[8]byte) ([]byte, int, style) {
	if len(t) < 2 {
		return nil, -1, styleRaw
	}
	if t[1] == '#' {
		i, base, st := 2, 10, styleHTMLDec
		if len(t) > 2 && (t[2] == 'x' || t[2] == 'X') {
			i, base, st = 3, 16, styleHTMLHex
		}
		var r rune
		start := i
		for ; i < len(t) && i-start <= maxEntityDigits; i++ {
			c := t[i]
			if c == ';' {
				if i == start {
					return nil, 0, styleRaw
				}
				if r > utf8.MaxRune {
					r = utf8.RuneError
				}
				return buf[:utf8.EncodeRune(buf[:], r)], i + 1, st
			}
			v, ok := hexVal(c)
			if !ok || (base == 10 && v > 9) {
				return nil, 0, styleRaw
			}
			r = r*rune(base) + rune(v)
			if r > utf8.MaxRune {
				r = utf8.MaxRune + 1 // keeps it from overflowing
			}
		}
		if i == len(t) && i-start <= maxEntityDigits {
			return nil, -1, styleRaw
		}
		return nil, 0, styleRaw
	}
	for i := 1; i < len(t) && i < maxUnit; i++ {
		c := t[i]
		if c == ';' {
			b, ok := htmlNamed[string(t[1:i])]
			if !ok || b == 0 {
				return nil, 0, styleRaw
			}
			buf[0] = b
			return buf[:1], i + 1, styleHTMLDec
		}
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return nil, 0, styleRaw
		}
	}
	if len(t) < maxUnit {
		return nil, -1, styleRaw
	}
	return nil, 0, styleRaw
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func hexByte(a, b byte) (byte, bool) {
	x, ok1 := hexVal(a)
	y, ok2 := hexVal(b)
	return x<<4 | y, ok1 && ok2
}

func allHex(t []byte) bool {
	for _, c := range t {
		if _, ok := hexVal(c); !ok {
			return false
		}
	}
	return true
}

func isLowerHex(c byte) bool { return c >= 'a' && c <= 'f' }

// escMatcher finds the patterns' escaped forms (see the top of this
// file) and replaces them, leftmost first and, among patterns matching
// at the same byte, longest first.
type escMatcher struct {
	pats    []pattern
	byFirst [256][]int // patterns by their first byte
	// by2 indexes patterns by their first two bytes, and has2 says which
	// pairs it holds: a start is tried against the few patterns that
	// begin with what its first two units decode to, not every pattern
	// with its first byte (a value's base64 forms share their first
	// characters by the dozen).
	by2      map[uint16][]int
	has2     [1 << 16 / 64]uint64
	maxLen   int       // longest pattern
	maxSpan  int       // longest text a pattern's escaped form can take
	canStart [256]bool // bytes a match can start with
	specials []byte    // escapeStarts, and "+" when a pattern has a space
	plus     bool      // some pattern has a space, which "+" may stand for
}

func newEscMatcher(pats []pattern) *escMatcher {
	if len(pats) == 0 {
		return nil
	}
	m := &escMatcher{pats: pats, by2: map[uint16][]int{}}
	m.specials = []byte(escapeStarts)
	for _, c := range m.specials {
		m.canStart[c] = true
	}
	for k, p := range pats {
		m.byFirst[p.from[0]] = append(m.byFirst[p.from[0]], k)
		key := uint16(p.from[0])<<8 | uint16(p.from[1]) // patterns are minValueBytes long at least
		m.by2[key] = append(m.by2[key], k)
		m.has2[key/64] |= 1 << (key % 64)
		m.canStart[p.from[0]] = true
		m.maxLen = max(m.maxLen, len(p.from))
		if bytes.IndexByte(p.from, ' ') >= 0 {
			m.plus = true
		}
	}
	if m.plus {
		m.specials = append(m.specials, '+')
		m.canStart['+'] = true
	}
	m.maxSpan = m.maxLen * maxUnit
	return m
}

// maxHold is the most replace may hold back.
func (m *escMatcher) maxHold() int { return m.maxSpan }

// replace is matcher.replace for escaped forms: b with every escaped
// form replaced, and how much of b to pass again with more text. A match
// holds an escape, whose first byte is special, and starts at most
// maxLen-1 bytes of plain text before it; only those starts are tried.
func (m *escMatcher) replace(dst, b []byte, final bool) (out []byte, hold int) {
	pos, cursor := 0, 0 // b[:pos] is written out; starts before cursor are decided
	sp := specials{b: b, chars: m.specials}
	for p := sp.from(0); p >= 0; p = sp.from(cursor) {
		s := max(cursor, p-(m.maxLen-1))
		cursor = p + 1
		for ; s <= p; s++ {
			// Before p the bytes are plain: a start there needs its first
			// two bytes to begin a pattern, a test of one bit.
			if !m.canStart[b[s]] || s+1 < p && !m.pair(b[s], b[s+1]) {
				continue
			}
			end, k, st, more := m.longestAt(b[s:], final)
			if more {
				return append(dst, b[pos:s]...), s
			}
			if k >= 0 {
				dst = append(dst, b[pos:s]...)
				dst = escapeLike(dst, m.pats[k].to, st)
				// A match that ended before p leaves starts up to p to
				// try: nextSpecial(cursor) is p again then.
				pos, cursor = s+end, s+end
				break
			}
		}
	}
	if !final {
		// A match whose first escape is yet to come starts with plain
		// bytes, fewer than maxLen of them.
		for s := max(cursor, len(b)-(m.maxLen-1)); s < len(b); s++ {
			if !m.canStart[b[s]] || s+1 < len(b) && !m.pair(b[s], b[s+1]) {
				continue
			}
			if _, _, _, more := m.longestAt(b[s:], false); more {
				return append(dst, b[pos:s]...), s
			}
		}
	}
	return append(dst, b[pos:]...), len(b)
}

// pair reports whether a pattern starts with the bytes a, b.
func (m *escMatcher) pair(a, b byte) bool {
	key := uint16(a)<<8 | uint16(b)
	return m.has2[key/64]&(1<<(key%64)) != 0
}

// specials finds the special bytes of b in order, each kind with
// bytes.IndexByte, which is many times faster than a loop over b.
type specials struct {
	b     []byte
	chars []byte
	next  [4]int // per char: its next position, or -1 not looked for, len(b) none
	init  bool
}

// from is the position of the first special byte at or after i, or -1.
func (sp *specials) from(i int) int {
	if !sp.init {
		sp.init = true
		for j := range sp.next {
			sp.next[j] = -1
		}
	}
	best := -1
	for j, c := range sp.chars {
		if sp.next[j] < i {
			if k := bytes.IndexByte(sp.b[i:], c); k >= 0 {
				sp.next[j] = i + k
			} else {
				sp.next[j] = len(sp.b)
			}
		}
		if n := sp.next[j]; n < len(sp.b) && (best < 0 || n < best) {
			best = n
		}
	}
	return best
}

// longestAt matches every pattern that can start at t[0]: the longest
// complete match (its length in t, its pattern, the style of its first
// escape) or k = -1, and more when t ended while a pattern could still
// match (the caller must then wait for more text).
func (m *escMatcher) longestAt(t []byte, final bool) (end, k int, st style, more bool) {
	k = -1
	var buf1, buf2 [8]byte
	firsts, partial := m.units(t, &buf1, final)
	if partial {
		return 0, -1, styleRaw, true
	}
	for _, x := range firsts {
		if x.n == 0 || m.byFirst[x.dec[0]] == nil {
			continue
		}
		var keys [3]uint16
		nk := 0
		if len(x.dec) >= 2 {
			keys[0], nk = uint16(x.dec[0])<<8|uint16(x.dec[1]), 1
		} else {
			rest := t[x.n:]
			if len(rest) == 0 {
				if !final {
					return 0, -1, styleRaw, true
				}
				continue
			}
			seconds, partial := m.units(rest, &buf2, final)
			if partial {
				return 0, -1, styleRaw, true
			}
			for _, y := range seconds {
				if y.n > 0 {
					keys[nk], nk = uint16(x.dec[0])<<8|uint16(y.dec[0]), nk+1
				}
			}
		}
		for _, key := range keys[:nk] {
			if !m.pair(byte(key>>8), byte(key)) {
				continue
			}
			for _, c := range m.by2[key] {
				from := m.pats[c].from
				e, s, mr := matchOne(t, from, final)
				if mr {
					return 0, -1, styleRaw, true
				}
				// A plain match is the literal matcher's, which looks at
				// every start: taken here, from a start near an escape, it
				// could pre-empt a longer one starting before (a base64
				// form with its edge character).
				if e >= 0 && !bytes.Equal(t[:e], from) && (k < 0 || len(from) > len(m.pats[k].from)) {
					end, k, st = e, c, s
				}
			}
		}
	}
	return end, k, st, false
}

// unit is one way to read the text at a position: the bytes it stands
// for and its length in the text (0: no such reading).
type unit struct {
	dec []byte
	n   int
}

// units are the readings of the text at the start of t: an escape, the
// byte itself, "+" as a space. partial is set when t ends inside what may
// be an escape and more text may come.
func (m *escMatcher) units(t []byte, buf *[8]byte, final bool) (out [3]unit, partial bool) {
	if dec, n, _ := unescape(t, buf); n > 0 {
		out[0] = unit{dec, n}
	} else if n < 0 && !final {
		return out, true
	}
	out[1] = unit{t[:1], 1}
	if t[0] == '+' && m.plus {
		out[2] = unit{[]byte{' '}, 1}
	}
	return out, false
}

// matchOne matches pattern p against the start of t, each of p's bytes
// plain or escaped. Where a byte of t can be read both ways (p holds a
// "%" and t has "%41"), both are tried, escapes first, within a bound
// on the steps taken: only a value full of escape characters could
// exceed it, and its plain form is still matched by the literal matcher.
func matchOne(t, p []byte, final bool) (end int, st style, more bool) {
	type point struct {
		ti, pj int
		st     style
	}
	var stack []point
	var buf [8]byte
	ti, pj := 0, 0
	st = styleRaw
	budget := 8*len(p) + 64
	for steps := 0; steps < budget; steps++ {
		if pj == len(p) {
			return ti, st, false
		}
		ok := false
		if ti < len(t) {
			c := t[ti]
			if c == '%' || c == '\\' || c == '&' {
				dec, n, est := unescape(t[ti:], &buf)
				switch {
				case n < 0 && !final:
					more = true
				case n > 0 && len(dec) <= len(p)-pj && bytes.Equal(dec, p[pj:pj+len(dec)]):
					if c == p[pj] {
						stack = append(stack, point{ti + 1, pj + 1, st})
					}
					if st == styleRaw {
						st = est
					}
					ti, pj, ok = ti+n, pj+len(dec), true
				}
			}
			if !ok && (c == p[pj] || c == '+' && p[pj] == ' ') {
				ti, pj, ok = ti+1, pj+1, true
			}
		} else if !final {
			more = true
		}
		if ok {
			continue
		}
		if len(stack) == 0 {
			return -1, styleRaw, more
		}
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		ti, pj, st = top.ti, top.pj, top.st
	}
	return -1, styleRaw, more
}

// escapeLike appends to, its bytes that a URL, JSON string or HTML text
// could read otherwise ("+", "/", "=", a space) written in style st.
func escapeLike(dst, to []byte, st style) []byte {
	if st == styleRaw {
		return append(dst, to...)
	}
	for _, c := range to {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' {
			dst = append(dst, c)
			continue
		}
		switch st {
		case stylePctUpper:
			dst = fmt.Appendf(dst, "%%%02X", c)
		case stylePctLower:
			dst = fmt.Appendf(dst, "%%%02x", c)
		case styleJSONUpper:
			dst = fmt.Appendf(dst, `\u%04X`, c)
		case styleJSONLower:
			dst = fmt.Appendf(dst, `\u%04x`, c)
		case styleJSONSlash:
			if c == '/' {
				dst = append(dst, '\\', '/')
			} else {
				dst = append(dst, c)
			}
		case styleHexEsc:
			dst = fmt.Appendf(dst, `\x%02x`, c)
		case styleHTMLDec:
			dst = fmt.Appendf(dst, "&#%d;", c)
		case styleHTMLHex:
			dst = fmt.Appendf(dst, "&#x%x;", c)
		}
	}
	return dst
}
