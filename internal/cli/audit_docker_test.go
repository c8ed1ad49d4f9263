package cli

import (
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/state"
)

// TestDockerSandboxAudit: a Docker sandbox's decisions are in the log its
// gate container writes for the workload, not where a gVisor sandbox's
// gate process writes; network audit and denials read that one.
func TestDockerSandboxAudit(t *testing.T) {
	isolate(t)
	needEnv(t)
	dir := mustDirs(t).Sandbox("dk")
	if err := state.Create(dir, &state.Record{Name: "dk", Workspace: t.TempDir(), Image: "img", Runtime: runtimeDocker,
		Desired: "stopped", State: state.StateStopped, StopReason: state.StopUser}); err != nil {
		t.Fatal(err)
	}
	path := dockerrt.AuditPath(dir)
	if path == state.AuditPath(dir) {
		t.Fatal("the Docker audit path is the gVisor one: the test would prove nothing")
	}
	writeAudit(t, path, audit.Record{Schema: 1, Time: time.Now(), Sandbox: "dk", Verdict: audit.Deny, Proto: "tcp", Dst: "198.51.100.7:443",
		Name: "denied-by-docker-gate.test", Reason: audit.ReasonNoRule})
	for _, args := range [][]string{{"network", "audit", "dk"}, {"network", "denials", "dk"}} {
		r := moat(args...)
		if r.code != ExitOK || !strings.Contains(r.out, "denied-by-docker-gate.test") {
			t.Errorf("moat %s: exit %d, stdout %q, stderr %q; want the gate container's record", strings.Join(args, " "), r.code, r.out, r.errOut)
		}
	}
}
