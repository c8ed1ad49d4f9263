package gate

import (
	"container/list"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// poolPrefix is where synthetic addresses come from: 198.18.0.0/15 is
// reserved for benchmarking (RFC 2544), so no real destination a guest
// could want lives there, and a connection to it can only mean "the name
// the gate handed out".
var poolPrefix = netip.MustParsePrefix("198.18.0.0/15")

const (
	// defaultPoolSize: 65536 names in use at once is far beyond any real
	// workload (a browser session touches a few hundred), and the pool's
	// memory stays a few MiB.
	defaultPoolSize = 65536
	// poolTTL is the TTL a guest gets for a pool answer: short, so a name
	// allowed a moment later (an interactive grant) is soon resolved for
	// real.
	poolTTL = 10 * time.Second
	// poolHold is how long after its last use an address stays bound to
	// its name before it may be handed to another. It is far longer than
	// poolTTL because guests keep answers past their TTL (Java caches for
	// 30 s whatever the TTL), and an address reused too early would show a
	// connection to one name under another's.
	poolHold = 5 * time.Minute
)

// InPool reports whether ip is a synthetic pool address.
func InPool(ip netip.Addr) bool { return poolPrefix.Contains(ip.Unmap()) }

// Pool hands out synthetic addresses for names the policy does not allow,
// so that the guest's next step (a connection to that address) arrives at
// the gate carrying the name it was meant for. Such names are never sent
// upstream. It is safe for concurrent use.
type Pool struct {
	now    func() time.Time
	size   int
	prefix netip.Prefix // where the addresses come from

	// mu guards everything below.
	mu     sync.Mutex
	byName map[string]*list.Element // of *poolEntry
	byAddr map[netip.Addr]*list.Element
	lru    list.List // front: most recently used
	next   int       // next never-used index
}

type poolEntry struct {
	name     string
	addr     netip.Addr
	lastUsed time.Time
}

// NewPool builds an empty pool of the default size.
func NewPool(now func() time.Time) *Pool { return newPool(now, defaultPoolSize) }

// NewPoolIn builds an empty pool whose addresses come from prefix (IPv4, at
// most /30) instead of 198.18.0.0/15: the gate service's range on an
// internal network, which it routes to itself (Options.Names).
func NewPoolIn(prefix netip.Prefix, now func() time.Time) *Pool {
	return newPoolIn(prefix.Masked(), now, defaultPoolSize)
}

func newPool(now func() time.Time, size int) *Pool { return newPoolIn(poolPrefix, now, size) }

func newPoolIn(prefix netip.Prefix, now func() time.Time, size int) *Pool {
	if now == nil {
		now = time.Now
	}
	// The prefix's first and last addresses (network and broadcast) are
	// skipped.
	size = max(min(size, 1<<(32-prefix.Bits())-2), 0)
	return &Pool{
		now:    now,
		size:   size,
		prefix: prefix,
		byName: make(map[string]*list.Element),
		byAddr: make(map[netip.Addr]*list.Element),
	}
}

// Addr returns the address bound to name, binding one if needed. The same
// name gets the same address while it stays in use. When every address is
// taken, the least recently used one is rebound, but only once it has been
// idle for poolHold; if none has, Addr returns the zero Addr (not valid)
// and the caller should answer SERVFAIL: failing a lookup is safer than
// showing one name's connection under another's.
func (p *Pool) Addr(name string) netip.Addr {
	key := poolKey(name)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if el, ok := p.byName[key]; ok {
		p.touch(el, now)
		return el.Value.(*poolEntry).addr
	}
	var e *poolEntry
	switch {
	case p.next < p.size:
		e = &poolEntry{addr: addrIn(p.prefix, p.next)}
		p.next++
	default:
		back := p.lru.Back()
		if back == nil {
			return netip.Addr{}
		}
		old := back.Value.(*poolEntry)
		if now.Sub(old.lastUsed) < poolHold {
			return netip.Addr{}
		}
		p.lru.Remove(back)
		delete(p.byName, old.name)
		delete(p.byAddr, old.addr)
		e = &poolEntry{addr: old.addr}
	}
	e.name, e.lastUsed = key, now
	el := p.lru.PushFront(e)
	p.byName[key] = el
	p.byAddr[e.addr] = el
	return e.addr
}

// Contains reports whether ip is one of this pool's addresses.
func (p *Pool) Contains(ip netip.Addr) bool { return p.prefix.Contains(ip.Unmap()) }

// Name returns the name bound to a pool address. A lookup counts as use:
// a guest connecting to the address keeps the binding alive.
func (p *Pool) Name(ip netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	el, ok := p.byAddr[ip.Unmap()]
	if !ok {
		return "", false
	}
	p.touch(el, p.now())
	return el.Value.(*poolEntry).name, true
}

// Len returns how many names are bound.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lru.Len()
}

func (p *Pool) touch(el *list.Element, now time.Time) {
	el.Value.(*poolEntry).lastUsed = now
	p.lru.MoveToFront(el)
}

// poolAddr is the i-th usable address of the default pool, counting from
// 198.18.0.1.
func poolAddr(i int) netip.Addr { return addrIn(poolPrefix, i) }

// addrIn is the i-th usable address of the IPv4 prefix p, counting from
// the one after its network address.
func addrIn(p netip.Prefix, i int) netip.Addr {
	b := p.Masked().Addr().As4()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n += uint32(i) + 1
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// poolKey normalizes a name for the pool. Callers pass names that went
// through NormalizeName already; this only makes the pool robust to one
// that did not.
func poolKey(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}
