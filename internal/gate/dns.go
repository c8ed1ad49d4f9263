package gate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/policy"
)

// DNS is the guest's only resolver, and a way out like any other: a query
// for attacker.example.test carrying data in its labels reaches the
// attacker's name server if anyone forwards it. So the server below sends
// upstream only A queries for names the policy allows, and answers every
// other question itself:
//
//   - A, allowed name: resolved on the host (Resolver), the answers bound
//     to the name (Bindings, source "observed") and given to the guest with
//     a TTL no longer than the binding lives.
//   - A, any other name: an address from the private pool bound to that
//     name (Pool), never an upstream query.
//   - PTR for a pool address: the name it is bound to.
//   - AXFR, IXFR, MAILA, MAILB: REFUSED.
//   - everything else (AAAA, TXT, MX, SRV, HTTPS, ANY, ...), allowed name
//     or not: NOERROR with no answers. The guest has no IPv6 route, so an
//     empty AAAA makes clients use IPv4 at once; the other types are the
//     usual carriers of tunnelled data, and refusing them also for allowed
//     names keeps one rule with no exceptions. The cost: SRV- or
//     HTTPS-record discovery does not work in the sandbox; clients fall
//     back to A, as they must when those records are absent.

// ErrInvalidName: a name that is not a host name (policy.NormalizeName
// refused it: too long, an empty or over-long label, a character outside
// letters, digits, '-' and '_', a numeric last label).
var ErrInvalidName = errors.New("invalid host name")

// NameDecider says whether name may be reached on some port; the caller
// wraps the policy. rule and layer name what decided, for the audit.
type NameDecider func(name string) (allowed bool, rule, layer string)

// DNSEvent describes one query the guest sent and what it got.
type DNSEvent struct {
	Name    string        // normalized; "" when the query did not parse
	QType   string        // "A", "AAAA", "TYPE65534", ...
	Verdict audit.Verdict // audit.Allow or audit.Deny: the decider's verdict on Name
	Rule    string
	Layer   string
	Answers []netip.Addr
	Pool    bool   // the answer came from the private pool
	Front   bool   // the answer is the front end's own address (HandleAt)
	Rcode   string // "NOERROR", "NXDOMAIN", ...; "" when dropped
	Err     string // why the query failed or was not answered
}

// DNSAudit receives one event per query. It is called synchronously from
// Handle and must not block.
type DNSAudit func(DNSEvent)

// DNSOptions configure a DNSServer.
type DNSOptions struct {
	Decide   NameDecider // nil: every name is denied (fail closed)
	Resolver *Resolver   // nil: allowed names get SERVFAIL
	Pool     *Pool       // nil: denied names get REFUSED
	// PoolAll answers an allowed name with its pool address too, once it
	// resolved upstream (a name that does not exist stays NXDOMAIN, and
	// its real answers are bound as usual): a front end that owns the
	// pool's range and hands the gate every connection to it (the gate
	// service's names range) then decides a connection on any port by
	// the name bound there. The event says Front: the answer is an
	// address of the gate's own.
	PoolAll  bool
	Bindings *Bindings // nil: answers are not bound (tests only)
	Audit    DNSAudit
	Now      func() time.Time
	// Refused reports an answer address the gate would never dial (a
	// private, loopback or metadata address no address rule opens); such
	// answers are left out, so a name rebound to an internal address
	// gives the guest nothing to aim at. nil: keep every answer.
	Refused func(netip.Addr) bool
}

// DNSServer answers the guest's DNS queries. It is safe for concurrent
// use.
type DNSServer struct {
	o       DNSOptions
	tcpIdle time.Duration
}

const (
	// dnsHeaderLen is the fixed DNS header.
	dnsHeaderLen = 12
	// maxUDPAnswer caps an EDNS0 client's advertised size: larger
	// datagrams fragment, and no answer this server gives needs more.
	maxUDPAnswer = 4096
	// tcpIdleTimeout closes a DNS-over-TCP connection with no query for
	// this long (RFC 7766 suggests seconds, not minutes).
	tcpIdleTimeout = 10 * time.Second
	// maxTCPQueries bounds the queries served on one TCP connection.
	maxTCPQueries = 65536
)

// NewDNSServer builds a DNS server.
func NewDNSServer(o DNSOptions) *DNSServer {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &DNSServer{o: o, tcpIdle: tcpIdleTimeout}
}

