package secret

import "bytes"

// pattern is one byte string to replace and its replacement.
type pattern struct {
	from, to []byte
}

// matcher replaces every occurrence of a set of patterns, leftmost
// first and, among patterns starting at the same byte, longest first.
//
// It is a Wu-Manber scanner: a window as long as the shortest pattern
// slides over the text, and the two bytes at the window's end index a
// table of how far it may jump. Patterns here are long (8 bytes at the
// least) and few, so on ordinary data nearly every step jumps most of a
// window and the text is read at a fraction of a byte compare per byte;
// scanning with bytes.Index once per pattern would read it once per
// pattern instead, and a secret has a dozen encoded forms.
type matcher struct {
	pats           []pattern
	minLen, maxLen int
	window         int              // bytes looked at per step; min(minLen, 255)
	shift          []uint8          // by the window's last two bytes; 1<<16 entries
	bucket         map[uint16][]int // window-end block → patterns ending their window there
	byFirst        [256][]int       // patterns by their first byte
}

func newMatcher(pats []pattern) *matcher {
	if len(pats) == 0 {
		return nil
	}
	m := &matcher{pats: pats, minLen: len(pats[0].from), bucket: map[uint16][]int{}}
	for _, p := range pats {
		m.minLen = min(m.minLen, len(p.from))
		m.maxLen = max(m.maxLen, len(p.from))
	}
	for k, p := range pats {
		m.byFirst[p.from[0]] = append(m.byFirst[p.from[0]], k)
	}
	m.window = min(m.minLen, 255)
	// Every pattern is at least minValueBytes long, so the window holds
	// a two-byte block.
	w := m.window
	m.shift = make([]uint8, 1<<16)
	for i := range m.shift {
		m.shift[i] = uint8(w - 1)
	}
	for k, p := range pats {
		for j := 1; j < w; j++ {
			blk := uint16(p.from[j-1])<<8 | uint16(p.from[j])
			m.shift[blk] = min(m.shift[blk], uint8(w-1-j))
		}
		end := uint16(p.from[w-2])<<8 | uint16(p.from[w-1])
		m.bucket[end] = append(m.bucket[end], k)
	}
	return m
}

// maxHold is the most replace may hold back.
func (m *matcher) maxHold() int { return m.maxLen - 1 }

// replace appends b to dst with every pattern replaced. When final is
// false more text may follow b, so it stops at the first position from
// which a pattern could still match once more text comes, and returns
// that position as hold: b[hold:] must be passed again, in front of the
// next text. hold is at least len(b)-(maxLen-1), so at most maxLen-1
// bytes are ever held back, and bytes before it are never held: once
// the caller has more text it can emit everything that cannot be the
// start of a pattern. When final is true hold is len(b).
func (m *matcher) replace(dst, b []byte, final bool) (out []byte, hold int) {
	limit := len(b) // starts before limit see every byte a pattern could need
	if !final {
		limit = len(b) - (m.maxLen - 1)
	}
	pos, s, w := 0, 0, m.window
	for s < limit && s+w <= len(b) {
		e := s + w - 1
		blk := uint16(b[e-1])<<8 | uint16(b[e])
		if sh := m.shift[blk]; sh > 0 {
			s += int(sh)
			continue
		}
		if k := m.longestAt(b[s:], m.bucket[blk]); k >= 0 {
			dst = append(dst, b[pos:s]...)
			dst = append(dst, m.pats[k].to...)
			s += len(m.pats[k].from)
			pos = s
			continue
		}
		s++
	}
	if final {
		return append(dst, b[pos:]...), len(b)
	}
	// The tail: fewer than maxLen bytes are left from s on, so a pattern
	// starting here may be cut off. Positions the scan jumped over are
	// safe (the jump rules out a pattern starting there whether or not
	// it is cut off); from s on each one is checked against all
	// patterns.
	for i := s; i < len(b); {
		if m.byFirst[b[i]] == nil {
			i++
			continue
		}
		k, more := m.prefixAt(b[i:])
		switch {
		case more:
			return append(dst, b[pos:i]...), i
		case k >= 0:
			dst = append(dst, b[pos:i]...)
			dst = append(dst, m.pats[k].to...)
			i += len(m.pats[k].from)
			pos = i
		default:
			i++
		}
	}
	return append(dst, b[pos:]...), len(b)
}

// longestAt returns the longest of the candidate patterns that t starts
// with, or -1.
func (m *matcher) longestAt(t []byte, candidates []int) int {
	best := -1
	for _, k := range candidates {
		p := m.pats[k].from
		if (best < 0 || len(p) > len(m.pats[best].from)) && bytes.HasPrefix(t, p) {
			best = k
		}
	}
	return best
}

// prefixAt examines t, the rest of the text: k is the longest pattern t
// starts with (or -1), and more is true when t is a proper prefix of a
// longer pattern, which more text could complete.
func (m *matcher) prefixAt(t []byte) (k int, more bool) {
	k = -1
	for _, i := range m.byFirst[t[0]] {
		p := m.pats[i]
		if len(p.from) > len(t) {
			if bytes.HasPrefix(p.from, t) {
				return -1, true
			}
			continue
		}
		if (k < 0 || len(p.from) > len(m.pats[k].from)) && bytes.HasPrefix(t, p.from) {
			k = i
		}
	}
	return k, false
}
