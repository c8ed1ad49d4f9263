package gate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sync/singleflight"
)

// Errors from LookupA. Callers match them with errors.Is.
var (
	// ErrNoSuchHost: the upstream resolver answered NXDOMAIN.
	ErrNoSuchHost = errors.New("no such host")
	// ErrNoAddress: the name exists but has no A record (NODATA), e.g. an
	// IPv6-only name or one whose CNAME target lies outside the answer.
	ErrNoAddress = errors.New("no IPv4 address for name")
	// ErrServerFailure: no upstream server gave a usable answer
	// (SERVFAIL, REFUSED, a malformed reply, or none at all in time).
	ErrServerFailure = errors.New("upstream resolver failed")
	// ErrBusy: too many upstream lookups are already in flight. The gate
	// answers SERVFAIL rather than queueing, so a query flood from the
	// guest costs a bounded amount of upstream work.
	ErrBusy = errors.New("too many upstream lookups in flight")
	// ErrClosed: the resolver was closed.
	ErrClosed = errors.New("resolver closed")
)

// Cache bounds. Upstream TTLs are clamped so that a zero TTL cannot turn
// every guest query into an upstream query (min), and a week-long TTL
// cannot pin an address a CDN has long moved away from (max). Negative
// answers are kept briefly: long enough to absorb a client retrying a
// missing name in a loop, short enough that a name created a moment later
// works soon.
const (
	minTTL    = 5 * time.Second
	maxTTL    = 5 * time.Minute
	minNegTTL = 5 * time.Second
	maxNegTTL = 30 * time.Second
)

const (
	// defaultLookupTimeout bounds one upstream lookup, retries included.
	defaultLookupTimeout = 3 * time.Second
	// defaultRetryAfter: the host resolver drops about 1 query in 100, and
	// an answer from a healthy one arrives well within 250 ms; waiting for
	// the stub resolver's usual 5 s instead made one lookup in a hundred
	// look like an outage.
	defaultRetryAfter = 250 * time.Millisecond
	// maxAttempts bounds the UDP queries one lookup sends. With the retry
	// interval doubling from 250 ms, the fifth would go out at 3.75 s,
	// past the default timeout.
	maxAttempts = 5
	// defaultMaxInFlight bounds concurrent upstream lookups per resolver.
	defaultMaxInFlight = 64
	// defaultMaxCache bounds the cache; a guest walking random names can
	// grow it only this far.
	defaultMaxCache = 10000
	// maxCNAMEHops bounds how far a CNAME chain inside one answer is
	// followed; real chains are 1–3 long.
	maxCNAMEHops = 16
	// ednsUDPSize is what the resolver advertises upstream: the DNS flag
	// day 2020 value, which avoids IP fragmentation on common paths.
	ednsUDPSize = 1232
	// udpReadBuf is larger than ednsUDPSize so a server that ignores the
	// advertised size is read whole rather than cut.
	udpReadBuf = 4096
)

// ResolverOptions configure a Resolver.
type ResolverOptions struct {
	// Servers are the host's upstream resolvers, tried in order.
	Servers []netip.AddrPort
	// Now is the clock for cache expiry (default time.Now).
	Now func() time.Time
	// Timeout bounds one lookup including retries (default 3 s).
	Timeout time.Duration
	// RetryAfter is how long to wait for an answer before asking again,
	// the next server if there are several; it doubles per attempt
	// (default 250 ms).
	RetryAfter time.Duration
	// MaxInFlight bounds concurrent upstream lookups (default 64).
	MaxInFlight int
}

// Resolver resolves, on the host, the names the policy allows. It caches
// answers within clamped TTLs, coalesces concurrent lookups of a name,
// retries dropped queries quickly, falls back to TCP for truncated answers
// and returns IPv4 addresses only. It is safe for concurrent use.
type Resolver struct {
	servers    []netip.AddrPort
	now        func() time.Time
	timeout    time.Duration
	retryAfter time.Duration
	maxCache   int
	sem        chan struct{}
	flights    singleflight.Group
	dialer     net.Dialer

	// mu guards cache, closed and the work group's Add.
	mu     sync.Mutex
	cache  map[string]cacheEntry
	closed bool
	work   sync.WaitGroup
	base   context.Context
	cancel context.CancelFunc
}

