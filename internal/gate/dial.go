package gate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"moat.dev/moat/internal/audit"
)

// dialError says why no upstream could be reached. refusedClass is set when
// addresses were skipped because of their class, so the audit can tell a
// denial (rebinding to a private address) from an outage.
type dialError struct {
	name         string
	refusedClass string
	err          error
}

func (e *dialError) Error() string {
	what := e.name
	if what != "" {
		what += ": "
	}
	if e.err == nil && e.refusedClass != "" {
		return what + "every address is in a refused class (" + e.refusedClass + ")"
	}
	return what + e.err.Error()
}

func (e *dialError) Unwrap() error { return e.err }

// errRefusedAtDial is returned by the dialer's Control hook.
var errRefusedAtDial = errors.New("address refused at dial time")

// dialTarget resolves the target if it is a name, drops addresses in
// refused classes, and dials the first that answers. Every dial has a
// deadline, and the class check runs again inside the dial itself
// (net.Dialer.Control), on the exact address the socket connects to, so
// nothing between the check and the connect can change the answer.
func (g *Gate) dialTarget(ctx context.Context, tg target, t *tcpTrace) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, g.o.DialTimeout)
	defer cancel()
	addrs := []netip.Addr{tg.addr}
	if tg.name != "" {
		if g.o.Resolver == nil {
			return nil, &dialError{name: tg.name, err: errors.New("no resolver")}
		}
		a, _, err := g.o.Resolver.LookupA(ctx, tg.name)
		if err != nil {
			return nil, &dialError{name: tg.name, err: fmt.Errorf("resolving: %w", err)}
		}
		addrs = a
	}
	var refused []string
	var lastErr error
	for _, a := range addrs {
		if class, sp := g.special(a, tg.port); sp {
			refused = append(refused, a.String()+" "+string(class))
			continue
		}
		c, err := g.dialer(tg.port).DialContext(ctx, "tcp4", netip.AddrPortFrom(a, tg.port).String())
		if err == nil {
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	de := &dialError{name: tg.name, err: lastErr}
	if len(refused) > 0 {
		de.refusedClass = strings.Join(refused, ", ")
		if lastErr == nil {
			t.rec.Reason = audit.ReasonRefusedClass
		}
	}
	if de.err == nil && de.refusedClass == "" {
		de.err = errors.New("no address")
	}
	return nil, de
}

// dialer returns a dialer whose Control refuses, at connect time, any
// address in a refused class that no address rule opens.
func (g *Gate) dialer(port uint16) *net.Dialer {
	return &net.Dialer{
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s", errRefusedAtDial, address)
			}
			if class, sp := g.special(ap.Addr().Unmap(), port); sp {
				return fmt.Errorf("%w: %s is %s", errRefusedAtDial, ap.Addr(), class)
			}
			return nil
		},
	}
}

// HostAddrs lists the host's own interface addresses.
func HostAddrs() []netip.Addr {
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range ifs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}
