package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/gate"
)

// maxInFlight bounds half-open handshakes, not connections: a SYN waits
// here while the gate decides and dials. 4096 keeps a SYN flood from the
// guest from growing without bound while being far above what real
// clients do (gvisor-tap-vsock's cap of 10 stalls npm).
const maxInFlight = 4096

// DefaultDNSQueries bounds concurrent DNS queries over UDP (a flood beyond
// it waits in the endpoint's receive buffer, and then is dropped by it),
// and again the DNS-over-TCP connections held at once (one beyond it is
// closed at once).
const DefaultDNSQueries = 64

// serve connects the stack to the gate: TCP SYNs to the forwarder and the
// gate, DNS on the gateway's port 53, every other datagram refused, ICMP
// echo answered only for allowed destinations. With no gate, every
// connection is refused and every datagram dropped: fail closed.
func (st *Stack) serve(ctx context.Context, g *gate.Gate) error {
	s := st.s
	if g == nil {
		s.SetTransportProtocolHandler(tcp.ProtocolNumber, func(stack.TransportEndpointID, *stack.PacketBuffer) bool { return false })
		s.SetTransportProtocolHandler(udp.ProtocolNumber, func(stack.TransportEndpointID, *stack.PacketBuffer) bool { return true })
		return nil
	}
	fwd := tcp.NewForwarder(s, 0, maxInFlight, func(r *tcp.ForwarderRequest) { st.forward(ctx, g, r) })
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, func(id stack.TransportEndpointID, pkt *stack.PacketBuffer) bool {
		// The cheap rejects, on the packet path: a SYN to an address in a
		// refused class is answered with a reset by the stack (returning
		// false), without a goroutine or a forwarder slot.
		if th := header.TCP(pkt.TransportHeader().Slice()); len(th) >= header.TCPMinimumSize &&
			th.Flags()&(header.TCPFlagSyn|header.TCPFlagAck) == header.TCPFlagSyn {
			// The gateway's own ports (reverse forwards, gateway.go)
			// are never the gate's to open.
			if handled, open := st.gatewaySYN(id); handled {
				return open && fwd.HandlePacket(id, pkt)
			}
			if g.Refuses(addrPort(id.LocalAddress, id.LocalPort)) {
				return false
			}
		}
		return fwd.HandlePacket(id, pkt)
	})

	s.SetTransportProtocolHandler(udp.ProtocolNumber, func(id stack.TransportEndpointID, _ *stack.PacketBuffer) bool {
		dst := addrPort(id.LocalAddress, id.LocalPort)
		if id.LocalPort == 53 || id.LocalPort == 853 {
			// DNS anywhere but the gateway, and DNS over TLS/QUIC:
			// dropped, so no resolver but the gate's is ever reached.
			g.DenyDatagram(dst, audit.ReasonDNSElsewhere)
			return true
		}
		g.DenyDatagram(dst, audit.ReasonUDP)
		return false // port unreachable: the guest fails fast
	})
	s.SetTransportProtocolHandler(icmp.ProtocolNumber4, func(id stack.TransportEndpointID, pkt *stack.PacketBuffer) bool {
		st.echo(g, pkt)
		return true
	})

	gw := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(Gateway.As4()), Port: 53}
	uc, err := gonet.DialUDP(s, &gw, nil, ipv4.ProtocolNumber)
	if err != nil {
		return fmt.Errorf("listening on the gateway's UDP port 53: %w", err)
	}
	tl, err := gonet.ListenTCP(s, gw, ipv4.ProtocolNumber)
	if err != nil {
		uc.Close()
		return fmt.Errorf("listening on the gateway's TCP port 53: %w", err)
	}
	go func() {
		<-ctx.Done()
		uc.Close()
		tl.Close()
	}()
	go st.serveDNSUDP(ctx, g, uc)
	go func() {
		tcpSlots := make(chan struct{}, st.dnsN)
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			select {
			case tcpSlots <- struct{}{}:
			default:
				st.dnsRefused(c)
				continue
			}
			go func() {
				defer func() { <-tcpSlots }()
				g.DNS().ServeTCP(ctx, c)
			}()
		}
	}()
	return nil
}

func (st *Stack) serveDNSUDP(ctx context.Context, g *gate.Gate, uc *gonet.UDPConn) {
	sem := make(chan struct{}, st.dnsN)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		buf := make([]byte, 4096)
		n, from, err := uc.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
				st.log.Warn("dns: reading", "err", err)
			}
			return
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if resp := g.DNS().Handle(ctx, buf[:n], false); resp != nil {
				uc.WriteTo(resp, from)
			}
		}()
	}
}

