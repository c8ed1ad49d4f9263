package inet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

const (
	// defaultTTL is what answers carry until SetTTL: long enough that a caching gate does not
	// ask twice within a test, so a second upstream query in the log means something.
	defaultTTL = 60
	// maxCNAMEHops bounds following CNAMEs within the zone (a loop is a test's mistake, not a
	// reason to hang).
	maxCNAMEHops = 8
	// dnsStartTimeout bounds waiting for the DNS listeners to come up, and for them to stop.
	dnsStartTimeout = 5 * time.Second
	// dnsIdleTimeout ends a TCP DNS connection a client left open.
	dnsIdleTimeout = 10 * time.Second
)

// zone is the authoritative data of a Net's DNS server and the log of what it was asked.
type zone struct {
	mu      sync.Mutex // guards everything below
	ttl     uint32
	a       map[string][]netip.Addr
	aaaa    map[string][]netip.Addr
	txt     map[string][]string
	cname   map[string]string
	queries []string
	drop    int
}

func newZone() *zone {
	return &zone{
		ttl:   defaultTTL,
		a:     map[string][]netip.Addr{},
		aaaa:  map[string][]netip.Addr{},
		txt:   map[string][]string{},
		cname: map[string]string{},
	}
}

// canon is the key a name is stored under: lower case, no trailing dot.
func canon(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) }

// SetA sets the A records of name (replacing earlier ones); no ips removes them. Use .test
// names. It panics on an address that is not IPv4: that is a mistake in the test.
func (n *Net) SetA(name string, ips ...string) { n.zone.setAddrs(n.zone.a, name, ips, true) }

// SetAAAA sets the AAAA records of name, as SetA.
func (n *Net) SetAAAA(name string, ips ...string) { n.zone.setAddrs(n.zone.aaaa, name, ips, false) }

func (z *zone) setAddrs(m map[string][]netip.Addr, name string, ips []string, v4 bool) {
	addrs := make([]netip.Addr, len(ips))
	for i, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Is4() != v4 {
			panic(fmt.Sprintf("inet: %q is not an IPv%s address for %s", s, map[bool]string{true: "4", false: "6"}[v4], name))
		}
		addrs[i] = a
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if len(addrs) == 0 {
		delete(m, canon(name))
		return
	}
	m[canon(name)] = addrs
}

// SetTXT sets the TXT records of name, one record per string; none removes them.
func (n *Net) SetTXT(name string, txts ...string) {
	z := n.zone
	z.mu.Lock()
	defer z.mu.Unlock()
	if len(txts) == 0 {
		delete(z.txt, canon(name))
		return
	}
	z.txt[canon(name)] = append([]string(nil), txts...)
}

// SetCNAME makes name an alias of target; an empty target removes the alias.
func (n *Net) SetCNAME(name, target string) {
	z := n.zone
	z.mu.Lock()
	defer z.mu.Unlock()
	if target == "" {
		delete(z.cname, canon(name))
		return
	}
	z.cname[canon(name)] = canon(target)
}

// SetTTL sets the TTL of every answer from now on (60 s until then).
func (n *Net) SetTTL(ttl uint32) {
	n.zone.mu.Lock()
	n.zone.ttl = ttl
	n.zone.mu.Unlock()
}

// DropFirst makes the server ignore the next k queries over UDP, as a lossy path would; they
// are still logged. TCP queries are always answered.
func (n *Net) DropFirst(k int) {
	n.zone.mu.Lock()
	n.zone.drop = k
	n.zone.mu.Unlock()
}

// Queries returns every question received over UDP or TCP, in order, as "name TYPE" with the
// name as sent minus its trailing dot: "allowed.test A", "x.evil.test TXT". Dropped queries
// are included.
func (n *Net) Queries() []string {
	n.zone.mu.Lock()
	defer n.zone.mu.Unlock()
	return append([]string(nil), n.zone.queries...)
}

// Asked counts the queries for name or any name below it, ignoring case: Asked("evil.test")
// must stay 0 in the DNS exfiltration test, whatever labels the guest put in front.
func (n *Net) Asked(name string) int {
	want := canon(name)
	k := 0
	for _, q := range n.Queries() {
		qn := canon(q[:strings.LastIndexByte(q, ' ')])
		if qn == want || strings.HasSuffix(qn, "."+want) {
			k++
		}
	}
	return k
}

// ResetQueries empties the query log.
func (n *Net) ResetQueries() {
	n.zone.mu.Lock()
	n.zone.queries = nil
	n.zone.mu.Unlock()
}

// startDNS serves the zone on n.DNS over UDP and TCP.
func (n *Net) startDNS() error {
	if err := n.addHost(n.DNS.Addr()); err != nil {
		return err
	}
	pc, err := n.listenUDP(n.DNS)
	if err != nil {
		return err
	}
	l, err := n.listenTCP(n.DNS)
	if err != nil {
		pc.Close()
		return err
	}
	servers := []struct {
		proto string
		s     *dns.Server
	}{
		{"udp", &dns.Server{PacketConn: pc, Handler: n.zone}},
		{"tcp", &dns.Server{Listener: l, Handler: n.zone, IdleTimeout: func() time.Duration { return dnsIdleTimeout }}},
	}
	var stops []func() error
	stopAll := func() error {
		var errs []error
		for _, stop := range stops {
			errs = append(errs, stop())
		}
		return errors.Join(errs...)
	}
	for _, srv := range servers {
		stop, err := serveDNS(srv.proto, srv.s)
		if err != nil {
			pc.Close()
			l.Close()
			return errors.Join(err, stopAll())
		}
		stops = append(stops, stop)
	}
	n.mu.Lock()
	n.dnsStop = stopAll
	n.mu.Unlock()
	return nil
}