// cacheEntry is one cached answer: addresses, or a negative answer.
type cacheEntry struct {
	addrs   []netip.Addr
	err     error // nil, ErrNoSuchHost or ErrNoAddress
	expires time.Time
}

// NewResolver builds a resolver. It sends nothing until asked.
func NewResolver(o ResolverOptions) *Resolver {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Timeout <= 0 {
		o.Timeout = defaultLookupTimeout
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = defaultRetryAfter
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = defaultMaxInFlight
	}
	base, cancel := context.WithCancel(context.Background())
	return &Resolver{
		servers:    slices.Clone(o.Servers),
		now:        o.Now,
		timeout:    o.Timeout,
		retryAfter: o.RetryAfter,
		maxCache:   defaultMaxCache,
		sem:        make(chan struct{}, o.MaxInFlight),
		cache:      make(map[string]cacheEntry),
		base:       base,
		cancel:     cancel,
	}
}

// Close stops in-flight upstream lookups and waits for them to end.
// Lookups after Close fail with ErrClosed.
func (r *Resolver) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.work.Wait()
}

// ServersFromResolvConf reads the nameserver lines of a resolv.conf (path
// "" means /etc/resolv.conf) and returns them with port 53.
func ServersFromResolvConf(path string) ([]netip.AddrPort, error) {
	if path == "" {
		path = "/etc/resolv.conf"
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading resolver config: %w", err)
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		ip, err := netip.ParseAddr(fields[1])
		if err != nil {
			continue // glibc skips what it cannot parse, so do we
		}
		out = append(out, netip.AddrPortFrom(ip, 53))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading resolver config %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("reading resolver config %s: no nameserver lines; add one or pass the servers explicitly", path)
	}
	return out, nil
}

// LookupA returns the IPv4 addresses of name and how long they may be
// used. NXDOMAIN is ErrNoSuchHost and NODATA is ErrNoAddress (both with
// the ttl the negative answer is cached for). The wait is bounded by ctx;
// the upstream work itself by the resolver's Timeout, and shared with
// concurrent lookups of the same name.
func (r *Resolver) LookupA(ctx context.Context, name string) ([]netip.Addr, time.Duration, error) {
	key, err := normalizeName(name)
	if err != nil {
		return nil, 0, fmt.Errorf("resolving %q: %w", name, err)
	}
	if e, ok := r.cached(key); ok {
		return r.result(key, e)
	}
	ch := r.flights.DoChan(key, func() (any, error) { return r.lookup(key) })
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, 0, fmt.Errorf("resolving %q: %w", key, res.Err)
		}
		return r.result(key, res.Val.(cacheEntry))
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("resolving %q: %w", key, ctx.Err())
	}
}

func (r *Resolver) result(key string, e cacheEntry) ([]netip.Addr, time.Duration, error) {
	ttl := e.expires.Sub(r.now())
	if e.err != nil {
		return nil, ttl, fmt.Errorf("resolving %q: %w", key, e.err)
	}
	return slices.Clone(e.addrs), ttl, nil
}

// cached returns the live cache entry for key.
func (r *Resolver) cached(key string) (cacheEntry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.cache[key]
	if !ok {
		return cacheEntry{}, false
	}
	if !r.now().Before(e.expires) {
		delete(r.cache, key)
		return cacheEntry{}, false
	}
	return e, true
}

func (r *Resolver) store(key string, e cacheEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cache) >= r.maxCache {
		now := r.now()
		for k, v := range r.cache {
			if !now.Before(v.expires) {
				delete(r.cache, k)
			}
		}
		// Still full of live entries: drop a tenth, arbitrary ones (map
		// order), so the sweep above runs once per many inserts. A dropped
		// entry costs one more upstream query, nothing else.
		for k := range r.cache {
			if len(r.cache) < r.maxCache*9/10 {
				break
			}
			delete(r.cache, k)
		}
	}
	r.cache[key] = e
}

