package config

import (
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// The decoder tells us that a value is wrong only while it decodes; the
// checks that come after (sizes, names, ports) need the line of the key
// too. A line scanner for `key =` would be wrong for dotted keys, inline
// tables and arrays spread over lines, so instead we walk go-toml's own
// parser AST once and remember where every key and value starts.

// entry is one key, table header or array element of the document.
type entry struct {
	key   string        // display form: sandbox.memory, shares[1].path
	parts []string      // key parts; array positions are parts like "[1]"
	kind  unstable.Kind // kind of the value, or Table/ArrayTable for a header
	key1  position      // where the key (or the element) starts
	val   position      // where the value starts; zero for headers
}

// position is a place in the document: line and column for messages,
// the byte offset for edits (edit.go).
type position struct{ line, col, off int }

// docIndex is every entry of a document, in document order.
type docIndex struct {
	entries []entry
	byKey   map[string]int
	// dup is set to the second of the first two entries with the same
	// key; TOML forbids that, and the decoder's own message names only
	// the last key part.
	dup *entry
	// ok is false when the document did not parse: entries then stop
	// at the syntax error.
	ok bool
}

func indexDoc(data []byte) *docIndex {
	ix := &docIndex{byKey: map[string]int{}}
	var p unstable.Parser
	p.Reset(data)
	var table []string
	arrays := map[string]int{} // array-of-tables key → elements so far
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			parts := headerParts(e, arrays)
			if e.Kind == unstable.ArrayTable {
				base := displayKey(parts)
				n := arrays[base]
				arrays[base] = n + 1
				parts = append(parts, "["+strconv.Itoa(n)+"]")
			}
			table = parts
			ix.add(entry{parts: parts, kind: e.Kind, key1: keyStart(&p, e)})
		case unstable.KeyValue:
			ix.addKeyValue(&p, table, e)
		}
	}
	ix.ok = p.Error() == nil
	return ix
}

// headerParts is the key of a table header with the current element of
// every enclosing array of tables filled in: in
// `[[shares]] … [[shares]] … [shares.x]` the last one is shares[1].x.
func headerParts(e *unstable.Node, arrays map[string]int) []string {
	var out []string
	it := e.Key()
	for it.Next() {
		out = append(out, string(it.Node().Data))
		if n, ok := arrays[displayKey(out)]; ok && it.Node().Next() != nil {
			out = append(out, "["+strconv.Itoa(n-1)+"]")
		}
	}
	return out
}

func (ix *docIndex) addKeyValue(p *unstable.Parser, table []string, kv *unstable.Node) {
	parts := append([]string(nil), table...)
	it := kv.Key()
	for it.Next() {
		parts = append(parts, string(it.Node().Data))
	}
	v := kv.Value()
	ix.add(entry{parts: parts, kind: v.Kind, key1: keyStart(p, kv), val: valueStart(p, kv)})
	ix.addChildren(p, parts, v)
}

// addChildren indexes the elements of an array and the keys of an inline
// table, so that ports[1] or shares[0].path can be pointed at.
func (ix *docIndex) addChildren(p *unstable.Parser, parts []string, v *unstable.Node) {
	switch v.Kind {
	case unstable.Array:
		it := v.Children()
		for i := 0; it.Next(); {
			c := it.Node()
			if c.Kind == unstable.Comment {
				continue
			}
			cp := append(append([]string(nil), parts...), "["+strconv.Itoa(i)+"]")
			pos := nodeStart(p, c)
			ix.add(entry{parts: cp, kind: c.Kind, key1: pos, val: pos})
			ix.addChildren(p, cp, c)
			i++
		}
	case unstable.InlineTable:
		it := v.Children()
		for it.Next() {
			if c := it.Node(); c.Kind == unstable.KeyValue {
				ix.addKeyValue(p, parts, c)
			}
		}
	}
}

func (ix *docIndex) add(e entry) {
	e.key = displayKey(e.parts)
	if _, seen := ix.byKey[e.key]; seen {
		if ix.dup == nil {
			ix.dup = &e
		}
		return
	}
	ix.byKey[e.key] = len(ix.entries)
	ix.entries = append(ix.entries, e)
}

// lookup returns the entry for a display key.
func (ix *docIndex) lookup(key string) (entry, bool) {
	i, ok := ix.byKey[key]
	if !ok {
		return entry{}, false
	}
	return ix.entries[i], true
}

// at returns the entry whose key or value starts at line:col; the
// decoder's errors point at one or the other.
func (ix *docIndex) at(line, col int) (entry, bool) {
	at := func(p position) bool { return p.line == line && p.col == col }
	for _, e := range ix.entries {
		if at(e.val) {
			return e, true
		}
	}
	for _, e := range ix.entries {
		if at(e.key1) {
			return e, true
		}
	}
	return entry{}, false
}

func keyStart(p *unstable.Parser, n *unstable.Node) position {
	it := n.Key()
	if !it.Next() {
		return position{}
	}
	return rangeStart(p, it.Node().Raw)
}

// valueStart finds the value of a key-value by scanning past the '='
// that follows the key: array nodes carry no range of their own.
func valueStart(p *unstable.Parser, kv *unstable.Node) position {
	var last unstable.Range
	it := kv.Key()
	for it.Next() {
		last = it.Node().Raw
	}
	doc := p.Data()
	i := int(last.Offset + last.Length)
	skip := func() {
		for i < len(doc) && (doc[i] == ' ' || doc[i] == '\t') {
			i++
		}
	}
	skip()
	if i < len(doc) && doc[i] == '=' {
		i++
	}
	skip()
	return rangeStart(p, unstable.Range{Offset: uint32(i)}) //nolint:gosec // documents are small
}

// nodeStart is where an array element starts; a nested array has no
// range, so it is placed at its first element.
func nodeStart(p *unstable.Parser, n *unstable.Node) position {
	for n != nil && n.Kind == unstable.Array && n.Raw.Length == 0 {
		n = n.Child()
	}
	if n == nil || n.Raw.Length == 0 {
		return position{}
	}
	return rangeStart(p, n.Raw)
}

func rangeStart(p *unstable.Parser, r unstable.Range) position {
	if int(r.Offset) > len(p.Data()) {
		return position{}
	}
	s := p.Shape(unstable.Range{Offset: r.Offset}).Start
	return position{s.Line, s.Column, int(r.Offset)}
}

// displayKey joins key parts with dots, quoting parts that are not bare
// TOML keys, and writes array positions as [n].
func displayKey(parts []string) string {
	var b strings.Builder
	for _, s := range parts {
		switch {
		case strings.HasPrefix(s, "["):
			b.WriteString(s)
			continue
		case b.Len() > 0:
			b.WriteByte('.')
		}
		if isBareKey(s) {
			b.WriteString(s)
		} else {
			b.WriteString(strconv.Quote(s))
		}
	}
	return b.String()
}

func isBareKey(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return s != ""
}

// pattern is the schema key of parts: array positions become "[]" and
// the user-chosen names under [secrets] and [env] become "*", so
// shares[2].path → shares[].path, secrets.GH.from → secrets.*.from.
func pattern(parts []string) string {
	var out []string
	for i, s := range parts {
		switch {
		case strings.HasPrefix(s, "["):
			if len(out) > 0 {
				out[len(out)-1] += "[]"
			}
		case i == 1 && (parts[0] == "secrets" || parts[0] == "env" || parts[0] == "policies" || parts[0] == "mcp"):
			out = append(out, "*")
		default:
			out = append(out, s)
		}
	}
	return strings.Join(out, ".")
}
