package forward

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
)

// records collects audit records, as the daemon's log or the Docker
// forwarder's would.
type records struct {
	mu  sync.Mutex
	got []audit.Record
}

func (r *records) add(rec audit.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, rec)
}

// wait returns the records once there are n, or after 5 s.
func (r *records) wait(n int) []audit.Record {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		if len(r.got) >= n {
			defer r.mu.Unlock()
			return append([]audit.Record(nil), r.got...)
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Record(nil), r.got...)
}

// echoServer stands for a port of the guest or the host: it writes
// "hi", then echoes until its client closes. It returns its port.
func echoServer(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				io.WriteString(c, "hi")
				io.Copy(c, c)
			}()
		}
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func freeHostPort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// The guest here is the host's loopback: the listeners do not know how
// their Dial reaches it, which is the point.
func TestListeners(t *testing.T) {
	guestPort := echoServer(t)
	closedGuest := freeHostPort(t)
	var recs records
	var d net.Dialer
	guest := netip.MustParseAddr("10.88.0.2")
	l := NewListeners(context.Background(), "box", guest, func(ctx context.Context, port uint16) (net.Conn, error) {
		return d.DialContext(ctx, "tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port).String())
	}, recs.add, slog.New(slog.DiscardHandler))
	defer l.Close()
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := uint16(busy.Addr().(*net.TCPAddr).Port)
	ok := Entry{Forward: state.Forward{Host: freeHostPort(t), Guest: guestPort}}
	dead := Entry{Forward: state.Forward{Host: freeHostPort(t), Guest: closedGuest}}
	taken := Entry{Forward: state.Forward{Host: busyPort, Guest: guestPort}}
	rev := Entry{Reverse: true, Forward: state.Forward{Host: 1, Guest: 2}}
	l.Sync([]Entry{ok, dead, taken, rev})

	if st, why := l.Status(taken); st != "error" || !strings.Contains(why, "already in use") || !strings.Contains(why, "moat forward add box") {
		t.Errorf("Status of a forward on a busy port = %q, %q; want error naming the port and the next command", st, why)
	}
	if st, _ := l.Status(ok); st != "listening" {
		t.Errorf("Status of a listening forward = %q", st)
	}

	c, err := net.Dial("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ok.Host).String())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("through the forward: %q, %v", buf, err)
	}
	io.WriteString(c, "abc")
	io.ReadFull(c, make([]byte, 3))
	c.Close()
	got := recs.wait(1)
	if len(got) != 1 {
		t.Fatalf("records after one connection: %+v", got)
	}
	want := audit.Record{Proto: "tcp", Dst: netip.AddrPortFrom(guest, guestPort).String(), Verdict: audit.Allow,
		Rule: "forward " + ok.Spec(), Reason: audit.ReasonForward, Upstream: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ok.Host).String(),
		BytesUp: 5, BytesDown: 3}
	r := got[0]
	r.Time, r.DurationMS = time.Time{}, 0
	if r.Dst != want.Dst || r.Rule != want.Rule || r.Reason != want.Reason || r.Upstream != want.Upstream || r.Verdict != want.Verdict ||
		r.BytesUp != want.BytesUp || r.BytesDown != want.BytesDown {
		t.Errorf("record = %+v\nwant %+v", r, want)
	}

	// A guest port nobody listens on: the client is closed, and the
	// failure is recorded.
	c, err = net.Dial("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), dead.Host).String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if n, _ := c.Read(buf); n != 0 {
		t.Errorf("read %d bytes from a forward to a closed guest port", n)
	}
	c.Close()
	if got := recs.wait(2); len(got) != 2 || !got[1].Reason.Is(audit.ReasonForward) || got[1].Reason == audit.ReasonForward {
		t.Errorf("records after a failed dial: %+v; want the second to say the guest's port did not answer", got)
	}

	// Removed: the listener and its open connections go.
	c, err = net.Dial("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ok.Host).String())
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(c, buf)
	l.Sync(nil)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var ne net.Error
	if _, err := c.Read(buf); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("a connection of a removed forward was not cut: %v", err)
	}
	c.Close()
	if st, _ := l.Status(ok); st != "stopped" {
		t.Errorf("Status of a removed forward = %q, want stopped", st)
	}
}

func TestServeReverse(t *testing.T) {
	hostPort := echoServer(t)
	gw := netip.MustParseAddr("10.88.0.1")
	var recs records
	guest, mine := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeReverse(context.Background(), ReverseConn{Gateway: gw, Port: 5432, HostPort: hostPort,
			Accept: func() (net.Conn, error) { return mine, nil },
			Hold:   func(net.Conn) (func(), bool) { return func() {}, true }, Audit: recs.add})
	}()
	buf := make([]byte, 2)
	guest.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(guest, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("through the reverse forward: %q, %v", buf, err)
	}
	guest.Close()
	<-done
	got := recs.wait(1)
	if len(got) != 1 || got[0].Dst != "10.88.0.1:5432" || got[0].Reason != audit.ReasonReverseForward || got[0].BytesDown != 2 ||
		got[0].Upstream != netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), hostPort).String() || got[0].Rule != "reverse "+(Entry{Reverse: true, Forward: state.Forward{Host: hostPort, Guest: 5432}}).Spec() {
		t.Errorf("records = %+v", got)
	}

	// The host's port down: nothing accepted, the failure recorded.
	accepted := false
	ServeReverse(context.Background(), ReverseConn{Gateway: gw, Port: 5433, HostPort: freeHostPort(t),
		Accept: func() (net.Conn, error) { accepted = true; return nil, errors.New("unused") },
		Hold:   func(net.Conn) (func(), bool) { return func() {}, true }, Audit: recs.add})
	if got := recs.wait(2); accepted || len(got) != 2 || !got[1].Reason.Is(audit.ReasonReverseForward) || got[1].Reason == audit.ReasonReverseForward {
		t.Errorf("a reverse forward to a closed host port: accepted %v, records %+v", accepted, got)
	}

	if r := RefusalRecord(gw, 22, "box"); r.Verdict != audit.Deny || r.Dst != "10.88.0.1:22" || r.Reason != audit.NotReverseForward(22, "box") {
		t.Errorf("RefusalRecord = %+v", r)
	}
}

