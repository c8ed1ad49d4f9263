package e2e

import (
	"strings"
	"testing"
)

// TestRefusalsAfterFailure: a command that fails after the gate refused it
// something gets, on stderr, what was refused and the command that allows
// it; its stdout stays its own. A command that succeeds gets nothing.
func TestRefusalsAfterFailure(t *testing.T) {
	dir := project(t, "refusals-e2e")
	mustMoat(t, dir, "up")
	r := moat(t, dir, nil, "run", "--", "sh", "-c", "echo out; curl -sf --max-time 20 http://refused-here.example/ >/dev/null; exit 3")
	if r.code != 3 {
		t.Fatalf("exit %d, want 3\nstderr: %s", r.code, r.stderr)
	}
	if r.stdout != "out\n" {
		t.Errorf("stdout = %q, want only the command's own output", r.stdout)
	}
	for _, want := range []string{"the gate refused these", "refused-here.example:80", "moat network allow refusals-e2e refused-here.example"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	r = moat(t, dir, nil, "run", "--", "sh", "-c", "exit 4")
	if r.code != 4 || strings.Contains(r.stderr, "refused") {
		t.Errorf("a later failure with no refusal of its own: exit %d, stderr %q", r.code, r.stderr)
	}
	r = moat(t, dir, nil, "run", "--", "sh", "-c", "curl -sf --max-time 20 http://refused-here.example/ >/dev/null; true")
	if r.code != 0 || strings.Contains(r.stderr, "refused") {
		t.Errorf("a command that succeeds: exit %d, stderr %q; want nothing said", r.code, r.stderr)
	}
}
