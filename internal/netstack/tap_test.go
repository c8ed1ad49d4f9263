package netstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"moat.dev/moat/internal/gate"
)

var guestMAC = tcpip.LinkAddress("\x02\x00\x00\x00\x00\x02")

// pair serves a Stack on one end of a socket pair, which keeps frame
// boundaries as a TAP fd does, and puts a second gVisor stack on the
// other end in the guest's place, configured as runsc configures the
// guest's: same addresses, checksums neither computed nor checked.
func pair(t *testing.T) (*Stack, *stack.Stack, int) {
	t.Helper()
	return pairGate(t, nil)
}

// pairGate is pair with the stack serving g.
func pairGate(t *testing.T, g *gate.Gate) (*Stack, *stack.Stack, int) {
	t.Helper()
	return pairOptions(t, Options{Gate: g})
}

// pairOptions is pair with the stack's options (TAPFD and Log are set here).
func pairOptions(t *testing.T, o Options) (*Stack, *stack.Stack, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Room for a burst of 64 KiB frames, as the guest's AF_PACKET socket has.
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	o.TAPFD, o.Log = fds[0], slog.New(slog.DiscardHandler)
	gw, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)

	ep, err := fdbased.New(&fdbased.Options{
		FDs: []int{fds[1]}, MTU: MTU, EthernetHeader: true, Address: guestMAC,
		RXChecksumOffload: true, TXChecksumOffload: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	guest := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol},
	})
	t.Cleanup(func() { guest.Close(); guest.Wait(); unix.Close(fds[1]) })
	if e := guest.CreateNIC(1, ep); e != nil {
		t.Fatal(e)
	}
	if e := guest.AddProtocolAddress(1, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(Guest.As4()), PrefixLen: PrefixLen},
	}, stack.AddressProperties{}); e != nil {
		t.Fatal(e)
	}
	sub, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{}), tcpip.MaskFromBytes(make([]byte, 4)))
	guest.SetRouteTable([]tcpip.Route{{Destination: sub, Gateway: tcpip.AddrFrom4(Gateway.As4()), NIC: 1}})
	guest.AddStaticNeighbor(1, ipv4.ProtocolNumber, tcpip.AddrFrom4(Gateway.As4()), GatewayMAC)
	return gw, guest, fds[1]
}

// TestTAPCarriesBothWays moves a few MiB each way over one connection the
// gateway opens to the guest (as the daemon does for the guest's agent):
// full-size frames go through the poller-driven reader and the writes.
func TestTAPCarriesBothWays(t *testing.T) {
	gw, g, _ := pair(t)
	ln, err := gonet.ListenTCP(g, tcpip.FullAddress{NIC: 1, Port: 22}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	data := make([]byte, 8<<20)
	rand.Read(data)
	echoed := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			echoed <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c)
		echoed <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := gw.DialGuest(ctx, 22)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	go func() {
		c.Write(data)
		c.(*gonet.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("echoed %d bytes, want the %d sent", len(got), len(data))
	}
	if err := <-echoed; err != nil {
		t.Fatal(err)
	}
}

// TestTAPRefusesFast: with no gate every connection is refused from the
// packet path, and the guest hears it at once, not after a timeout.
func TestTAPRefusesFast(t *testing.T) {
	_, g, _ := pair(t)
	for i := 0; i < 20; i++ {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := gonet.DialContextTCP(ctx, g, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4([4]byte{198, 51, 100, 1}), Port: 80}, ipv4.ProtocolNumber)
		cancel()
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) && !bytes.Contains([]byte(err.Error()), []byte("refused")) {
			t.Fatalf("dial: %v, want connection refused", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("refusal took %v", d)
		}
	}
}

// TestTAPSurvivesStrayFrames: frames the stack must not take (another
// destination MAC, a runt, garbage) are dropped one by one; the reader
// keeps going. (fdbased's readv dispatcher stops for good on the first
// frame addressed to another MAC.)
func TestTAPSurvivesStrayFrames(t *testing.T) {
	gw, g, fd := pair(t)
	eth := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize)
	header.Ethernet(eth).Encode(&header.EthernetFields{SrcAddr: guestMAC, DstAddr: "\x02\x99\x99\x99\x99\x99", Type: header.IPv4ProtocolNumber})
	for _, f := range [][]byte{eth, {1, 2, 3}, bytes.Repeat([]byte{0xff}, 200)} {
		if _, err := unix.Write(fd, f); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := gonet.ListenTCP(g, tcpip.FullAddress{NIC: 1, Port: 22}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := gw.DialGuest(ctx, 22)
	if err != nil {
		t.Fatalf("after stray frames: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "ok" {
		t.Fatalf("read %q, %v", b, err)
	}
}

// closingPorts is a gateway port that says hello and closes first, as the
// gate does when the upstream closes (a plain-HTTP answer).
type closingPorts struct{}

func (closingPorts) Open(netip.AddrPort, uint16) bool { return true }

func (closingPorts) Serve(_ netip.AddrPort, _ uint16, accept func() (net.Conn, error)) {
	if c, err := accept(); err == nil {
		c.Write([]byte("hi"))
		c.Close()
	}
}

// TestReconnectFromTheSamePort: a connection the gateway closed first
// stays in its TIME_WAIT, and the guest, which closed second, may connect
// from the same port again at once. Its SYN must get through by its first
// retransmission (1 s), not wait out the TIME_WAIT (gVisor's default is
// 60 s: a SYN that finds a TIME_WAIT endpoint goes only to a listener,
// and the gate has a forwarder).
func TestReconnectFromTheSamePort(t *testing.T) {
	gw, g, _ := pairGate(t, gate.New(gate.Options{Sandbox: "test"}))
	gw.SetGateway(closingPorts{})
	local := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(Guest.As4()), Port: 40000}
	remote := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(Gateway.As4()), Port: 7000}
	for i := 0; i < 3; i++ {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var c *gonet.TCPConn
		var err error
		// The guest's end of the last connection may still be finishing
		// its close (LAST_ACK): the port is then briefly in use.
		for {
			c, err = gonet.DialTCPWithBind(ctx, g, local, remote, ipv4.ProtocolNumber)
			if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "in use") {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		if err != nil {
			t.Fatalf("connection %d from port %d: %v after %v", i+1, local.Port, err, time.Since(start))
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(b) != "hi" {
			t.Fatalf("connection %d: read %q, %v", i+1, b, err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("connection %d from the same port took %v", i+1, d)
		}
	}
}
