// Package lists reads the curated lists a named policy can take its rules
// from ([policies.NAME] source = "..."): hosts files, plain domain lists
// and Adblock-style filter lists, fetched over HTTP(S) or read from a
// file, and cached on disk with their validators.
//
// It exists so that big third-party lists can be used without copying
// them by hand, and without trusting them blindly: every line of a list
// becomes a rule, or is reported as rejected (with its line number and
// why) or counted as unsupported. A list is never shortened silently,
// because a blocklist that quietly lost half its lines looks exactly like
// one that works.
//
// Parsing (this file) is pure: bytes in, policy entry strings out, in the
// forms policy.ParseEntry reads ("name", "*.name"), so the gate compiles
// them like any rule a user writes. Fetching and caching (fetch.go) is
// the only I/O.
package lists

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"

	"moat.dev/moat/internal/policy"
)

// Format is the syntax a line was read in.
type Format uint8

const (
	FormatNone    Format = iota // blank or comment
	FormatHosts                 // "0.0.0.0 name [name...]"
	FormatDomains               // "name" or "*.name"
	FormatAdblock               // "||name^", "@@||name^"
)

func (f Format) String() string {
	switch f {
	case FormatHosts:
		return "hosts"
	case FormatDomains:
		return "domains"
	case FormatAdblock:
		return "adblock"
	}
	return "none"
}

// Line is a line of a list that gave no rule, or only some: rejected
// (malformed) or unsupported (valid Adblock syntax moat cannot enforce).
type Line struct {
	Number int    // 1-based
	Text   string // as written, clipped to 200 bytes
	Reason string // what is wrong or unsupported
}

func (l Line) String() string { return fmt.Sprintf("line %d: %s: %q", l.Number, l.Reason, l.Text) }

// MaxKept bounds how many rejected and unsupported lines a Parsed keeps
// (the counts are always exact): a list that is garbage from top to
// bottom must not cost memory in proportion to its size just to report
// that it is.
const MaxKept = 1000

// maxLine is the longest line read; a longer one is rejected. No host
// name is longer than 253 bytes, and a hosts line of many names is rare.
const maxLine = 4096

// Parsed is a list read into policy entries. Block and Allow hold entries
// in policy.ParseEntry's syntax, each once, in the list's order.
type Parsed struct {
	Block []string
	Allow []string

	Lines int // lines in the list, blank and comments included
	// Formats counts the lines that gave rules, by format.
	Formats map[Format]int

	RejectedCount    int
	Rejected         []Line // the first MaxKept
	UnsupportedCount int
	Unsupported      []Line // the first MaxKept
}

// Entries is the number of entries, allow and block.
func (p *Parsed) Entries() int { return len(p.Block) + len(p.Allow) }

// Parse reads a list. The format is detected per line, so a list that
// mixes hosts lines and plain names (many do) is read whole:
//
//   - blank lines and comments ("# ...", "! ...", "[Adblock Plus 2.0]") are skipped;
//   - "ADDR name [name...]" with ADDR 0.0.0.0, 127.0.0.1, ::, ::1 (a
//     sinkhole) blocks each name exactly; a trailing "# comment" is ignored;
//   - "name" blocks the name exactly, "*.name" every subdomain of it;
//   - "||name^" blocks the name and every subdomain, "@@||name^" allows both.
//
// Everything else Adblock can say (options after "$", paths, cosmetic
// "##" rules, regular expressions, "|" anchors) is counted as
// unsupported; a line that is none of the above, or names something that
// is not a host name, is rejected with its number and the reason.
func Parse(data []byte) *Parsed {
	p := &Parsed{Formats: map[Format]int{}}
	seen := map[string]struct{}{}
	add := func(list *[]string, e string) {
		k := e
		if list == &p.Allow {
			k = "@" + e
		}
		if _, dup := seen[k]; dup {
			return
		}
		seen[k] = struct{}{}
		*list = append(*list, e)
	}
	for len(data) > 0 {
		var raw []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			raw, data = data[:i], data[i+1:]
		} else {
			raw, data = data, nil
		}
		p.Lines++
		n := p.Lines
		if len(raw) > maxLine {
			p.reject(n, string(raw[:200]), fmt.Sprintf("line is %d bytes long; the most is %d", len(raw), maxLine))
			continue
		}
		line := strings.TrimSpace(string(raw))
		if p.Lines == 1 {
			line = strings.TrimPrefix(line, "\ufeff") // a byte order mark
		}
		f, res := parseLine(line)
		if f == FormatNone {
			continue
		}
		switch {
		case res.unsupported != "":
			p.unsupported(n, line, res.unsupported)
			continue
		case res.rejected != "" && len(res.block)+len(res.allow) == 0:
			p.reject(n, line, res.rejected)
			continue
		case res.rejected != "":
			// A hosts line with one bad name among good ones: the good
			// ones count, and the line is still reported.
			p.reject(n, line, res.rejected)
		}
		p.Formats[f]++
		for _, e := range res.block {
			add(&p.Block, e)
		}
		for _, e := range res.allow {
			add(&p.Allow, e)
		}
	}
	return p
}

