package cli

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/forward"
	"moat.dev/moat/internal/state"
)

// writeAudit writes recs to the audit log at path as its writer does.
func writeAudit(t *testing.T, path string, recs ...audit.Record) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := audit.OpenWith(path, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		w.Write(r)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDockerForwardAudit: a Docker sandbox's forwarder writes its own log;
// network audit shows its records among the gate container's, by time,
// and network denials counts its refusals; without it, or without any
// log, both commands answer as for a sandbox that made no connection.
func TestDockerForwardAudit(t *testing.T) {
	isolate(t)
	needEnv(t)
	dirs := mustDirs(t)
	for _, name := range []string{"dk", "empty"} {
		if err := state.Create(dirs.Sandbox(name), &state.Record{Name: name, Workspace: t.TempDir(), Image: "img", Runtime: runtimeDocker,
			Desired: "stopped", State: state.StateStopped, StopReason: state.StopUser}); err != nil {
			t.Fatal(err)
		}
	}
	dir := dirs.Sandbox("dk")
	t0 := time.Now().Add(-time.Minute)
	gate := func(sec int, v audit.Verdict, name string) audit.Record {
		return audit.Record{Schema: 1, Time: t0.Add(time.Duration(sec) * time.Second), Sandbox: "dk", Verdict: v, Proto: "tcp",
			Dst: "198.51.100.7:443", Name: name, Reason: audit.ReasonNoRule}
	}
	fwd := forward.ForwardRecord(forward.Entry{Forward: state.Forward{Host: 18080, Guest: 8000}}, netip.MustParseAddr("172.30.0.2"), t0.Add(2*time.Second))
	fwd.Sandbox = "dk"
	refused := forward.RefusalRecord(dockerrt.ReverseAddr, 6000, "dk")
	refused.Sandbox, refused.Time = "dk", t0.Add(4*time.Second)

	writeAudit(t, auditPath(dir, &state.Record{Runtime: runtimeDocker}), gate(1, audit.Deny, "first-by-the-gate.test"), gate(3, audit.Allow, "third-by-the-gate.test"))
	r := moat("network", "audit", "dk")
	if r.code != ExitOK || !strings.Contains(r.out, "first-by-the-gate.test") {
		t.Fatalf("moat network audit without a forward log: exit %d, stdout %q, stderr %q; want the gate's records", r.code, r.out, r.errOut)
	}

	writeAudit(t, dockerrt.ForwardAuditPath(dir), fwd, refused)
	r = moat("network", "audit", "dk")
	last := -1
	for _, want := range []string{"first-by-the-gate.test", "forward 18080:8000", "third-by-the-gate.test", "10.88.0.1:6000"} {
		i := strings.Index(r.out, want)
		if r.code != ExitOK || i <= last {
			t.Fatalf("moat network audit: exit %d, stdout %q, stderr %q; want %q after the record before it", r.code, r.out, r.errOut, want)
		}
		last = i
	}
	r = moat("network", "denials", "dk")
	for _, want := range []string{"first-by-the-gate.test", "10.88.0.1:6000", "not a reverse forward"} {
		if r.code != ExitOK || !strings.Contains(r.out, want) {
			t.Errorf("moat network denials dk: exit %d, stdout %q, stderr %q; want %q", r.code, r.out, r.errOut, want)
		}
	}
	if strings.Contains(r.out, "18080") {
		t.Errorf("moat network denials dk counts the carried forward:\n%s", r.out)
	}
	// suggest reads both logs too: the refused port's fix is the forward,
	// beside the gate's entry.
	r = moat("network", "suggest", "dk")
	for _, want := range []string{"first-by-the-gate.test", "10.88.0.1:6000", "moat forward add --reverse"} {
		if r.code != ExitOK || !strings.Contains(r.out, want) {
			t.Errorf("moat network suggest dk: exit %d, stdout %q, stderr %q; want %q", r.code, r.out, r.errOut, want)
		}
	}

	for _, args := range [][]string{{"network", "audit", "empty"}, {"network", "denials", "empty"}, {"network", "denials"}, {"network", "suggest", "empty"}} {
		if r := moat(args...); r.code != ExitOK {
			t.Errorf("moat %s with no audit log at all: exit %d, stderr %q; want 0", strings.Join(args, " "), r.code, r.errOut)
		}
	}
}
