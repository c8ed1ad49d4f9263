package gate

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"moat.dev/moat/internal/audit"
)

// The seam for front ends reached by name (the gate service): DNS answers
// with the front end's address, and a Named flow is decided by its name
// alone.

func TestHandleAtAnswersWithTheFront(t *testing.T) {
	f := newDNSFixture(t)
	front := netip.MustParseAddr("10.9.9.9")
	for _, tc := range []struct {
		name  string
		qtype uint16
		rcode int
		want  []string // answers
		asked bool     // the upstream saw the name
	}{
		{"allowed.example.test", dns.TypeA, dns.RcodeSuccess, []string{"10.9.9.9"}, true},
		{"denied.example.test", dns.TypeA, dns.RcodeSuccess, []string{"10.9.9.9"}, false},
		{"anything.invalid", dns.TypeA, dns.RcodeSuccess, []string{"10.9.9.9"}, false},
		{"nx.example.test", dns.TypeA, dns.RcodeNameError, nil, true},
		{"allowed.example.test", dns.TypeAAAA, dns.RcodeSuccess, nil, false},
	} {
		before := f.upstream.count()
		r := new(dns.Msg)
		if err := r.Unpack(f.srv.HandleAt(context.Background(), query(t, tc.name, tc.qtype), false, front)); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				got = append(got, a.A.String())
			}
		}
		if r.Rcode != tc.rcode || strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s %s: %s %v, want %s %v", tc.name, dns.TypeToString[tc.qtype], dns.RcodeToString[r.Rcode], got, dns.RcodeToString[tc.rcode], tc.want)
		}
		if asked := f.upstream.count() > before; asked != tc.asked {
			t.Errorf("%s %s: upstream asked %v, want %v", tc.name, dns.TypeToString[tc.qtype], asked, tc.asked)
		}
	}
	// The real answer is still bound to the name, for the dial.
	if names := f.binds.Names(netip.MustParseAddr("192.0.2.10")); len(names) == 0 || names[0].Name != "allowed.example.test" {
		t.Errorf("bindings of 192.0.2.10: %v, want allowed.example.test", names)
	}
	// Without a front, the answer is the real one (the sandbox's path).
	r := new(dns.Msg)
	r.Unpack(f.srv.Handle(context.Background(), query(t, "allowed.example.test", dns.TypeA), false))
	if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.10" {
		t.Errorf("Handle: %v, want 192.0.2.10", r.Answer)
	}
}

func TestNamedFlowIsDecidedByNameAlone(t *testing.T) {
	for _, tc := range []struct {
		name, send string
		reason     audit.Reason
	}{
		// No name at all: no address rule may speak for the gate's own
		// address, even one that allows it.
		{"no host", "GET / HTTP/1.0\r\n\r\n", audit.NamelessToGate(audit.ReasonNoHost)},
		// Neither TLS nor HTTP: nothing to decide by.
		{"not web", "SSH-2.0-OpenSSH_9.6\r\n", audit.ReasonNotByName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The gate's own address is allowed by an address rule and is
			// loopback: a Named flow must ignore both.
			f := newFixture(t, nil, []string{"127.0.0.0/8"}, nil)
			ln := listenAt(t, "127.0.0.1:0")
			dst := netip.MustParseAddrPort(ln.Addr().String())
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				f.g.HandleTCP(context.Background(), TCPFlow{
					Src: netip.MustParseAddrPort("10.88.0.2:40000"), Dst: dst, Named: true,
					Accept: func() (net.Conn, error) { return c, nil },
					Refuse: func() { c.Close() },
				})
			}()
			c, err := net.Dial("tcp", dst.String())
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte(tc.send))
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			io.ReadAll(c)
			c.Close()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the gate did not finish the flow within 10 s")
			}
			recs := f.records(t)
			if len(recs) != 1 || recs[0].Verdict != audit.Deny || recs[0].Reason != tc.reason {
				t.Fatalf("records %+v, want one denial: %s", recs, tc.reason)
			}
		})
	}
}
