package gate

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
)

// manualTimers is an injectable clock for Holds: timeouts fire when the
// test says so.
type manualTimers struct {
	mu  sync.Mutex
	now time.Time
	seq int
	fns map[int]func()
}

func (m *manualTimers) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

func (m *manualTimers) advance(d time.Duration) {
	m.mu.Lock()
	m.now = m.now.Add(d)
	m.mu.Unlock()
}

func (m *manualTimers) AfterFunc(_ time.Duration, f func()) func() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	id := m.seq
	m.fns[id] = f
	return func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		_, ok := m.fns[id]
		delete(m.fns, id)
		return ok
	}
}

// fire runs every pending timeout.
func (m *manualTimers) fire() {
	m.mu.Lock()
	var fns []func()
	for id, f := range m.fns {
		fns = append(fns, f)
		delete(m.fns, id)
	}
	m.mu.Unlock()
	for _, f := range fns {
		f()
	}
}

func newTestHolds() (*Holds, *manualTimers) {
	m := &manualTimers{now: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC), fns: map[int]func(){}}
	return NewHolds(HoldsOptions{Now: m.Now, AfterFunc: m.AfterFunc}), m
}

var qA = Question{Name: "a.example", Addr: netip.MustParseAddr("198.18.0.5"), Port: 443}

// events collects what a watcher is told.
type events struct {
	mu sync.Mutex
	ev []HoldEvent
}

func (e *events) add(ev HoldEvent) { e.mu.Lock(); e.ev = append(e.ev, ev); e.mu.Unlock() }

func (e *events) kinds() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var k []string
	for _, ev := range e.ev {
		k = append(k, string(ev.Kind))
	}
	return strings.Join(k, " ")
}

