package lists

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Loaded is a named policy's list as it can be used now: the entries of
// the last good copy, when it was fetched, and what the user must hear
// about it.
type Loaded struct {
	Name    string
	Source  string
	Parsed  *Parsed   // empty (never nil) when no copy could be read
	Fetched time.Time // zero for a file, or a list never fetched
	// Warnings are whole sentences for `moat status` and `moat policy
	// list`: a list that could not be fetched, lines rejected.
	Warnings []string
}

// Load reads the list of the policy name from source. A file is read as
// it is. A URL is read from the cache; when fetch is set and the cache
// has no copy, or one older than maxAge, it is fetched first.
//
// Load never fails: a list that cannot be had is an empty list with a
// warning (the policy then adds nothing, which for a blocklist means
// nothing is blocked by it and for an allowlist nothing allowed, and the
// user is told), and a refresh that fails keeps the last good copy.
func (c *Cache) Load(ctx context.Context, name, source string, maxAge time.Duration, fetch bool) *Loaded {
	l := &Loaded{Name: name, Source: source, Parsed: Parse(nil)}
	warn := func(format string, args ...any) {
		l.Warnings = append(l.Warnings, fmt.Sprintf("policy %q: ", name)+fmt.Sprintf(format, args...))
	}
	if !IsURL(source) {
		data, err := ReadFile(source)
		if err != nil {
			warn("%v; the policy is empty until the file can be read", err)
			return l
		}
		l.Parsed = Parse(data)
		l.warnLines(warn)
		return l
	}
	m, err := c.Meta(source)
	var ferr error
	if fetch && (err != nil || c.now().Sub(m.Fetched) >= maxAge) {
		_, ferr = c.Refresh(ctx, source)
	}
	data, m, err := c.Read(source)
	switch {
	case errors.Is(err, ErrNeverFetched) && ferr != nil:
		warn("%v; the list has never been fetched, so the policy is EMPTY until it is; check the address, then run: moat policy refresh %s", ferr, name)
		return l
	case errors.Is(err, ErrNeverFetched):
		warn("%s has never been fetched, so the policy is EMPTY until it is; run: moat policy refresh %s", Redact(source), name)
		return l
	case err != nil:
		warn("%v; the policy is empty until it is fetched again: moat policy refresh %s", err, name)
		return l
	}
	l.Fetched = m.Fetched
	if ferr == nil && m.LastError != "" {
		ferr = errors.New(m.LastError)
	}
	if ferr != nil {
		warn("%v; using the copy fetched %s", ferr, m.Fetched.Local().Format(time.RFC3339))
	}
	l.Parsed = Parse(data)
	l.warnLines(warn)
	return l
}

func (l *Loaded) warnLines(warn func(string, ...any)) {
	p := l.Parsed
	if p.RejectedCount > 0 {
		warn("%d of %d lines of %s were rejected (first: %s); see: moat policy show %s", p.RejectedCount, p.Lines, Redact(l.Source), p.Rejected[0], l.Name)
	}
	if p.UnsupportedCount > 0 {
		warn("%d lines of %s use list syntax moat does not enforce and were skipped (first: %s); see: moat policy show %s", p.UnsupportedCount, Redact(l.Source), p.Unsupported[0], l.Name)
	}
}