// serveDNS starts s and returns once it serves; stop shuts it down and waits for it.
func serveDNS(proto string, s *dns.Server) (stop func() error, err error) {
	started := make(chan struct{})
	done := make(chan error, 1)
	s.NotifyStartedFunc = func() { close(started) }
	go func() { done <- s.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-done:
		return nil, fmt.Errorf("serving DNS over %s: %w", proto, err)
	case <-time.After(dnsStartTimeout):
		return nil, fmt.Errorf("DNS over %s did not start within %v", proto, dnsStartTimeout)
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), dnsStartTimeout)
		defer cancel()
		if err := s.ShutdownContext(ctx); err != nil {
			return fmt.Errorf("stopping DNS over %s: %w", proto, err)
		}
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("DNS over %s still serving after %v", proto, dnsStartTimeout)
		}
	}, nil
}

// ServeDNS answers one query from the zone. Unknown names get NXDOMAIN, names with no record of
// the asked type an empty NOERROR; both carry an SOA so resolvers can cache the negative answer.
func (z *zone) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	_, udp := w.LocalAddr().(*net.UDPAddr)
	z.mu.Lock()
	for _, q := range r.Question {
		z.queries = append(z.queries, strings.TrimSuffix(q.Name, ".")+" "+dns.Type(q.Qtype).String())
	}
	drop := udp && z.drop > 0
	if drop {
		z.drop--
	}
	m := z.answer(r)
	z.mu.Unlock()
	if drop {
		return
	}
	if udp {
		size := dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

// answer builds the reply to r; z.mu is held.
func (z *zone) answer(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	if opt := r.IsEdns0(); opt != nil {
		m.SetEdns0(dns.DefaultMsgSize, false)
	}
	if r.Opcode != dns.OpcodeQuery {
		m.Rcode = dns.RcodeNotImplemented
		return m
	}
	if len(r.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	q := r.Question[0]
	if q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY {
		m.Rcode = dns.RcodeRefused
		return m
	}
	owner, name := q.Name, canon(q.Name)
	for hops := 0; hops < maxCNAMEHops; hops++ {
		target, ok := z.cname[name]
		if !ok {
			break
		}
		m.Answer = append(m.Answer, &dns.CNAME{Hdr: z.hdr(owner, dns.TypeCNAME), Target: dns.Fqdn(target)})
		if q.Qtype == dns.TypeCNAME {
			return m
		}
		owner, name = dns.Fqdn(target), target
	}
	rrs := z.records(owner, name, q.Qtype)
	m.Answer = append(m.Answer, rrs...)
	if !z.exists(name) {
		m.Rcode = dns.RcodeNameError
	}
	if len(rrs) == 0 {
		m.Ns = []dns.RR{z.soa(name)}
	}
	return m
}

func (z *zone) records(owner, name string, qtype uint16) []dns.RR {
	var rrs []dns.RR
	all := qtype == dns.TypeANY
	if qtype == dns.TypeA || all {
		for _, a := range z.a[name] {
			rrs = append(rrs, &dns.A{Hdr: z.hdr(owner, dns.TypeA), A: a.AsSlice()})
		}
	}
	if qtype == dns.TypeAAAA || all {
		for _, a := range z.aaaa[name] {
			rrs = append(rrs, &dns.AAAA{Hdr: z.hdr(owner, dns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	if qtype == dns.TypeTXT || all {
		for _, t := range z.txt[name] {
			rrs = append(rrs, &dns.TXT{Hdr: z.hdr(owner, dns.TypeTXT), Txt: chunks(t, 255)})
		}
	}
	return rrs
}

// exists reports whether name has any record or lies above a name that has one (an empty
// non-terminal, which is NOERROR, not NXDOMAIN).
func (z *zone) exists(name string) bool {
	for _, m := range []map[string][]netip.Addr{z.a, z.aaaa} {
		for k := range m {
			if k == name || strings.HasSuffix(k, "."+name) {
				return true
			}
		}
	}
	for k := range z.txt {
		if k == name || strings.HasSuffix(k, "."+name) {
			return true
		}
	}
	for k := range z.cname {
		if k == name || strings.HasSuffix(k, "."+name) {
			return true
		}
	}
	return false
}

func (z *zone) hdr(owner string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: owner, Rrtype: t, Class: dns.ClassINET, Ttl: z.ttl}
}

// soa is the negative-answer SOA, owned by the name's top-level label (test.).
func (z *zone) soa(name string) dns.RR {
	apex := "."
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		apex = name[i+1:] + "."
	} else if name != "" {
		apex = name + "."
	}
	return &dns.SOA{
		Hdr:     z.hdr(apex, dns.TypeSOA),
		Ns:      "ns." + strings.TrimPrefix(apex, "."),
		Mbox:    "hostmaster." + strings.TrimPrefix(apex, "."),
		Serial:  1,
		Refresh: 3600,
		Retry:   600,
		Expire:  86400,
		Minttl:  z.ttl,
	}
}

// chunks splits a TXT string into the 255-byte character-strings DNS carries.
func chunks(s string, size int) []string {
	out := []string{}
	for len(s) > size {
		out = append(out, s[:size])
		s = s[size:]
	}
	return append(out, s)
}
