package gate

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/testfs"
)

// ATTACKS 28, a full disk: while the audit log cannot be written the gate
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