// lookup is one coalesced upstream lookup of key.
func (r *Resolver) lookup(key string) (cacheEntry, error) {
	if e, ok := r.cached(key); ok {
		return e, nil // a flight that finished just before this one began
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return cacheEntry{}, ErrClosed
	}
	r.work.Add(1)
	r.mu.Unlock()
	defer r.work.Done()

	select {
	case r.sem <- struct{}{}:
		defer func() { <-r.sem }()
	default:
		return cacheEntry{}, ErrBusy
	}
	if len(r.servers) == 0 {
		return cacheEntry{}, fmt.Errorf("%w: no upstream servers configured", ErrServerFailure)
	}
	ctx, cancel := context.WithTimeout(r.base, r.timeout)
	defer cancel()

	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(key), dns.TypeA)
	q.SetEdns0(ednsUDPSize, false)
	resp, err := r.exchange(ctx, q)
	if err != nil {
		return cacheEntry{}, err
	}
	addrs, ttl, err := answerA(dns.Fqdn(key), resp)
	if err != nil && !errors.Is(err, ErrNoSuchHost) && !errors.Is(err, ErrNoAddress) {
		return cacheEntry{}, err
	}
	e := cacheEntry{addrs: addrs, err: err, expires: r.now().Add(ttl)}
	r.store(key, e)
	return e, nil
}

// answerA extracts the A records for qname from resp, following CNAMEs
// inside the answer section, and the TTL to cache the result for. Records
// for owners off the chain are ignored: a resolver may add them, and a
// forged or confused one must not bind them to qname. Addresses in the
// private pool's range are dropped too: the gate reads those as its own.
func answerA(qname string, resp *dns.Msg) ([]netip.Addr, time.Duration, error) {
	switch resp.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		return nil, negativeTTL(resp), ErrNoSuchHost
	default:
		return nil, 0, fmt.Errorf("%w: upstream answered %s", ErrServerFailure, rcodeName(resp.Rcode))
	}
	target := qname
	ttl := uint32(maxTTL / time.Second)
	var addrs []netip.Addr
	for range maxCNAMEHops {
		var next string
		var nextTTL uint32
		for _, rr := range resp.Answer {
			h := rr.Header()
			if h.Class != dns.ClassINET || !strings.EqualFold(h.Name, target) {
				continue
			}
			switch v := rr.(type) {
			case *dns.A:
				ip, ok := netip.AddrFromSlice(v.A)
				if !ok {
					continue
				}
				ip = ip.Unmap()
				// A pool address from upstream would make a connection
				// to it look like one to the pool name bound there.
				if InPool(ip) {
					continue
				}
				if !slices.Contains(addrs, ip) {
					addrs = append(addrs, ip)
				}
				ttl = min(ttl, h.Ttl)
			case *dns.CNAME:
				next, nextTTL = v.Target, h.Ttl
			}
		}
		if len(addrs) > 0 || next == "" {
			break
		}
		target, ttl = next, min(ttl, nextTTL)
	}
	if len(addrs) == 0 {
		return nil, negativeTTL(resp), ErrNoAddress
	}
	return addrs, clamp(time.Duration(ttl)*time.Second, minTTL, maxTTL), nil
}

// negativeTTL is how long a negative answer is cached: the SOA's negative
// TTL (RFC 2308: the lesser of its TTL and MINIMUM), clamped.
func negativeTTL(resp *dns.Msg) time.Duration {
	for _, rr := range resp.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			s := min(soa.Hdr.Ttl, soa.Minttl)
			return clamp(time.Duration(s)*time.Second, minNegTTL, maxNegTTL)
		}
	}
	return minNegTTL
}

func clamp(d, lo, hi time.Duration) time.Duration { return min(max(d, lo), hi) }

func rcodeName(rc int) string {
	if s, ok := dns.RcodeToString[rc]; ok {
		return s
	}
	return fmt.Sprintf("RCODE%d", rc)
}

// udpResult is what one UDP attempt produced.
type udpResult struct {
	server int // index in Resolver.servers
	msg    *dns.Msg
	err    error
}