// dnsRefused closes a DNS-over-TCP connection beyond the bound, and says
// so in the log at most once every few seconds.
func (st *Stack) dnsRefused(c net.Conn) {
	c.Close()
	if now := time.Now().UnixNano(); now-st.dnsLogged.Load() > int64(logEvery) {
		st.dnsLogged.Store(now)
		st.log.Warn("dns: too many DNS-over-TCP connections at once, closing new ones", "max_dns_queries", st.dnsN)
	}
}

// logEvery spaces the log lines a guest's flood would repeat.
const logEvery = 10 * time.Second

// forward hands one SYN to the gate. The forwarder already runs it on a
// goroutine of its own, and keeps the guest's retransmitted SYNs out until
// Complete, so the gate can take the time to dial.
func (st *Stack) forward(ctx context.Context, g *gate.Gate, r *tcp.ForwarderRequest) {
	id := r.ID()
	var once sync.Once
	finish := func(reset bool) { once.Do(func() { r.Complete(reset) }) }
	defer finish(true) // a flow the gate neither accepted nor refused is refused
	if st.serveGateway(r, finish) {
		return
	}
	g.HandleTCP(ctx, gate.TCPFlow{
		Src: addrPort(id.RemoteAddress, id.RemotePort),
		Dst: addrPort(id.LocalAddress, id.LocalPort),
		Accept: func() (net.Conn, error) {
			var wq waiter.Queue
			ep, e := r.CreateEndpoint(&wq)
			if e != nil {
				finish(true)
				return nil, fmt.Errorf("completing the guest's handshake: %s", e)
			}
			finish(false)
			// Keepalive: a guest that vanishes mid-flow (killed process,
			// stopped sandbox) must not pin the upstream forever.
			ep.SocketOptions().SetKeepAlive(true)
			return newWindowed(gonet.NewTCPConn(&wq, ep), ep, st.win), nil
		},
		Refuse: func() { finish(true) },
	})
}

// echo answers an ICMP echo request from the guest when the gate allows
// its destination, as if the destination had answered. Everything else
// (other ICMP types, denied destinations) is dropped.
func (st *Stack) echo(g *gate.Gate, pkt *stack.PacketBuffer) {
	ih := header.IPv4(pkt.NetworkHeader().Slice())
	icmpb := pkt.TransportHeader().Slice()
	if len(ih) < header.IPv4MinimumSize || len(icmpb) < header.ICMPv4MinimumSize {
		return
	}
	if header.ICMPv4(icmpb).Type() != header.ICMPv4Echo {
		return
	}
	dst, src := ih.DestinationAddress(), ih.SourceAddress()
	if !g.Echo(netip.AddrFrom4(dst.As4())) {
		return
	}
	payload := pkt.Data().AsRange().ToSlice()
	reply := make([]byte, len(icmpb)+len(payload))
	copy(reply, icmpb)
	copy(reply[len(icmpb):], payload)
	h := header.ICMPv4(reply)
	h.SetType(header.ICMPv4EchoReply)
	h.SetChecksum(0)
	h.SetChecksum(^checksum.Checksum(reply, 0))

	r, err := st.s.FindRoute(nicID, dst, src, ipv4.ProtocolNumber, false)
	if err != nil {
		return
	}
	defer r.Release()
	ip := make([]byte, header.IPv4MinimumSize+len(reply))
	header.IPv4(ip).Encode(&header.IPv4Fields{
		TotalLength: uint16(len(ip)),
		TTL:         64,
		Protocol:    uint8(header.ICMPv4ProtocolNumber),
		SrcAddr:     dst,
		DstAddr:     src,
	})
	header.IPv4(ip).SetChecksum(^header.IPv4(ip).CalculateChecksum())
	copy(ip[header.IPv4MinimumSize:], reply)
	// Room for the link (Ethernet) header: without it the endpoint's
	// AddHeader panics, and a guest's ping would take the daemon down.
	out := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: int(r.MaxHeaderLength()),
		Payload:            buffer.MakeWithData(ip),
	})
	defer out.DecRef()
	r.WriteHeaderIncludedPacket(out)
}

func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	if a.Len() == 4 {
		return netip.AddrPortFrom(netip.AddrFrom4(a.As4()), port)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(a.As16()), port)
}