// Handle answers one query in wire format and returns the response in
// wire format, or nil when the query should be dropped (too short to
// carry an ID, or not a query at all). tcp says the query came over TCP,
// so the answer is not cut to fit a datagram. Every call produces exactly
// one DNSAudit event.
func (s *DNSServer) Handle(ctx context.Context, query []byte, tcp bool) []byte {
	return s.HandleAt(ctx, query, tcp, netip.Addr{})
}

// HandleAt is Handle for a front end that is reached by name (the gate
// service on host sockets, TCPFlow.Named): when front is a valid IPv4
// address, every A answer is front instead of the name's real or pool
// address, so the client's connection comes to the gate, which decides
// it by the name it carries. Nothing else changes: an allowed name is
// still resolved upstream first (a name that does not exist is
// NXDOMAIN, and its addresses are bound), and any other name is never
// sent upstream.
func (s *DNSServer) HandleAt(ctx context.Context, query []byte, tcp bool, front netip.Addr) []byte {
	ev := DNSEvent{Verdict: audit.Deny}
	resp := s.handle(ctx, query, &ev, front)
	if resp != nil {
		ev.Rcode = rcodeName(resp.Rcode)
	}
	wire := s.pack(resp, tcp, &ev)
	if s.o.Audit != nil {
		s.o.Audit(ev)
	}
	return wire
}

// reply carries a response and the limit it must be cut to.
type reply struct {
	*dns.Msg
	udpSize int // 0: no EDNS0 in the query
}

func (s *DNSServer) handle(ctx context.Context, query []byte, ev *DNSEvent, front netip.Addr) *reply {
	req, resp := parseQuery(query, ev)
	if req == nil {
		return resp // dropped (nil) or an error answer
	}
	q := req.Question[0]
	name, err := normalizeQueryName(q.Name)
	if err != nil {
		ev.Err = err.Error()
		resp.Rcode = dns.RcodeFormatError
		return resp
	}
	ev.Name = name
	allowed := false
	if s.o.Decide != nil {
		allowed, ev.Rule, ev.Layer = s.o.Decide(name)
	}
	if allowed {
		ev.Verdict = audit.Allow
	}

	switch q.Qtype {
	case dns.TypeA:
		switch {
		case allowed:
			s.answerResolved(ctx, q, name, resp, ev)
			if front.Is4() && len(resp.Answer) > 0 {
				resp.Answer = []dns.RR{aRecord(q.Name, front, resp.Answer[0].Header().Ttl)}
				ev.Answers, ev.Front = []netip.Addr{front}, true
			} else if s.o.PoolAll && len(resp.Answer) > 0 {
				resp.Answer = nil
				s.answerPool(q, name, resp, ev)
				ev.Front = true
			}
		case front.Is4():
			// A denied name comes to the gate too, which refuses the
			// connection legibly (a 403 page) and audits it by name.
			resp.Answer = append(resp.Answer, aRecord(q.Name, front, uint32(poolTTL/time.Second)))
			ev.Answers, ev.Front = []netip.Addr{front}, true
		default:
			s.answerPool(q, name, resp, ev)
			ev.Front = s.o.PoolAll
		}
	case dns.TypePTR:
		s.answerPTR(q, name, resp, ev)
	case dns.TypeAXFR, dns.TypeIXFR, dns.TypeMAILA, dns.TypeMAILB:
		resp.Rcode = dns.RcodeRefused
	}
	return resp
}

