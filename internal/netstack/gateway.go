package netstack

import (
	"fmt"
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// GatewayPorts serves the guest's TCP connections to the gateway's own
// ports other than DNS: the reverse port forwards (guest → host). The
// daemon fills it in. They are decided here, in the front end, and never
// by the gate: a connection to the gateway is a connection to the host,
// which no egress rule may open (docs/network.md, address classes).
type GatewayPorts interface {
	// Open is asked on the packet path for each SYN to the gateway's
	// port; false refuses it with a reset, and Open audits the refusal.
	// It must not block.
	Open(src netip.AddrPort, port uint16) bool
	// Serve takes a connection to the gateway's port that Open let
	// through. It completes the guest's handshake by calling accept, or
	// returns without calling it to have the guest reset (the host's port
	// did not answer, say): a guest then sees "connection refused", as it
	// would from a server that is down. It runs on the forwarder's
	// goroutine for that connection, so it may block for its whole life.
	Serve(src netip.AddrPort, port uint16, accept func() (net.Conn, error))
}

// SetGateway installs gp; nil leaves the gateway's ports to the gate's
// own refusal of the host's addresses. Safe to call while serving.
func (st *Stack) SetGateway(gp GatewayPorts) {
	if gp == nil {
		st.gw.Store(nil)
		return
	}
	st.gw.Store(&gp)
}

func (st *Stack) gateway() GatewayPorts {
	if p := st.gw.Load(); p != nil {
		return *p
	}
	return nil
}

var gatewayAddr = tcpip.AddrFrom4(Gateway.As4())

// gatewaySYN decides a SYN to the gateway on the packet path. handled
// says the gateway's ports are served here (a GatewayPorts is installed),
// and then open whether the forwarder takes the SYN or the stack resets
// it.
func (st *Stack) gatewaySYN(id stack.TransportEndpointID) (handled, open bool) {
	if id.LocalAddress != gatewayAddr {
		return false, false
	}
	gp := st.gateway()
	if gp == nil {
		return false, false
	}
	return true, gp.Open(addrPort(id.RemoteAddress, id.RemotePort), id.LocalPort)
}

// serveGateway hands a connection to a gateway port that Open let
// through to Serve, which completes the handshake or not. It reports false
// when no GatewayPorts is installed (the gate then decides, and refuses).
func (st *Stack) serveGateway(r *tcp.ForwarderRequest, finish func(reset bool)) bool {
	id := r.ID()
	if id.LocalAddress != gatewayAddr {
		return false
	}
	gp := st.gateway()
	if gp == nil {
		return false
	}
	gp.Serve(addrPort(id.RemoteAddress, id.RemotePort), id.LocalPort, func() (net.Conn, error) {
		var wq waiter.Queue
		ep, e := r.CreateEndpoint(&wq)
		if e != nil {
			finish(true)
			return nil, fmt.Errorf("completing the guest's handshake: %s", e)
		}
		finish(false)
		ep.SocketOptions().SetKeepAlive(true)
		return newWindowed(gonet.NewTCPConn(&wq, ep), ep, st.win), nil
	})
	return true
}