func (p *Parsed) reject(n int, text, why string) {
	p.RejectedCount++
	if len(p.Rejected) < MaxKept {
		p.Rejected = append(p.Rejected, Line{n, clip(text), why})
	}
}

func (p *Parsed) unsupported(n int, text, why string) {
	p.UnsupportedCount++
	if len(p.Unsupported) < MaxKept {
		p.Unsupported = append(p.Unsupported, Line{n, clip(text), why})
	}
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return strings.Clone(s)
}

// result is what one line gave.
type result struct {
	block, allow []string
	rejected     string // why (part of) the line was rejected
	unsupported  string // why the line was skipped
}

// sinkholes are the addresses hosts-file blocklists point names at. A
// hosts line with any other address redirects a name instead of
// blocking it, which a gate that never lets the guest choose addresses
// cannot express.
var sinkholes = map[string]bool{"0.0.0.0": true, "127.0.0.1": true, "::": true, "::1": true}

// parseLine reads one trimmed line.
func parseLine(line string) (Format, result) {
	switch {
	case line == "",
		line[0] == '#' && !strings.HasPrefix(line, "##") && !strings.HasPrefix(line, "#@#"),
		line[0] == '!',
		line[0] == '[' && line[len(line)-1] == ']':
		return FormatNone, result{}
	}
	// A trailing comment follows white space; "example.com##.ad" (no
	// space) is an Adblock cosmetic rule, not a comment.
	if i := strings.IndexAny(line, " \t"); i > 0 {
		if j := strings.Index(line[i:], "#"); j >= 0 && (line[i+j-1] == ' ' || line[i+j-1] == '\t') {
			line = strings.TrimSpace(line[:i+j])
		}
	}
	if adblockish(line) {
		return FormatAdblock, parseAdblock(line)
	}
	fields := strings.Fields(line)
	if len(fields) == 1 {
		return FormatDomains, parseDomain(fields[0])
	}
	if _, err := netip.ParseAddr(fields[0]); err != nil {
		return FormatDomains, result{rejected: "neither a hosts-file line (an address, then names) nor one name per line; write \"0.0.0.0 name\", \"name\", \"*.name\" or \"||name^\""}
	}
	if !sinkholes[fields[0]] {
		return FormatHosts, result{unsupported: fmt.Sprintf("maps names to %s instead of blocking them (0.0.0.0, 127.0.0.1, ::, ::1)", fields[0])}
	}
	var r result
	for _, name := range fields[1:] {
		e, err := nameEntry(name, false)
		if err != "" {
			if r.rejected == "" {
				r.rejected = err
			}
			continue
		}
		r.block = append(r.block, e)
	}
	return FormatHosts, r
}

// adblockish reports whether a line is in Adblock syntax: an anchor, an
// exception, a cosmetic rule, options, or a regular expression.
func adblockish(line string) bool {
	return line[0] == '|' || strings.HasPrefix(line, "@@") ||
		strings.Contains(line, "##") || strings.Contains(line, "#@#") || strings.Contains(line, "#?#") ||
		strings.Contains(line, "#$#") || strings.ContainsAny(line, "^$") ||
		len(line) > 1 && line[0] == '/' && line[len(line)-1] == '/'
}