// parseQuery checks that query is one this server answers: a standard
// query with one question of class IN and at most one EDNS0 (version 0)
// record. If so it returns the parsed query and an empty answer to fill.
// If not, req is nil and resp is the error answer to send, or nil to drop.
func parseQuery(query []byte, ev *DNSEvent) (req *dns.Msg, resp *reply) {
	if len(query) < dnsHeaderLen {
		ev.Err = "malformed query: shorter than a DNS header"
		return nil, nil
	}
	flags := binary.BigEndian.Uint16(query[2:4])
	if flags&(1<<15) != 0 {
		ev.Err = "not a query: QR bit set"
		return nil, nil // answering answers could loop between two servers
	}
	req = new(dns.Msg)
	if err := req.Unpack(query); err != nil {
		ev.Err = "malformed query: " + err.Error()
		m := new(dns.Msg)
		m.Id = binary.BigEndian.Uint16(query[0:2])
		m.Response = true
		m.Opcode = int(flags>>11) & 0xF
		m.Rcode = dns.RcodeFormatError
		return nil, &reply{Msg: m}
	}
	resp = &reply{Msg: new(dns.Msg)}
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if len(req.Question) == 1 {
		ev.QType = typeName(req.Question[0].Qtype)
	}
	opt, ok := ednsOf(req)
	if opt != nil {
		resp.SetEdns0(ednsUDPSize, false)
		resp.udpSize = int(opt.UDPSize())
	}
	switch {
	case !ok:
		ev.Err = "malformed query: more than one OPT record"
		resp.Rcode = dns.RcodeFormatError
	case opt != nil && opt.Version() != 0:
		ev.Err = fmt.Sprintf("unsupported EDNS version %d", opt.Version())
		resp.Rcode = dns.RcodeBadVers
	case req.Opcode != dns.OpcodeQuery:
		ev.Err = "opcode " + dns.OpcodeToString[req.Opcode] + " not implemented"
		resp.Rcode = dns.RcodeNotImplemented
	case len(req.Question) != 1:
		ev.Err = fmt.Sprintf("malformed query: %d questions", len(req.Question))
		resp.Rcode = dns.RcodeFormatError
	case req.Question[0].Qclass != dns.ClassINET:
		ev.Err = "class " + className(req.Question[0].Qclass) + " refused"
		resp.Rcode = dns.RcodeRefused
	default:
		return req, resp
	}
	return nil, resp
}

// answerResolved answers an A query for an allowed name from the host's
// resolver, binding the answers before the guest can use them.
func (s *DNSServer) answerResolved(ctx context.Context, q dns.Question, name string, resp *reply, ev *DNSEvent) {
	if s.o.Resolver == nil {
		ev.Err = "no upstream resolver"
		resp.Rcode = dns.RcodeServerFailure
		return
	}
	addrs, ttl, err := s.o.Resolver.LookupA(ctx, name)
	switch {
	case errors.Is(err, ErrNoSuchHost):
		resp.Rcode = dns.RcodeNameError
		return
	case errors.Is(err, ErrNoAddress):
		return
	case err != nil:
		ev.Err = err.Error()
		resp.Rcode = dns.RcodeServerFailure
		return
	}
	if s.o.Refused != nil {
		kept := addrs[:0:0]
		for _, a := range addrs {
			if !s.o.Refused(a) {
				kept = append(kept, a)
			}
		}
		if len(kept) < len(addrs) {
			ev.Err = fmt.Sprintf("%d answer(s) in refused address classes left out", len(addrs)-len(kept))
		}
		if addrs = kept; len(addrs) == 0 {
			return
		}
	}
	// The guest may keep the answer for ttl; the binding outlives that by
	// bindGrace, so the guest never holds an answer the gate has forgotten.
	secs := uint32(clamp(ttl, time.Second, maxTTL) / time.Second)
	if s.o.Bindings != nil {
		until := s.o.Now().Add(time.Duration(secs)*time.Second + bindGrace)
		s.o.Bindings.Add(name, addrs, SourceObserved, until)
	}
	for _, a := range addrs {
		resp.Answer = append(resp.Answer, aRecord(q.Name, a, secs))
	}
	ev.Answers = addrs
}

// answerPool answers an A query for a name the policy does not allow with
// the name's pool address. Nothing is sent upstream.
func (s *DNSServer) answerPool(q dns.Question, name string, resp *reply, ev *DNSEvent) {
	if s.o.Pool == nil {
		resp.Rcode = dns.RcodeRefused
		return
	}
	ip := s.o.Pool.Addr(name)
	if !ip.IsValid() {
		ev.Err = "private address pool exhausted"
		resp.Rcode = dns.RcodeServerFailure
		return
	}
	resp.Answer = append(resp.Answer, aRecord(q.Name, ip, uint32(poolTTL/time.Second)))
	ev.Answers = []netip.Addr{ip}
	ev.Pool = true
}

// answerPTR names a pool address. Any other reverse lookup gets no answer:
// it would tell the guest nothing it needs, and upstream it would leak the
// address.
func (s *DNSServer) answerPTR(q dns.Question, name string, resp *reply, ev *DNSEvent) {
	ip, ok := reverseIPv4(name)
	if !ok || s.o.Pool == nil || !s.o.Pool.Contains(ip) {
		return
	}
	bound, ok := s.o.Pool.Name(ip)
	if !ok {
		return
	}
	resp.Answer = append(resp.Answer, &dns.PTR{
		Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypePTR, Class: dns.ClassINET, Ttl: uint32(poolTTL / time.Second)},
		Ptr: dns.Fqdn(bound),
	})
	ev.Pool = true
}

