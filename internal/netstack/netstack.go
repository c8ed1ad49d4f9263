// Package netstack is the packet front end of the egress gate: gVisor's
// userspace TCP/IP stack served on the TAP device that is the sandbox's only
// network interface.
//
// The guest's kernel (gVisor's Sentry) sends Ethernet frames into its tap0;
// they come out of the TAP file descriptor the daemon holds, and this stack
// is the only thing that reads them. Nothing is routed by the host kernel:
// every connection the guest opens ends here, in a process the guest cannot
// touch, and is either refused or handed to the gate's decision (the
// Handler). The stack also carries the daemon's own connections into the
// guest (the SSH agent, port forwards), which is why it has an address of
// its own, the guest's gateway.
package netstack

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"moat.dev/moat/internal/gate"
)

// The sandbox's addressing. Every sandbox has the same addresses: each lives
// in its own network namespace and talks only to its own daemon, so they
// never meet (threat model 21).
var (
	Gateway   = netip.MustParseAddr("10.88.0.1")
	Guest     = netip.MustParseAddr("10.88.0.2")
	PrefixLen = 24
)

// MTU of tap0: the gate sizes its copy buffers by it.
const MTU = gate.TapMTU

// GatewayMAC is the link address the stack answers ARP with.
const GatewayMAC = tcpip.LinkAddress("\x02\x6d\x6f\x61\x74\x01")

const nicID tcpip.NICID = 1

// Stack is one sandbox's network stack.
type Stack struct {
	s    *stack.Stack
	log  *slog.Logger
	link *tapLink
	win  *budget
	dnsN int
	// dnsLogged: when the last refused DNS-over-TCP connection was logged.
	dnsLogged atomic.Int64
	gw        atomic.Pointer[GatewayPorts] // the reverse forwards (gateway.go); nil: none
}

// Options configure New.
type Options struct {
	TAPFD int          // the TAP device's fd, owned by the stack from now on
	Gate  *gate.Gate   // nil: refuse every connection, drop every datagram
	Log   *slog.Logger // required
	// Ctx bounds the gate's flows: when it ends, the DNS servers stop.
	Ctx context.Context
	// WindowBudget is the bytes of bulk windows beyond the small ones
	// that the guest's connections may hold at once (window.go); 0:
	// DefaultWindowBudget.
	WindowBudget int64
	// DNSQueries bounds the DNS queries the gateway answers at once over
	// UDP, and again the DNS-over-TCP connections it holds; 0:
	// DefaultDNSQueries.
	DNSQueries int
}

// New serves a stack on the TAP fd.
func New(o Options) (*Stack, error) {
	link, err := newTAPLink(o.TAPFD)
	if err != nil {
		return nil, err
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
		HandleLocal:        false,
	})
	if o.WindowBudget <= 0 {
		o.WindowBudget = DefaultWindowBudget
	}
	if o.DNSQueries <= 0 {
		o.DNSQueries = DefaultDNSQueries
	}
	st := &Stack{s: s, log: o.Log, link: link, win: newBudget(o.WindowBudget), dnsN: o.DNSQueries}
	if err := st.configure(); err != nil {
		st.Close()
		return nil, err
	}
	if o.Ctx == nil {
		o.Ctx = context.Background()
	}
	if err := st.serve(o.Ctx, o.Gate); err != nil {
		st.Close()
		return nil, err
	}
	if err := link.start(func(err error) { o.Log.Warn("tap: reading", "err", err) }); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// configure sets up the NIC, the gateway's address and the stack's options.
func (st *Stack) configure() error {
	s, link := st.s, st.link
	if e := s.CreateNIC(nicID, link); e != nil {
		return fmt.Errorf("creating nic: %s", e)
	}
	// Promiscuous + spoofing: the stack accepts packets for any destination
	// and can answer as that destination, which is how a connection to an
	// arbitrary outside address ends up in our forwarder.
	if e := s.SetPromiscuousMode(nicID, true); e != nil {
		return fmt.Errorf("setting promiscuous mode: %s", e)
	}
	if e := s.SetSpoofing(nicID, true); e != nil {
		return fmt.Errorf("setting spoofing: %s", e)
	}
	addr := tcpip.AddrFrom4(Gateway.As4())
	if e := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: addr, PrefixLen: PrefixLen},
	}, stack.AddressProperties{}); e != nil {
		return fmt.Errorf("adding gateway address: %s", e)
	}
	sub, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{}), tcpip.MaskFromBytes(make([]byte, 4)))
	s.SetRouteTable([]tcpip.Route{{Destination: sub, NIC: nicID}})
	// SACK and large windows: the guest↔gateway path is a memory copy,
	// throughput is bounded by the window, not by loss. The gate's
	// connections are pinned at windowSmall when accepted and grow to
	// windowBulk from the sandbox's budget (window.go); the stack's own
	// sizes are for the rest (the daemon's connections into the guest),
	// and its largest receive buffer sets the window scale every
	// connection agrees at its handshake, so windowBulk fits later. With
	// 1 MiB a download stalled on the window between two stacks that each
	// wake up late on a shared two-core host; 4 MiB, and the guest's own
	// tcp_rmem and tcp_wmem raised to match (guest init), made it 20-30%
	// faster here.
	sack := tcpip.TCPSACKEnabled(true)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: windowBulk, Max: windowBulk}
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &snd)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: windowSmall, Max: windowBulk}
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &rcv)
	mod := tcpip.TCPModerateReceiveBufferOption(true)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &mod)
	tw := tcpip.TCPTimeWaitTimeoutOption(timeWait)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &tw)
	return nil
}

// timeWait is how long the stack keeps a connection it closed first in
// TIME_WAIT (gVisor's default is 60 s). The gate closes first whenever the
// upstream does (a plain-HTTP answer: the gate adds Connection: close) and
// when it drops a connection that never sent what it waits for, and the
// guest, which closed second, may pick the same port again at once. A SYN
// that reaches a TIME_WAIT endpoint goes to a listener bound to its
// address if there is one, and is dropped otherwise: the gate takes SYNs
// through its forwarder, not a listener, so that connection waited out the
// whole TIME_WAIT (after a flood of connections the gate closed, 15 of 400
// fetches from the guest hung). On tap0 nothing arrives late: a segment is
// delivered in order or lost, so half a second still outlasts a
// retransmitted FIN (the guest's minimum RTO is 200 ms), and a SYN dropped
// meanwhile is sent again after the guest's first RTO of 1 s, by when the
// endpoint is gone.
const timeWait = 500 * time.Millisecond

// DialGuest opens a TCP connection from the gateway to the guest's port.
func (st *Stack) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	c, err := gonet.DialContextTCP(ctx, st.s, tcpip.FullAddress{
		NIC:  nicID,
		Addr: tcpip.AddrFrom4(Guest.As4()),
		Port: port,
	}, ipv4.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("dialing guest port %d: %w", port, err)
	}
	return c, nil
}

// Stack exposes the underlying gVisor stack to the gate.
func (st *Stack) Stack() *stack.Stack { return st.s }

// Close tears the stack down and closes the TAP fd.
func (st *Stack) Close() {
	st.s.Close()
	st.s.Wait()
	st.link.close()
}