// ChangeRecord keeps a change only when it serves: a forward that does
// not is served no more, and the record is left as it was.
func TestChangeRecord(t *testing.T) {
	var served [][]Entry
	sync := func(es []Entry) { served = append(served, es) }
	busy := errors.New("host port 8080 is already in use")
	check := func(e Entry) error {
		if !e.Reverse && e.Host == 8080 {
			return busy
		}
		return nil
	}
	for _, c := range []struct {
		name    string
		ch      control.ForwardChange
		err     error
		syncs   int
		forward *state.RuntimeForwards
	}{
		{"an add that serves is kept", control.ForwardChange{Op: "add", Spec: "3000"}, nil, 1,
			&state.RuntimeForwards{Ports: []state.Forward{{Host: 3000, Guest: 3000}}}},
		{"an add that does not is served no more and not kept", control.ForwardChange{Op: "add", Spec: "8080:80"}, busy, 2, nil},
		{"a reverse add is kept", control.ForwardChange{Op: "add", Spec: "5432", Reverse: true}, nil, 1,
			&state.RuntimeForwards{Reverse: []state.Forward{{Host: 5432, Guest: 5432}}}},
		{"a bad spec changes nothing", control.ForwardChange{Op: "add", Spec: "x"}, ErrSpec, 0, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			served = nil
			rec := &state.Record{Name: "box"}
			err := ChangeRecord(rec, "box", c.ch, sync, check)
			if !errors.Is(err, c.err) || (c.err == nil && err != nil) {
				t.Fatalf("ChangeRecord: %v, want %v", err, c.err)
			}
			if len(served) != c.syncs {
				t.Fatalf("synced %d times (%v), want %d", len(served), served, c.syncs)
			}
			if c.syncs == 2 && len(served[1]) != 0 {
				t.Errorf("after the failed add, served %v; want the old forwards, none", served[1])
			}
			got, _ := json.Marshal(rec.Forwards)
			want, _ := json.Marshal(c.forward)
			if string(got) != string(want) {
				t.Errorf("the record's forwards = %s, want %s", got, want)
			}
		})
	}
}

// Reverse cuts a removed forward's open connections, and refuses to hold
// one whose forward went while the host was dialed: a removed reverse
// forward leaves nothing of it carrying.
func TestReverseCutsRemoved(t *testing.T) {
	r := NewReverse()
	kept := Entry{Reverse: true, Forward: state.Forward{Host: 15432, Guest: 5432}}
	gone := Entry{Reverse: true, Forward: state.Forward{Host: 16379, Guest: 6379}}
	r.Sync([]Entry{kept, gone})
	if hp, ok := r.Lookup(6379); !ok || hp != 16379 {
		t.Fatalf("Lookup(6379) = %d, %v; want 16379", hp, ok)
	}
	open := func(port uint16) (guest, mine net.Conn, release func()) {
		t.Helper()
		guest, mine = net.Pipe()
		t.Cleanup(func() { guest.Close(); mine.Close() })
		release, ok := r.Hold(port)(mine)
		if !ok {
			t.Fatalf("Hold(%d) refused a connection of a forward in force", port)
		}
		return guest, mine, release
	}
	keptGuest, _, _ := open(5432)
	goneGuest, _, _ := open(6379)
	_, _, released := open(6379)
	released() // ended on its own: not cut again, nor held

	r.Sync([]Entry{kept})
	if _, ok := r.Lookup(6379); ok {
		t.Error("Lookup(6379) after its forward was removed: still open")
	}
	goneGuest.SetDeadline(time.Now().Add(5 * time.Second))
	var ne net.Error
	if _, err := goneGuest.Read(make([]byte, 1)); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("a connection of the removed forward was not cut: %v", err)
	}
	keptGuest.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := keptGuest.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("a connection of the kept forward: %v, want it open (a timeout)", err)
	}
	late, lateMine := net.Pipe()
	defer late.Close()
	defer lateMine.Close()
	if _, ok := r.Hold(6379)(lateMine); ok {
		t.Error("Hold of a connection to a removed forward: ok")
	}
	r.mu.Lock()
	n := len(r.conns)
	r.mu.Unlock()
	if n != 1 {
		t.Errorf("%d connections held, want the kept forward's one", n)
	}
}