// pack cuts resp to what the transport carries and packs it.
func (s *DNSServer) pack(resp *reply, tcp bool, ev *DNSEvent) []byte {
	if resp == nil {
		return nil
	}
	limit := dns.MaxMsgSize
	if !tcp {
		limit = dns.MinMsgSize
		if resp.udpSize > 0 {
			limit = min(max(resp.udpSize, dns.MinMsgSize), maxUDPAnswer)
		}
	}
	resp.Truncate(limit)
	resp.Compress = true
	wire, err := resp.Pack()
	if err != nil {
		// Nothing this server builds fails to pack; if it did, the
		// smallest honest answer is a bare SERVFAIL.
		ev.Err = "packing answer: " + err.Error()
		ev.Rcode = rcodeName(dns.RcodeServerFailure)
		m := &dns.Msg{MsgHdr: resp.MsgHdr}
		m.Rcode = dns.RcodeServerFailure
		m.Question = resp.Question
		if wire, err = m.Pack(); err != nil {
			return nil
		}
	}
	return wire
}

// ServeTCP serves length-prefixed DNS messages on c (RFC 7766), one after
// another, until the peer closes, stays idle for 10 s, sends something
// that must be dropped, or ctx ends. It closes c.
func (s *DNSServer) ServeTCP(ctx context.Context, c net.Conn) {
	s.ServeTCPAt(ctx, c, netip.Addr{})
}

// ServeTCPAt is ServeTCP answering as HandleAt does.
func (s *DNSServer) ServeTCPAt(ctx context.Context, c net.Conn, front netip.Addr) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var hdr [2]byte
	for range maxTCPQueries {
		// Deadlines are wall-clock: the injected clock is for decisions.
		c.SetReadDeadline(time.Now().Add(s.tcpIdle))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint16(hdr[:]) // at most 64 KiB by construction
		if n == 0 {
			return
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		resp := s.HandleAt(ctx, msg, true, front)
		if resp == nil {
			return
		}
		out := make([]byte, 2+len(resp))
		binary.BigEndian.PutUint16(out, uint16(len(resp)))
		copy(out[2:], resp)
		c.SetWriteDeadline(time.Now().Add(s.tcpIdle))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// normalizeName returns name as the gate and the policy compare it (lower
// case, no trailing dot, IDNs as punycode), using the policy's own
// normalization so the two can never disagree on what a name is.
func normalizeName(name string) (string, error) {
	n, err := policy.NormalizeName(name)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidName, err)
	}
	return n, nil
}

// normalizeQueryName normalizes a name from a query. It first refuses
// anything but letters, digits, '-', '_' and dots: a resolver sends IDNs
// as punycode, so raw non-ASCII bytes (which miekg/dns presents as \DDD
// escapes) and escaped dots are junk or an attempt to make two parties
// read one name two ways.
func normalizeQueryName(name string) (string, error) {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return "", fmt.Errorf("%w: byte %q in a query name", ErrInvalidName, c)
		}
	}
	return normalizeName(name)
}

// ednsOf returns the query's OPT record, if any; ok is false when there
// is more than one (RFC 6891 §6.1.1: FORMERR).
func ednsOf(m *dns.Msg) (opt *dns.OPT, ok bool) {
	for _, rr := range m.Extra {
		if o, isOpt := rr.(*dns.OPT); isOpt {
			if opt != nil {
				return nil, false
			}
			opt = o
		}
	}
	return opt, true
}

func aRecord(owner string, ip netip.Addr, ttl uint32) *dns.A {
	return &dns.A{
		Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl},
		A:   ip.AsSlice(),
	}
}

// reverseIPv4 parses "d.c.b.a.in-addr.arpa" (normalized) into a.b.c.d.
func reverseIPv4(name string) (netip.Addr, bool) {
	rest, ok := strings.CutSuffix(name, ".in-addr.arpa")
	if !ok {
		return netip.Addr{}, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(parts[3] + "." + parts[2] + "." + parts[1] + "." + parts[0])
	if err != nil || !ip.Is4() {
		return netip.Addr{}, false
	}
	return ip, true
}

func typeName(t uint16) string {
	if s, ok := dns.TypeToString[t]; ok {
		return s
	}
	return fmt.Sprintf("TYPE%d", t)
}

func className(c uint16) string {
	if s, ok := dns.ClassToString[c]; ok {
		return s
	}
	return fmt.Sprintf("CLASS%d", c)
}
