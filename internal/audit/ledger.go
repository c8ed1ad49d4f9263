package audit

import (
	"container/list"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultLedgerEntries is the ledger size NewLedger uses for max ≤ 0: far
// more destinations than a person reads through, small enough (~200 bytes
// an entry) to keep in every daemon.
const DefaultLedgerEntries = 1024

// Ledger aggregates denials per destination for people (`moat network
// denials`, the interactive gate): which name or address the agent was
// refused, how often, when, and by which rule. It holds at most max
// destinations; when full, the one seen least recently goes. Safe for
// concurrent use.
type Ledger struct {
	max int

	// mu guards everything below.
	mu    sync.Mutex
	total int64
	byKey map[string]*list.Element // of *Entry
	order *list.List               // most recently seen at the front
}

// Entry is one destination in the ledger. As JSON it is part of the control
// API and `moat network denials --json`: the names are frozen.
type Entry struct {
	// Dest is name:port when the gate knew a name, else ip:port; for DNS,
	// the name alone; for ICMP, the address alone.
	Dest   string    `json:"dest"`
	Name   string    `json:"name,omitempty"`
	Ports  []uint16  `json:"ports"` // the ports denied under Dest, ascending
	Count  int64     `json:"count"`
	First  time.Time `json:"first"`
	Last   time.Time `json:"last"`
	Rule   string    `json:"rule,omitempty"`   // of the latest denial
	Reason Reason    `json:"reason,omitempty"` // of the latest denial
	Proto  string    `json:"proto"`
	Layer  string    `json:"layer,omitempty"` // of Rule
}

// Why is what people are shown as the reason of a decision, the same in
// `moat network audit` and `moat network denials`: the rule that matched,
// with its layer, and the reason. A rule alone would mislead where
// something else refused what the rule allowed (plain HTTP to a host a
// secret is bound to, an address class, a missing CA).
func Why(layer, rule string, reason Reason) string {
	if rule == "" {
		return string(reason)
	}
	return strings.TrimSpace(layer + " " + rule + " " + string(reason))
}

// NewLedger returns an empty ledger that holds at most max destinations.
func NewLedger(max int) *Ledger {
	if max <= 0 {
		max = DefaultLedgerEntries
	}
	return &Ledger{max: max, byKey: make(map[string]*list.Element), order: list.New()}
}

// Add counts r if it is a denial, or what would be one in report mode;
// other records are ignored. An aggregate (Count) counts as its count.
func (l *Ledger) Add(r Record) {
	if r.Verdict != Deny && r.Verdict != WouldDeny {
		return
	}
	dest, port := ledgerDest(r)
	when := r.Time
	if when.IsZero() {
		when = time.Now().UTC()
	}
	// The protocol is part of the key: udp and tcp to the same ip:port are
	// different things to allow.
	key := r.Proto + " " + dest

	n := max(r.Count, 1)
	last := when
	if r.Last.After(last) {
		last = r.Last
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	l.total += n
	el, ok := l.byKey[key]
	if !ok {
		if l.order.Len() >= l.max {
			oldest := l.order.Back()
			delete(l.byKey, oldest.Value.(*ledgerItem).key)
			l.order.Remove(oldest)
		}
		el = l.order.PushFront(&ledgerItem{key: key, e: Entry{Dest: dest, Name: r.Name, Proto: r.Proto, First: when}})
		l.byKey[key] = el
	} else {
		l.order.MoveToFront(el)
	}
	e := &el.Value.(*ledgerItem).e
	e.Count += n
	// Records can arrive slightly out of time order (connections finish
	// concurrently); keep First and Last the extremes.
	if when.Before(e.First) {
		e.First = when
	}
	if last.After(e.Last) {
		e.Last = last
	}
	e.Rule, e.Reason, e.Layer = r.Rule, r.Reason, r.Layer
	if port != 0 {
		if i, found := slices.BinarySearch(e.Ports, port); !found {
			e.Ports = slices.Insert(e.Ports, i, port)
		}
	}
}

type ledgerItem struct {
	key string
	e   Entry
}

// ledgerDest is the destination a denial is filed under, and its port (0
// if none).
func ledgerDest(r Record) (string, uint16) {
	host, portStr, err := net.SplitHostPort(r.Dst)
	if err != nil {
		host, portStr = r.Dst, "" // ICMP: an address without a port
	}
	p, _ := strconv.ParseUint(portStr, 10, 16)
	port := uint16(p)
	switch {
	case r.Proto == "dns" && r.Name != "":
		// The guest wanted to resolve the name, not to talk to port 53.
		return r.Name, 0
	case r.Name != "":
		host = r.Name
	}
	if port == 0 {
		return host, 0
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port))), port
}

// Entries returns a copy of the ledger, most recently seen first.
func (l *Ledger) Entries() []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Entry, 0, l.order.Len())
	for el := l.order.Front(); el != nil; el = el.Next() {
		e := el.Value.(*ledgerItem).e
		e.Ports = append([]uint16{}, e.Ports...) // never null in JSON, never shared
		out = append(out, e)
	}
	return out
}

// Total returns how many denials the ledger has counted since it was made,
// evicted destinations included.
func (l *Ledger) Total() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}
