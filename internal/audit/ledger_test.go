package audit

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"
)

func TestLedgerAggregates(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	l := NewLedger(10)
	for _, r := range []Record{
		{Time: at(0), Proto: "tcp", Dst: "198.18.0.7:443", Name: "evil.example", NameFrom: "pool", Verdict: Deny, Reason: "no rule"},
		{Time: at(1), Proto: "tcp", Dst: "203.0.113.9:22", Verdict: Deny, Reason: "no rule"},
		{Time: at(2), Proto: "tcp", Dst: "93.184.216.34:443", Name: "allowed.example", Verdict: Allow},
		{Time: at(3), Proto: "tcp", Dst: "198.18.0.8:443", Name: "evil.example", NameFrom: "sni", Verdict: Deny, Rule: "evil.example", Reason: "blocked"},
		{Time: at(4), Proto: "udp", Dst: "203.0.113.9:443", Verdict: Deny, Reason: "UDP other than DNS"},
		{Time: at(5), Proto: "dns", Dst: "gateway:53", Name: "exfil.evil.example", NameFrom: "dns", Verdict: Deny, Reason: "A: no rule"},
		{Time: at(6), Proto: "icmp", Dst: "203.0.113.9", Verdict: Deny, Reason: "no rule"},
		{Time: at(7), Proto: "tcp", Dst: "[2001:db8::1]:80", Verdict: Deny, Reason: "no rule"},
		{Time: at(8), Proto: "tcp", Dst: "198.18.0.7:80", Name: "evil.example", Verdict: Deny, Reason: "no rule"},
	} {
		l.Add(r)
	}
	want := []Entry{
		{Dest: "evil.example:80", Name: "evil.example", Ports: []uint16{80}, Count: 1, First: at(8), Last: at(8), Reason: "no rule", Proto: "tcp"},
		{Dest: "[2001:db8::1]:80", Ports: []uint16{80}, Count: 1, First: at(7), Last: at(7), Reason: "no rule", Proto: "tcp"},
		{Dest: "203.0.113.9", Ports: []uint16{}, Count: 1, First: at(6), Last: at(6), Reason: "no rule", Proto: "icmp"},
		{Dest: "exfil.evil.example", Name: "exfil.evil.example", Ports: []uint16{}, Count: 1, First: at(5), Last: at(5), Reason: "A: no rule", Proto: "dns"},
		{Dest: "203.0.113.9:443", Ports: []uint16{443}, Count: 1, First: at(4), Last: at(4), Reason: "UDP other than DNS", Proto: "udp"},
		// Two addresses, one name: one entry, latest rule and reason.
		{Dest: "evil.example:443", Name: "evil.example", Ports: []uint16{443}, Count: 2, First: at(0), Last: at(3), Rule: "evil.example", Reason: "blocked", Proto: "tcp"},
		{Dest: "203.0.113.9:22", Ports: []uint16{22}, Count: 1, First: at(1), Last: at(1), Reason: "no rule", Proto: "tcp"},
	}
	if got := l.Entries(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", got, want)
	}
	if got := l.Total(); got != 8 {
		t.Fatalf("Total = %d, want 8", got)
	}
}

func TestLedgerOutOfOrderTimes(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	l := NewLedger(10)
	for _, s := range []int{5, 2, 9, 7} {
		l.Add(Record{Time: t0.Add(time.Duration(s) * time.Second), Proto: "tcp", Dst: "192.0.2.1:443", Verdict: Deny})
	}
	e := l.Entries()[0]
	if !e.First.Equal(t0.Add(2*time.Second)) || !e.Last.Equal(t0.Add(9*time.Second)) || e.Count != 4 {
		t.Fatalf("got %+v", e)
	}
}

func TestLedgerEvictsLeastRecentlySeen(t *testing.T) {
	l := NewLedger(3)
	deny := func(port int) { l.Add(Record{Proto: "tcp", Dst: fmt.Sprintf("192.0.2.1:%d", port), Verdict: Deny}) }
	deny(1)
	deny(2)
	deny(3)
	deny(1) // seen again: now 2 is the least recent
	deny(4) // evicts 2
	var got []string
	for _, e := range l.Entries() {
		got = append(got, fmt.Sprintf("%s×%d", e.Dest, e.Count))
	}
	if want := "[192.0.2.1:4×1 192.0.2.1:1×2 192.0.2.1:3×1]"; fmt.Sprint(got) != want {
		t.Fatalf("got %v, want %s", got, want)
	}
	deny(2) // back, counted afresh
	if e := l.Entries()[0]; e.Dest != "192.0.2.1:2" || e.Count != 1 {
		t.Fatalf("got %+v", e)
	}
	if l.Total() != 6 {
		t.Fatalf("Total = %d, want 6", l.Total())
	}
}

func TestLedgerEntriesAreCopies(t *testing.T) {
	l := NewLedger(0)
	l.Add(Record{Proto: "tcp", Dst: "192.0.2.1:443", Verdict: Deny})
	l.Entries()[0].Ports[0] = 1
	if p := l.Entries()[0].Ports[0]; p != 443 {
		t.Fatalf("ledger changed through Entries: port %d", p)
	}
}

func TestLedgerConcurrent(t *testing.T) {
	l := NewLedger(50)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 500 {
				l.Add(Record{Proto: "tcp", Dst: fmt.Sprintf("192.0.2.%d:443", (w*500+i)%100), Verdict: Deny})
				if i%50 == 0 {
					l.Entries()
				}
			}
		})
	}
	wg.Wait()
	if l.Total() != 4000 {
		t.Fatalf("Total = %d, want 4000", l.Total())
	}
	if n := len(l.Entries()); n != 50 {
		t.Fatalf("%d entries, want 50", n)
	}
}

// A ledger rebuilt from the log (a stopped sandbox's `moat network
// denials`) counts an aggregate as the denials it stands for.
func TestLedgerCountsAggregates(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	l := NewLedger(10)
	l.Add(Record{Time: t0, Proto: "udp", Dst: "192.0.2.1:443", Verdict: Deny})
	l.Add(Record{Time: t0.Add(time.Second), Last: t0.Add(9 * time.Second), Proto: "udp", Dst: "192.0.2.1:443", Verdict: Deny, Count: 41})
	e := l.Entries()[0]
	if e.Count != 42 || l.Total() != 42 || !e.Last.Equal(t0.Add(9*time.Second)) || !e.First.Equal(t0) {
		t.Fatalf("got %+v, total %d; want 42 from t0 to t0+9s", e, l.Total())
	}
}
