package netstack

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"moat.dev/moat/internal/gate"
)

// conns is a gateway port that hands each connection it accepts to the
// test, as the gate's front end hands it to the gate.
type conns chan net.Conn

func (conns) Open(netip.AddrPort, uint16) bool { return true }

func (c conns) Serve(_ netip.AddrPort, _ uint16, accept func() (net.Conn, error)) {
	if conn, err := accept(); err == nil {
		c <- conn
	}
}

// guestConn connects the guest's stack to the gateway's port 7000 and
// returns its endpoint (to read its queues) and the daemon's end.
func guestConn(t *testing.T, gw *Stack, g *stack.Stack) (tcpip.Endpoint, *gonet.TCPConn, *windowed) {
	t.Helper()
	ch := make(conns, 1)
	gw.SetGateway(ch)
	var wq waiter.Queue
	ep, e := g.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if e != nil {
		t.Fatal(e)
	}
	// The guest's receive buffer is its own memory, not the daemon's:
	// a fixed size, so what it took is known.
	ep.SocketOptions().SetReceiveBufferSize(1<<20, true)
	we, notify := waiter.NewChannelEntry(waiter.WritableEvents)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)
	switch e := ep.Connect(tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(Gateway.As4()), Port: 7000}); e.(type) {
	case nil, *tcpip.ErrConnectStarted:
	default:
		t.Fatal(e)
	}
	select {
	case <-notify:
	case <-time.After(5 * time.Second):
		t.Fatal("the guest's connection was not established within 5 s")
	}
	var daemon net.Conn
	select {
	case daemon = <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the gateway did not hand over the connection within 5 s")
	}
	w, ok := daemon.(*windowed)
	if !ok {
		t.Fatalf("the daemon's end is a %T, not a windowed connection", daemon)
	}
	gc := gonet.NewTCPConn(&wq, ep)
	t.Cleanup(func() { gc.Close(); w.Close() })
	return ep, gc, w
}

func queued(t *testing.T, ep tcpip.Endpoint, opt tcpip.SockOptInt) int64 {
	t.Helper()
	v, e := ep.GetSockOptInt(opt)
	if e != nil {
		t.Fatal(e)
	}
	return int64(v)
}

// stall writes to c in small pieces until a write has been blocked for
// half a second, and returns what was written.
func stall(t *testing.T, c net.Conn) int64 {
	t.Helper()
	var n atomic.Int64
	go func() {
		buf := make([]byte, 4<<10)
		for {
			c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			k, err := c.Write(buf)
			n.Add(int64(k))
			if err != nil {
				return
			}
		}
	}()
	last, since := int64(-1), time.Now()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if v := n.Load(); v != last {
			last, since = v, time.Now()
		} else if time.Since(since) > 500*time.Millisecond {
			return v
		}
	}
	t.Fatalf("the writer never stalled: %d bytes written", n.Load())
	return 0
}

// TestStalledGuestHoldsTheSmallWindow: toward a guest that does not read,
// the daemon's stack takes at most windowSmall beyond what the guest's own
// buffer took, and then the writer (the gate, copying from upstream)
// blocks: backpressure instead of buffering. With the stack's former 4 MiB
// send buffer it held 4 MiB.
func TestStalledGuestHoldsTheSmallWindow(t *testing.T) {
	gw, g, _ := pairGate(t, gate.New(gate.Options{Sandbox: "test"}))
	ep, _, w := guestConn(t, gw, g)
	written := stall(t, w)
	inGuest := queued(t, ep, tcpip.ReceiveQueueSizeOption)
	held := written - inGuest
	t.Logf("written %d KiB, in the guest's buffer %d KiB, held by the daemon %d KiB", written>>10, inGuest>>10, held>>10)
	if held > windowSmall {
		t.Errorf("the daemon holds %d KiB for a guest that does not read, want at most %d KiB", held>>10, windowSmall>>10)
	}
	if inGuest == 0 {
		t.Errorf("nothing reached the guest: the test did not carry data")
	}
}

// TestUnreadUploadHoldsTheSmallWindow: from a guest writing to a daemon end
// that does not read (an upstream that stopped reading), the daemon's
// stack takes at most windowSmall and the guest's writes then block.
func TestUnreadUploadHoldsTheSmallWindow(t *testing.T) {
	gw, g, _ := pairGate(t, gate.New(gate.Options{Sandbox: "test"}))
	_, gc, w := guestConn(t, gw, g)
	written := stall(t, gc)
	held := queued(t, w.ep, tcpip.ReceiveQueueSizeOption)
	t.Logf("the guest wrote %d KiB, the daemon holds %d KiB unread", written>>10, held>>10)
	if held > windowSmall {
		t.Errorf("the daemon holds %d KiB from a guest it does not read, want at most %d KiB", held>>10, windowSmall>>10)
	}
	if held == 0 {
		t.Errorf("nothing reached the daemon: the test did not carry data")
	}
}

// TestBulkWindowsComeFromTheBudget: a connection that has carried
// first step's bytes toward the guest gets its window while the budget has
// room, and a second one, with the budget spent, keeps windowSmall; the
// budget comes back when the first closes.
func TestBulkWindowsComeFromTheBudget(t *testing.T) {
	first := steps[0]
	gw, g, _ := pairOptions(t, Options{Gate: gate.New(gate.Options{Sandbox: "test"}), WindowBudget: first.window - windowSmall})
	bulk := func() (*windowed, *gonet.TCPConn) {
		_, gc, w := guestConn(t, gw, g)
		done := make(chan struct{})
		go func() {
			defer close(done)
			io.CopyN(io.Discard, gc, first.after+(64<<10))
		}()
		buf := make([]byte, 64<<10)
		for sent := int64(0); sent < first.after+(64<<10); sent += int64(len(buf)) {
			w.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := w.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		<-done
		return w, gc
	}
	sndBuf := func(w *windowed) int64 { return w.ep.SocketOptions().GetSendBufferSize() }
	one, _ := bulk()
	second, _ := bulk()
	if got := sndBuf(one); got != first.window {
		t.Errorf("the first bulk connection's send buffer is %d KiB, want %d KiB", got>>10, first.window>>10)
	}
	if got := sndBuf(second); got != windowSmall {
		t.Errorf("the second, with the budget spent: %d KiB, want %d KiB", got>>10, windowSmall>>10)
	}
	one.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for ctx.Err() == nil && gw.win.left.Load() != first.window-windowSmall {
		time.Sleep(10 * time.Millisecond)
	}
	if left := gw.win.left.Load(); left != first.window-windowSmall {
		t.Errorf("after the first closed, the budget has %d bytes left, want %d", left, first.window-windowSmall)
	}
	second.SetWriteDeadline(time.Now().Add(5 * time.Second))
	second.Write([]byte("x"))
	if got := sndBuf(second); got != first.window {
		t.Errorf("the second, once the budget came back: %d KiB, want %d KiB", got>>10, first.window>>10)
	}
}