// exchange sends q over UDP and returns the first valid answer. If none
// arrives within retryAfter it sends q again (to the next server, if there
// are several) while still listening on the earlier sockets, doubling the
// wait each time. A server that fails outright (port unreachable,
// SERVFAIL, REFUSED) is not asked again, and the next one is asked at
// once; when every server has failed, so does the lookup. A truncated
// answer is asked again over TCP.
func (r *Resolver) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	wire, err := q.Pack()
	if err != nil {
		return nil, fmt.Errorf("packing query: %w", err)
	}
	results := make(chan udpResult, maxAttempts)
	var (
		conns   []net.Conn
		readers sync.WaitGroup
	)
	defer func() {
		for _, c := range conns {
			c.Close() // ends the reader blocked on it
		}
		readers.Wait()
	}()

	timer := time.NewTimer(0)
	defer timer.Stop()
	var (
		wait          = r.retryAfter
		sent, pending int
		next          int                            // the server to ask next, round robin
		bad           = make([]bool, len(r.servers)) // servers that failed outright
		lastErr       error
	)
	failed := func(server int, err error) (done bool) {
		lastErr, bad[server] = err, true
		if !slices.Contains(bad, false) || (sent == maxAttempts && pending == 0) {
			return true
		}
		if pending == 0 {
			timer.Reset(0) // nothing left to wait for: ask the next server now
		}
		return false
	}
	for {
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return nil, lastErr
			}
			return nil, fmt.Errorf("%w: no answer from %s in time", ErrServerFailure, r.serverList())
		case <-timer.C:
			if sent == maxAttempts {
				continue
			}
			idx := next
			for bad[idx] { // some server is not bad, or exchange would have returned
				idx = (idx + 1) % len(r.servers)
			}
			next = (idx + 1) % len(r.servers)
			server := r.servers[idx]
			sent++
			timer.Reset(wait)
			wait *= 2
			c, err := r.dialer.DialContext(ctx, "udp", server.String())
			if err == nil {
				if _, err = c.Write(wire); err != nil {
					c.Close()
				}
			}
			if err != nil {
				if failed(idx, fmt.Errorf("%w: querying %s: %v", ErrServerFailure, server, err)) {
					return nil, lastErr
				}
				continue
			}
			conns = append(conns, c)
			pending++
			readers.Add(1)
			go func() {
				defer readers.Done()
				m, err := readAnswer(c, q)
				results <- udpResult{server: idx, msg: m, err: err}
			}()
		case res := <-results:
			pending--
			server := r.servers[res.server]
			if res.err == nil && res.msg.Truncated {
				return r.exchangeTCP(ctx, server, q)
			}
			if res.err == nil && (res.msg.Rcode == dns.RcodeServerFailure || res.msg.Rcode == dns.RcodeRefused) {
				res.err = fmt.Errorf("%w: %s answered %s", ErrServerFailure, server, rcodeName(res.msg.Rcode))
			}
			if res.err == nil {
				return res.msg, nil
			}
			if failed(res.server, res.err) {
				return nil, lastErr
			}
		}
	}
}

// readAnswer reads datagrams from c until one is a valid answer to q. A
// reply with the wrong ID or question (late, or spoofed) is skipped.
// The loop ends when c is closed.
func readAnswer(c net.Conn, q *dns.Msg) (*dns.Msg, error) {
	buf := make([]byte, udpReadBuf)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, fmt.Errorf("%w: reading answer: %v", ErrServerFailure, err)
		}
		m := new(dns.Msg)
		if m.Unpack(buf[:n]) != nil || !answers(m, q) {
			continue
		}
		return m, nil
	}
}

// answers reports whether m is a reply to q.
func answers(m, q *dns.Msg) bool {
	if !m.Response || m.Id != q.Id || m.Opcode != dns.OpcodeQuery || len(m.Question) != 1 {
		return false
	}
	a, b := m.Question[0], q.Question[0]
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && strings.EqualFold(a.Name, b.Name)
}

// exchangeTCP asks q again over TCP, after a truncated UDP answer.
func (r *Resolver) exchangeTCP(ctx context.Context, server netip.AddrPort, q *dns.Msg) (*dns.Msg, error) {
	c := &dns.Client{Net: "tcp", Dialer: &r.dialer, Timeout: r.timeout}
	m, _, err := c.ExchangeContext(ctx, q, server.String())
	if err != nil {
		return nil, fmt.Errorf("%w: querying %s over TCP: %v", ErrServerFailure, server, err)
	}
	if !answers(m, q) {
		return nil, fmt.Errorf("%w: %s answered another question over TCP", ErrServerFailure, server)
	}
	if m.Rcode == dns.RcodeServerFailure || m.Rcode == dns.RcodeRefused {
		return nil, fmt.Errorf("%w: %s answered %s", ErrServerFailure, server, rcodeName(m.Rcode))
	}
	return m, nil
}

func (r *Resolver) serverList() string {
	s := make([]string, len(r.servers))
	for i, a := range r.servers {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}
