package audit

import (
	"time"
)

// Where a record goes: the kept series, the noise series, or nowhere yet
// (a repeat, counted into an aggregate written at the end of its
// interval).
type route int

const (
	toKept route = iota
	toNoise
	toNone
)

// maxTracked bounds the distinct denied destinations the log remembers
// within the retention, and the aggregates of one interval. A guest that
// makes up destinations (random addresses, ports, names) would otherwise
// make the kept series, or the memory behind it, grow with each one. 4096:
// more than a person reads through, and some 100 bytes each. A small
// size bound tracks fewer (see newLog). Beyond it a
// new destination's first denial goes to the noise series, and denials
// beyond the interval's aggregates are one count in the kept series.
const maxTracked = 4096

// DefaultInterval is how long repeated denials of one destination are
// counted before their aggregate is written: a flood becomes six records a
// minute per destination, and `moat network audit -f` shows it within
// seconds.
const DefaultInterval = 10 * time.Second

// sorter decides which series a record goes to and counts repeated
// denials. It is pure (time comes with the records and the caller) and
// owned by the writer goroutine.
type sorter struct {
	retention time.Duration
	interval  time.Duration
	max       int // maxTracked; smaller in tests

	seen     map[string]time.Time // destination key → when its first denial was kept
	swept    time.Time            // when seen was last cleared of expired keys
	agg      map[string]*aggregate
	aggOrder []string // agg's keys in the order they came, for stable output
	start    time.Time
	// beyond counts the denials of this interval that no aggregate took
	// (agg was full): how many, and the sandbox they came from.
	beyond   int64
	beyondSB string
}

type aggregate struct {
	written int    // denials of this interval written one by one
	rec     Record // the first one counted, as a template
	count   int64
	last    time.Time
}

// burst is how many denials of one destination in an interval, after its
// first, are written one by one before the rest are counted: an agent
// retrying a refused host a few times shows each attempt at once (`moat
// network audit -f`); a flood shows as at most this many and a count.
const burst = 10

func newSorter(retention, interval time.Duration, max int) *sorter {
	return &sorter{retention: retention, interval: interval, max: max,
		seen: map[string]time.Time{}, agg: map[string]*aggregate{}}
}

// denial reports whether r is a denial that may be aggregated: a refusal
// that carried no traffic and names no secret.
func denial(r Record) bool {
	return r.Verdict == Deny && len(r.Transforms) == 0 && r.Phase == "" && r.Count == 0
}

// destKey is what makes two denials identical: the same destination (the
// ledger's name:port or ip:port, under the protocol), request (method
// and path, for a request the gate read) and reason. The reason is part
// of it so that a refusal never stands for another one's why; the
// tracked set's bound keeps varied reasons from flooding the kept series.
func destKey(r Record) string {
	dest, _ := ledgerDest(r)
	return r.Proto + " " + dest + " " + r.Method + " " + r.Path + " " + string(r.Reason)
}

// route files r. Everything but a denial is kept. A destination's first
// denial within the retention is kept (while the tracked set has room).
// Its next denials in an interval, burst of them, go to the noise series
// one by one, so that a person sees each of a few refusals as it happens;
// the rest are counted into the interval's aggregate.
func (s *sorter) route(r Record) route {
	if !denial(r) {
		return toKept
	}
	if s.start.IsZero() {
		s.start = r.Time
	}
	key := destKey(r)
	if t, ok := s.seen[key]; !ok || r.Time.Sub(t) >= s.retention {
		if len(s.seen) >= s.max {
			s.sweep(r.Time)
		}
		if _, ok := s.seen[key]; ok || len(s.seen) < s.max {
			s.seen[key] = r.Time
			return toKept
		}
	}
	a, ok := s.agg[key]
	if !ok {
		if len(s.agg) >= s.max {
			s.beyond++
			s.beyondSB = r.Sandbox
			return toNone
		}
		a = &aggregate{}
		s.agg[key] = a
		s.aggOrder = append(s.aggOrder, key)
	}
	if a.written < burst {
		a.written++
		return toNoise
	}
	if a.count == 0 {
		a.rec = r
	}
	a.count++
	if r.Time.After(a.last) {
		a.last = r.Time
	}
	return toNone
}

// sweep forgets destinations whose first denial is older than the
// retention, at most once an interval: a full set of live keys is not
// walked on every denial.
func (s *sorter) sweep(now time.Time) {
	if now.Sub(s.swept) < s.interval {
		return
	}
	s.swept = now
	for k, t := range s.seen {
		if now.Sub(t) >= s.retention {
			delete(s.seen, k)
		}
	}
}

// due reports whether the interval that began with the first counted
// denial is over.
func (s *sorter) due(now time.Time) bool {
	return !s.start.IsZero() && now.Sub(s.start) >= s.interval
}

// flush ends the interval: the aggregates that counted anything (for the
// noise series) and, if denials went beyond them, one record counting
// those (for the kept series).
func (s *sorter) flush(now time.Time) (noise []Record, kept []Record) {
	for _, k := range s.aggOrder {
		a := s.agg[k]
		if a.count == 0 {
			continue
		}
		r := a.rec
		r.Count, r.Last = a.count, a.last.UTC()
		if r.Time.After(r.Last) {
			r.Time = r.Last
		}
		r.DurationMS, r.BytesUp, r.BytesDown = 0, 0, 0
		noise = append(noise, r)
	}
	if s.beyond > 0 {
		kept = append(kept, Record{Schema: Schema, Time: s.start.UTC(), Last: now.UTC(), Sandbox: s.beyondSB,
			Verdict: Deny, Count: s.beyond,
			Reason: BeyondTracked(s.max)})
	}
	clear(s.agg)
	s.aggOrder = s.aggOrder[:0]
	s.start, s.beyond, s.beyondSB = time.Time{}, 0, ""
	return noise, kept
}
