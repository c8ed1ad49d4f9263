package forward

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
)

// What both front ends that hold forwards share: the gVisor sandbox's
// daemon (internal/daemon) and the Docker runtime's forwarder
// (internal/dockerrt/engine), so that a forward behaves, lists and
// changes the same on either.

// ApplyChange changes the runtime forwards rt (the record's) as ch says,
// against the configuration cfg of the sandbox named sandbox.
func ApplyChange(rt *state.RuntimeForwards, cfg config.Config, sandbox string, ch control.ForwardChange) error {
	fw, pair, err := Parse(ch.Spec)
	if err != nil {
		return err
	}
	switch ch.Op {
	case "add":
		if fw.Address, err = CheckAddress(ch.Address); err != nil {
			return err
		}
		if ch.Reverse {
			// A host-local MCP server's port: a forward would reach it
			// around the gate's rules for its calls.
			if err := CheckMCP(cfg.Network.MCP, fw); err != nil {
				return err
			}
		}
		return Add(rt, cfg.Forwards, sandbox, ch.Reverse, fw)
	case "remove":
		_, err := Remove(rt, cfg.Forwards, sandbox, ch.Reverse, fw, pair)
		return err
	}
	return fmt.Errorf("%w: unknown operation %q: use add or remove", ErrSpec, ch.Op)
}

// Wire is an entry in the control API's form. gateway is where the
// guest reaches a reverse forward.
func Wire(e Entry, status, why string, gateway netip.Addr) control.Forward {
	w := control.Forward{Host: e.Host, Guest: e.Guest, Spec: e.Spec(), Source: e.Source, Status: status, Error: why}
	if e.Reverse {
		w.Direction = control.ToHost
		w.Listen = netip.AddrPortFrom(gateway, e.Guest).String()
		w.Target = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), e.Host).String()
	} else {
		w.Direction = control.ToGuest
		w.Listen = net.JoinHostPort(e.ListenAddress(), strconv.Itoa(int(e.Host)))
		w.Target = "guest:" + strconv.Itoa(int(e.Guest))
	}
	return w
}

// NextPort is the port to suggest when p is taken.
func NextPort(p uint16) uint16 {
	if p == 65535 {
		return 1024
	}
	return p + 1
}

// Held is one listening forward and its open connections, closed
// together when the forward is removed: a removed forward is gone, not
// half there until its last client leaves.
type Held struct {
	Entry Entry
	Ln    net.Listener

	mu    sync.Mutex
	conns map[net.Conn]struct{} // nil once closed
}

// NewHeld holds e's listener ln.
func NewHeld(e Entry, ln net.Listener) *Held {
	return &Held{Entry: e, Ln: ln, conns: map[net.Conn]struct{}{}}
}

// Track adds c to the connections Close closes; false once closed.
func (h *Held) Track(c net.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns == nil {
		return false
	}
	h.conns[c] = struct{}{}
	return true
}

// Untrack forgets c.
func (h *Held) Untrack(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.conns, c)
}

// Close stops the listener and cuts the forward's connections.
func (h *Held) Close() {
	h.Ln.Close()
	h.mu.Lock()
	conns := h.conns
	h.conns = nil
	h.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// Join copies both ways until both sides have finished, passing on each
// side's EOF as a half-close, so protocols that shut down their writing
// side first (an HTTP/1.0 client, `nc -N`) still get their answer. An
// error on either side (a reset) ends both. It returns the bytes a→b and
// b→a.
func Join(a, b net.Conn) (ab, ba int64) {
	var wg sync.WaitGroup
	var once sync.Once
	cut := func() { once.Do(func() { a.Close(); b.Close() }) }
	half := func(dst, src net.Conn, n *int64) {
		defer wg.Done()
		var err error
		*n, err = io.Copy(dst, src)
		if err != nil {
			cut()
			return
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
		cut()
	}
	wg.Add(2)
	go half(b, a, &ab)
	go half(a, b, &ba)
	wg.Wait()
	cut()
	return ab, ba
}
