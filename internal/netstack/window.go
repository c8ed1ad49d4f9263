package netstack

import (
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
)

// Window sizes of the guest's connections through the gate.
//
// What a connection's buffers hold is what one side wrote and the other
// has not read: toward the guest, the send buffer fills when the guest
// stops reading (its own receive buffer is full), and the gate stops
// reading upstream once its write blocks; from the guest, the receive
// buffer fills when the upstream stops reading. So the buffer sizes are
// the bytes the daemon holds for a connection whose reader stalls, and a
// guest can stall a thousand of them on purpose. Large windows are what
// makes a download through the gate fast (the guest↔gateway path is a
// memory copy, bounded by the window, not by loss), so every connection
// starts with a small window and a connection that has moved bulkAfter
// bytes one way gets a large one in that direction, while the sandbox's
// window budget lasts. The daemon then holds at most
// connections × windowSmall per direction plus the budget.
const (
	// windowSmall: a request, an answer of a few hundred KiB and an
	// idle connection never need more. A 256 KiB window for every
	// connection halved a 1 GiB download's speed (docs: backpressure).
	windowSmall = 128 << 10
	// windowBulk is a bulk transfer's window: the 4 MiB the stack had
	// by default before windows were budgeted, which kept the download
	// speed.
	windowBulk = 4 << 20
	// bulkAfter is how much a connection moves one way before it asks
	// for windowBulk in that direction: more than a request or a small
	// answer, less than what makes the small window's cost show.
	bulkAfter = 2 << 20
	// DefaultWindowBudget is the budget when the daemon sets none: 16
	// bulk transfers at once.
	DefaultWindowBudget = 16 * (windowBulk - windowSmall)
)

// budget is the bytes of bulk windows beyond the small ones that a
// sandbox's connections may hold at once.
type budget struct{ left atomic.Int64 }

func newBudget(bytes int64) *budget {
	b := &budget{}
	b.left.Store(bytes)
	return b
}

// take reserves n bytes, or reports that fewer are left.
func (b *budget) take(n int64) bool {
	for {
		l := b.left.Load()
		if l < n {
			return false
		}
		if b.left.CompareAndSwap(l, l-n) {
			return true
		}
	}
}

func (b *budget) give(n int64) { b.left.Add(n) }

// windowed is a guest connection whose windows start small and grow from
// the budget once it carries bulk. Read and Write are each called from one
// goroutine (the gate copies each direction on its own), Close from
// either.
type windowed struct {
	*gonet.TCPConn
	ep tcpip.Endpoint
	b  *budget

	read, written int64 // owned by the reader and the writer
	rcvOK, sndOK  bool  // the direction has its bulk window; owned likewise

	// mu guards the grants against Close, which gives them back.
	mu      sync.Mutex
	closed  bool
	granted int64
}

// newWindowed pins ep's buffers at the small window. The receive window
// was scaled at the handshake for the stack's largest (windowBulk), so it
// can grow later; setting a size turns off gVisor's own tuning of both,
// which would grow any connection's buffers without the budget.
func newWindowed(c *gonet.TCPConn, ep tcpip.Endpoint, b *budget) *windowed {
	ep.SocketOptions().SetSendBufferSize(windowSmall, true)
	ep.SocketOptions().SetReceiveBufferSize(windowSmall, true)
	return &windowed{TCPConn: c, ep: ep, b: b}
}

// grow gives one direction the bulk window if the budget has room, and
// reports whether it did.
func (w *windowed) grow(set func(int64, bool)) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || !w.b.take(windowBulk-windowSmall) {
		return false
	}
	w.granted += windowBulk - windowSmall
	set(windowBulk, true)
	return true
}

func (w *windowed) Read(p []byte) (int, error) {
	n, err := w.TCPConn.Read(p)
	w.read += int64(n)
	if w.read >= bulkAfter && !w.rcvOK {
		w.rcvOK = w.grow(w.ep.SocketOptions().SetReceiveBufferSize)
	}
	return n, err
}

func (w *windowed) Write(p []byte) (int, error) {
	if w.written >= bulkAfter && !w.sndOK {
		w.sndOK = w.grow(w.ep.SocketOptions().SetSendBufferSize)
	}
	n, err := w.TCPConn.Write(p)
	w.written += int64(n)
	return n, err
}

// Close gives the bulk windows back to the budget.
func (w *windowed) Close() error {
	err := w.TCPConn.Close()
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		w.b.give(w.granted)
		w.granted = 0
	}
	w.mu.Unlock()
	return err
}