// waitPending waits until n holds are pending (bounded).
func waitPending(t *testing.T, h *Holds, n int) []Pending {
	t.Helper()
	for range 500 {
		if p := h.Pending(); len(p) == n {
			return p
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("never saw %d pending holds", n)
	return nil
}

func TestHoldWithoutWatcherRefusesAtOnce(t *testing.T) {
	h, _ := newTestHolds()
	if out := h.Ask(context.Background(), qA); out.Allow || out.By != "none" {
		t.Fatalf("got %+v, want an immediate refusal", out)
	}
}

func TestHoldsCoalesceAndAnswer(t *testing.T) {
	for _, tt := range []struct {
		answer string
		allow  bool
	}{{"once", true}, {"deny", false}} {
		t.Run(tt.answer, func(t *testing.T) {
			h, _ := newTestHolds()
			var ev events
			_, detach := h.Watch(ev.add)
			defer detach()
			const n = 20
			outs := make(chan Outcome, n)
			for range n {
				go func() { outs <- h.Ask(context.Background(), qA) }()
			}
			var p []Pending
			for range 500 {
				if ev.kinds() == "hold"+strings.Repeat(" hold+", n-1) {
					p = h.Pending()
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			if len(p) != 1 || p[0].Count != n || p[0].Q != qA {
				t.Fatalf("pending %+v, events %q: want one hold of %d connections", p, ev.kinds(), n)
			}
			if _, ok := h.Take(p[0].ID); !ok {
				t.Fatal("Take: not pending")
			}
			if _, ok := h.Take(p[0].ID); ok {
				t.Fatal("a hold was taken twice")
			}
			h.Finish(p[0].ID, Outcome{Allow: tt.allow, Answer: tt.answer, By: "watcher"})
			for range n {
				select {
				case out := <-outs:
					if out.Allow != tt.allow || out.Answer != tt.answer {
						t.Fatalf("outcome %+v", out)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a held connection was not released")
				}
			}
			if !strings.HasSuffix(ev.kinds(), " resolved") {
				t.Errorf("events %q: want resolved last", ev.kinds())
			}
		})
	}
}

func TestHoldTimesOut(t *testing.T) {
	h, m := newTestHolds()
	_, detach := h.Watch(nil)
	defer detach()
	out := make(chan Outcome, 1)
	go func() { out <- h.Ask(context.Background(), qA) }()
	p := waitPending(t, h, 1)
	if want := m.Now().Add(DefaultHoldTimeout); !p[0].Expires.Equal(want) {
		t.Errorf("expires %v, want %v", p[0].Expires, want)
	}
	select {
	case o := <-out:
		t.Fatalf("released before the timeout: %+v", o)
	case <-time.After(20 * time.Millisecond):
	}
	m.fire()
	select {
	case o := <-out:
		if o.Allow || o.By != "timeout" {
			t.Fatalf("outcome %+v, want a timeout refusal", o)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the timeout did not release the hold")
	}
	// An answer that comes too late finds nothing.
	if _, ok := h.Take(p[0].ID); ok {
		t.Error("a timed-out hold could still be taken")
	}
}

func TestHoldsOverflowAndWatcherLeaving(t *testing.T) {
	h, _ := newTestHolds()
	_, detach := h.Watch(nil)
	outs := make(chan Outcome, MaxHolds+1)
	for i := range MaxHolds {
		q := Question{Name: fmt.Sprintf("h%d.example", i), Port: 443}
		go func() { outs <- h.Ask(context.Background(), q) }()
	}
	waitPending(t, h, MaxHolds)
	if o := h.Ask(context.Background(), Question{Name: "one-more.example", Port: 443}); o.Allow || o.By != "overflow" {
		t.Fatalf("17th destination: %+v, want an immediate overflow refusal", o)
	}
	// A connection to a destination already held still joins its hold.
	go func() { outs <- h.Ask(context.Background(), Question{Name: "h0.example", Port: 443}) }()
	time.Sleep(20 * time.Millisecond)
	detach()
	for range MaxHolds + 1 {
		select {
		case o := <-outs:
			if o.Allow || o.By != "closed" {
				t.Fatalf("outcome %+v, want refused when the last watcher left", o)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("holds outlived the last watcher")
		}
	}
}

func TestHoldsOpenForAnHour(t *testing.T) {
	h, m := newTestHolds()
	h.OpenUntil(m.Now().Add(time.Hour))
	if o := h.Ask(context.Background(), qA); !o.Allow || o.Answer != "hour" {
		t.Fatalf("inside the hour: %+v", o)
	}
	m.advance(time.Hour)
	if o := h.Ask(context.Background(), qA); o.Allow {
		t.Fatalf("after the hour: %+v", o)
	}
}

// plainGet sends one plain HTTP request for host through a flow and
// returns the status and body.
func plainGet(t *testing.T, r *flowResult, host string) (int, string) {
	t.Helper()
	r.guest.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(r.guest, "GET /x HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(r.guest), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestGateHoldsUndecidedNotBlocked(t *testing.T) {
	a := loopback()
	httpUpstream(t, a+":80")
	f := newFixture(t, map[string]string{"new.test": a, "blocked.test": a}, []string{a}, []string{"blocked.test"})
	h, _ := newTestHolds()
	f.g.o.Holds = h
	var ev events
	_, detach := h.Watch(ev.add)
	defer detach()

	// A blocked name is never held, even with a watcher attached.
	r := f.flow(t, a+":80")
	if code, _ := plainGet(t, r, "blocked.test"); code != 403 {
		t.Fatalf("blocked: got %d, want 403", code)
	}
	<-r.done
	if k := ev.kinds(); k != "" {
		t.Fatalf("a blocked name was held: %q", k)
	}

	// An undecided one waits for the answer, then goes through.
	r = f.flow(t, a+":80")
	got := make(chan int, 1)
	go func() { code, _ := plainGet(t, r, "new.test"); got <- code }()
	p := waitPending(t, h, 1)
	if p[0].Q.Name != "new.test" || p[0].Q.Port != 80 {
		t.Fatalf("held %+v", p[0].Q)
	}
	select {
	case c := <-got:
		t.Fatalf("answered %d before the watcher did", c)
	case <-time.After(20 * time.Millisecond):
	}
	h.Take(p[0].ID)
	h.Finish(p[0].ID, Outcome{Allow: true, Answer: "once", By: "watcher"})
	if c := <-got; c != 200 {
		t.Fatalf("after allow once: %d", c)
	}
	r.guest.Close()
	<-r.done
	recs := f.records(t)
	last := recs[len(recs)-1]
	if last.Verdict != "allow" || last.Rule != "once" || last.Layer != "interactive" || last.Name != "new.test" {
		t.Errorf("audit of the allowed-once flow: %+v", last)
	}
}

func TestGateReportMode(t *testing.T) {
	a := loopback()
	httpUpstream(t, a+":80")
	f := newFixture(t, map[string]string{"new.test": a, "blocked.test": a}, []string{a}, []string{"blocked.test"})
	f.g.SetReport(true)
	for _, host := range []string{"new.test", "blocked.test"} {
		r := f.flow(t, a+":80")
		if code, body := plainGet(t, r, host); code != 200 || !strings.Contains(body, "for "+host) {
			t.Fatalf("%s in report mode: %d %q", host, code, body)
		}
		r.guest.Close()
		<-r.done
	}
	recs := f.records(t)
	want := map[string]audit.Reason{"new.test": "no rule allows it", "blocked.test": "blocked by rule"}
	for _, r := range recs {
		if r.Verdict != "would_deny" || r.Reason != want[r.Name] || r.Upstream == "" {
			t.Errorf("record %+v: want would_deny, reason %q, dialed", r, want[r.Name])
		}
		delete(want, r.Name)
	}
	if len(want) != 0 {
		t.Errorf("no record for %v", want)
	}
	if e := f.ledger.Entries(); len(e) != 2 {
		t.Errorf("ledger %+v: want both would-be denials", e)
	}
}
