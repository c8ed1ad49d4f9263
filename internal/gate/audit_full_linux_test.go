package gate

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/testfs"
)

// threat model 28, a full disk: while the audit log cannot be written the gate
// lets nothing through (connections refused, names denied, so never asked
// upstream), and once there is room again it decides as before.
func TestNothingThroughWhileTheAuditLogFails(t *testing.T) {
	dir := testfs.Small(t, "2m")
	a := loopback()
	banner(t, a+":2222")
	f := newFixture(t, nil, []string{"ssh.allowed.test:2222", a + "/32"}, nil)
	al, err := audit.Open(filepath.Join(dir, "audit.jsonl"), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	f.g.o.Audit = al
	f.g.Bindings().Add("ssh.allowed.test", []netip.Addr{netip.MustParseAddr(a)}, "observed", time.Now().Add(time.Minute))

	if r := f.flow(t, a+":2222"); !r.accepted {
		t.Fatal("the allowed destination was refused with room on the disk")
	}
	if ok, _, _ := f.g.decideDNSName("ssh.allowed.test"); !ok {
		t.Fatal("the allowed name was denied with room on the disk")
	}

	filler := testfs.Fill(t, dir)
	for i := 0; al.Failing() == nil && i < 500; i++ {
		al.Write(audit.Record{Proto: "tcp", Verdict: audit.Allow, Name: "filling.test"})
		time.Sleep(10 * time.Millisecond)
	}
	if al.Failing() == nil {
		t.Fatal("the audit log did not fail on a full disk: the checks below would prove nothing")
	}
	if r := f.flow(t, a+":2222"); !r.refused || r.accepted {
		t.Fatalf("with the audit log failing: refused=%v accepted=%v, want refused", r.refused, r.accepted)
	}
	if ok, _, _ := f.g.decideDNSName("ssh.allowed.test"); ok {
		t.Fatal("with the audit log failing the allowed name is still allowed (and would be asked upstream)")
	}
	if f.g.Echo(netip.MustParseAddr(a)) {
		t.Fatal("with the audit log failing an echo was answered")
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); al.Failing() != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("the audit log still fails 5 s after the disk has room: %v", al.Failing())
		}
		al.Write(audit.Record{Proto: "tcp", Verdict: audit.Deny, Name: "recovering.test"})
		time.Sleep(10 * time.Millisecond)
	}
	if r := f.flow(t, a+":2222"); !r.accepted {
		t.Fatal("the allowed destination is still refused after the audit log recovered")
	}
}

// A flow that waits for rules on their way (Settling) is checked against
// the audit log after the wait: report mode must not let through, as
// would_deny, a flow the log could no longer record.
func TestSettlingThenAuditLogFailing(t *testing.T) {
	dir := testfs.Small(t, "2m")
	a := loopback()
	banner(t, a+":2222")
	f := newFixture(t, map[string]string{"undecided.test": a}, []string{a + "/32"}, nil)
	al, err := audit.Open(filepath.Join(dir, "audit.jsonl"), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	f.g.o.Audit = al
	f.g.SetReport(true)
	dst := netip.AddrPortFrom(f.g.pool.Addr("undecided.test"), 2222).String()
	if r := f.flow(t, dst); !r.accepted {
		t.Fatal("report mode refused an undecided destination with room on the disk")
	}

	// The disk fills while the flow waits.
	var filler string
	f.g.o.Settling = func(context.Context) bool {
		filler = testfs.Fill(t, dir)
		for i := 0; al.Failing() == nil && i < 500; i++ {
			al.Write(audit.Record{Proto: "tcp", Verdict: audit.Allow, Name: "filling.test"})
			time.Sleep(10 * time.Millisecond)
		}
		return true
	}
	r := f.flow(t, dst)
	if al.Failing() == nil {
		t.Fatal("the audit log did not fail on a full disk: the check below would prove nothing")
	}
	if r.accepted || !r.refused {
		t.Fatalf("report mode, the log failing during the wait: accepted=%v refused=%v, want refused", r.accepted, r.refused)
	}
	<-r.done // the denial is counted after the refusal
	// Refused by settle for the log, not let through and then refused at
	// the dial (the upstream's loopback class, closed with no policy):
	// an upstream of an ordinary class would have been dialed.
	var reason audit.Reason
	for _, e := range f.ledger.Entries() {
		if e.Name == "undecided.test" {
			reason = e.Reason
		}
	}
	if !reason.Is(audit.ReasonUnrecorded) {
		t.Errorf("the flow's latest denial says %q; want it refused for the audit log", reason)
	}
	os.Remove(filler)
}
