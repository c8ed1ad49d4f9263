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
// starts with a small window and one that has moved enough bytes one way
// gets larger ones in that direction (steps), while the sandbox's window
// budget lasts. The daemon then holds at most connections × windowSmall
// per direction plus the budget.
const (
	// windowSmall: a request, an answer of a few hundred KiB and an
	// idle connection never need more. A 256 KiB window for every
	// connection halved a 1 GiB download's speed (docs: backpressure).
	windowSmall = 128 << 10
	// windowBulk is the largest window: the 16 MiB gVisor's tuning gave
	// a download before windows were budgeted. With 4 MiB a download
	// through the gate was a fifth slower.
	windowBulk = 16 << 20
	// DefaultWindowBudget is the budget when the daemon sets none: four
	// downloads at full speed.
	DefaultWindowBudget = 4 * (windowBulk - windowSmall)
)

// steps are the windows a direction grows to, each once it has moved
// after bytes: the first step comes after more than a request or a small
// answer, the last after more than a guest that stopped reading lets
// through (its own receive buffer, 4 MiB by default, and the first step),
// so connections whose guest stalls take at most the first step's bytes
// from the budget.
var steps = []struct{ after, window int64 }{
	{2 << 20, 4 << 20},
	{16 << 20, windowBulk},
}

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

	rcv, snd direction // owned by the reader and the writer

	// mu guards the grants against Close, which gives them back.
	mu      sync.Mutex
	closed  bool
	granted int64
}

// direction is one way's count and window.
type direction struct {
	moved  int64
	step   int   // the next step to ask for
	window int64 // the window now
}

// newWindowed pins ep's buffers at the small window. The receive window
// was scaled at the handshake for the stack's largest (windowBulk), so it
// can grow later; setting a size turns off gVisor's own tuning of both,
// which would grow any connection's buffers without the budget.
func newWindowed(c *gonet.TCPConn, ep tcpip.Endpoint, b *budget) *windowed {
	ep.SocketOptions().SetSendBufferSize(windowSmall, true)
	ep.SocketOptions().SetReceiveBufferSize(windowSmall, true)
	return &windowed{TCPConn: c, ep: ep, b: b,
		rcv: direction{window: windowSmall}, snd: direction{window: windowSmall}}
}

// grow moves d to its next step if it has moved enough and the budget has
// room.
func (w *windowed) grow(d *direction, set func(int64, bool)) {
	if d.step >= len(steps) || d.moved < steps[d.step].after {
		return
	}
	next := steps[d.step].window
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || !w.b.take(next-d.window) {
		return
	}
	w.granted += next - d.window
	d.window = next
	d.step++
	set(next, true)
}

func (w *windowed) Read(p []byte) (int, error) {
	n, err := w.TCPConn.Read(p)
	w.rcv.moved += int64(n)
	w.grow(&w.rcv, w.ep.SocketOptions().SetReceiveBufferSize)
	return n, err
}

func (w *windowed) Write(p []byte) (int, error) {
	w.grow(&w.snd, w.ep.SocketOptions().SetSendBufferSize)
	n, err := w.TCPConn.Write(p)
	w.snd.moved += int64(n)
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