func parseAdblock(line string) result {
	allow := false
	body := line
	if strings.HasPrefix(body, "@@") {
		allow, body = true, body[2:]
	}
	switch {
	case strings.Contains(line, "##") || strings.Contains(line, "#@#") || strings.Contains(line, "#?#") || strings.Contains(line, "#$#"):
		return result{unsupported: "a cosmetic (element hiding) rule; the gate sees hosts, not pages"}
	case len(body) > 1 && body[0] == '/' && body[len(body)-1] == '/':
		return result{unsupported: "a regular expression; only ||name^ rules are read"}
	case strings.Contains(body, "$"):
		return result{unsupported: "a rule with $options; only ||name^ rules without options are read"}
	case !strings.HasPrefix(body, "||"):
		return result{unsupported: "an address pattern; only ||name^ rules are read"}
	}
	host := body[2:]
	end := strings.IndexByte(host, '^')
	if end < 0 {
		if strings.ContainsAny(host, "/*") {
			return result{unsupported: "a rule with a path or a wildcard; only ||name^ rules are read"}
		}
		return result{unsupported: "||name without ^ also matches longer names (||ex.com matches ex.community); write ||name^"}
	}
	if rest := host[end+1:]; rest != "" && rest != "|" {
		return result{unsupported: "a rule with a path after ^; only ||name^ rules are read"}
	}
	host = host[:end]
	switch {
	case host == "":
		return result{rejected: "no name between || and ^"}
	case strings.ContainsAny(host, " \t"):
		return result{rejected: "white space inside the name"}
	case strings.ContainsAny(host, "/*"):
		return result{unsupported: "a rule with a path or a wildcard; only ||name^ rules are read"}
	}
	e, err := nameEntry(host, false)
	if err != "" {
		return result{rejected: err}
	}
	r := result{}
	// One string for both entries: a list of 100 000 names is mostly
	// names.
	w := "*." + e
	list := []string{w[2:], w}
	if allow {
		r.allow = list
	} else {
		r.block = list
	}
	return r
}

// parseDomain reads one name of a plain domain list.
func parseDomain(s string) result {
	e, err := nameEntry(s, true)
	if err != "" {
		return result{rejected: err}
	}
	return result{block: []string{e}}
}

// nameEntry checks s with the gate's own parser and returns it as an
// entry in normal form (lower case, punycode), or why it is not a name
// (or, if wildcard, "*.name") rule.
func nameEntry(s string, wildcard bool) (string, string) {
	if !wildcard && strings.HasPrefix(s, "*") {
		return "", fmt.Sprintf("%q: a wildcard is not allowed here", s)
	}
	r, err := policy.ParseEntry(s)
	if err != nil {
		return "", err.Error()
	}
	switch {
	case r.IsAddr():
		return "", fmt.Sprintf("%q is an address; lists give names only", s)
	case r.Port != 0 || r.IsRequest():
		return "", fmt.Sprintf("%q has a port, methods or a path; lists give names only", s)
	}
	if r.Wildcard {
		return "*." + r.Name, ""
	}
	// A copy, so the entry does not keep its whole line alive.
	return strings.Clone(r.Name), ""
}

// Rules makes the parsed entries rules of layer, named source, as
// policy.FromEntries would, without parsing each entry a second time:
// Parse has already checked every one with policy.ParseEntry and wrote
// it in normal form ("name" or "*.name"). Blocks come first, then allows;
// order inside the policy's layer does not change a decision.
func (p *Parsed) Rules(layer policy.Layer, source string) []policy.Rule {
	out := make([]policy.Rule, 0, p.Entries())
	for _, l := range []struct {
		entries []string
		a       policy.Action
	}{{p.Block, policy.Block}, {p.Allow, policy.Allow}} {
		for _, e := range l.entries {
			r := policy.Rule{Entry: e, Name: e, Action: l.a, Layer: layer, Source: source}
			if strings.HasPrefix(e, "*.") {
				r.Name, r.Wildcard = e[2:], true
			}
			out = append(out, r)
		}
	}
	return out
}
