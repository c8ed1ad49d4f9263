package gate

import (
	"container/list"
	"net/netip"
	"slices"
	"sync"
	"time"

	"moat.dev/moat/internal/audit"
)

// Binding sources: the name sources of the audit that a binding can
// have. They are written to audit records as the place a connection's
// name came from.
const (
	// SourceObserved: the gate gave this answer to the guest's own query.
	SourceObserved = audit.FromObserved
	// SourceResolved: pre-resolved from an allow rule.
	SourceResolved = audit.FromResolved
	// SourceGranted: bound by a runtime grant.
	SourceGranted = audit.FromGranted
)

const (
	// defaultMaxBindings caps all bindings of one sandbox (about 100 B
	// each: some 10 MiB at most). Past it the oldest go first; losing one
	// fails closed (the address is then decided by address rules only).
	defaultMaxBindings = 100_000
	// maxNamesPerAddr caps the names remembered for one address. A CDN
	// address can front thousands of names; the most recent ones are the
	// ones a connection is likely about, and Names stays cheap.
	maxNamesPerAddr = 256
	// bindGrace is how much longer the gate keeps an observed binding than
	// the TTL it gave the guest: resolvers and runtimes in the guest keep
	// answers past their TTL (Java: 30 s whatever the TTL; some HTTP
	// clients: for the life of a connection pool), and a connection to an
	// address whose binding is gone loses its name and is denied.
	bindGrace = 5 * time.Minute
	// sweepPerAdd bounds the expired bindings one Add drops.
	sweepPerAdd = 8
)

// Binding is one name bound to an address.
type Binding struct {
	Name   string
	Source audit.NameSource
	Until  time.Time
}

// Bindings remembers which names this sandbox's addresses stand for, and
// why: so a connection to an address is decided by the name the guest
// meant, not by the address alone. It is safe for concurrent use.
type Bindings struct {
	now     func() time.Time
	max     int
	perAddr int

	// mu guards byAddr and order.
	mu     sync.Mutex
	byAddr map[netip.Addr][]*list.Element // most recent first
	order  list.List                      // of *bindEntry; front: most recent
}

type bindEntry struct {
	addr netip.Addr
	Binding
}

// NewBindings builds an empty set of bindings.
func NewBindings(now func() time.Time) *Bindings {
	if now == nil {
		now = time.Now
	}
	return &Bindings{
		now:     now,
		max:     defaultMaxBindings,
		perAddr: maxNamesPerAddr,
		byAddr:  make(map[netip.Addr][]*list.Element),
	}
}

// Add binds name to each of addrs until the given time. Adding a binding
// that exists (same name, address and source) refreshes it: it becomes the
// most recent, and its lifetime is extended, never shortened, since the
// guest may still hold the earlier answer.
func (b *Bindings) Add(name string, addrs []netip.Addr, source audit.NameSource, until time.Time) {
	name = poolKey(name)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() {
			continue
		}
		b.add(a, name, source, until)
	}
	for b.order.Len() > b.max {
		b.remove(b.order.Back())
	}
	// Drop a few expired bindings from the old end, so that memory follows
	// what is live rather than waiting for the cap.
	now := b.now()
	for range sweepPerAdd {
		el := b.order.Back()
		if el == nil || now.Before(el.Value.(*bindEntry).Until) {
			break
		}
		b.remove(el)
	}
}

func (b *Bindings) add(a netip.Addr, name string, source audit.NameSource, until time.Time) {
	els := b.byAddr[a]
	for i, el := range els {
		e := el.Value.(*bindEntry)
		if e.Name != name || e.Source != source {
			continue
		}
		if until.After(e.Until) {
			e.Until = until
		}
		b.order.MoveToFront(el)
		copy(els[1:i+1], els[:i])
		els[0] = el
		return
	}
	if len(els) >= b.perAddr {
		b.order.Remove(els[len(els)-1])
		els = els[:len(els)-1]
	}
	el := b.order.PushFront(&bindEntry{addr: a, Binding: Binding{Name: name, Source: source, Until: until}})
	b.byAddr[a] = slices.Insert(els, 0, el)
}

// remove drops el from both indexes.
func (b *Bindings) remove(el *list.Element) {
	e := b.order.Remove(el).(*bindEntry)
	els := slices.DeleteFunc(b.byAddr[e.addr], func(x *list.Element) bool { return x == el })
	if len(els) == 0 {
		delete(b.byAddr, e.addr)
	} else {
		b.byAddr[e.addr] = els
	}
}

// Names returns the live names bound to ip, most recently added first.
// Expired bindings are dropped here.
func (b *Bindings) Names(ip netip.Addr) []Binding {
	ip = ip.Unmap()
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	var out []Binding
	var expired []*list.Element
	for _, el := range b.byAddr[ip] {
		e := el.Value.(*bindEntry)
		if !now.Before(e.Until) {
			expired = append(expired, el)
			continue
		}
		out = append(out, e.Binding)
	}
	for _, el := range expired {
		b.remove(el)
	}
	return out
}

// Len returns how many bindings are held, expired ones not yet dropped
// included.
func (b *Bindings) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.order.Len()
}
