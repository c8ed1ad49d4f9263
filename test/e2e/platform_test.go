package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moat.dev/moat/internal/runtime"
)

// TestPlatform: the sandbox runs on the platform auto chooses for this
// host, status says which, and platform = "kvm" on a host without KVM
// stops the start with the reason and what to write instead.
func TestPlatform(t *testing.T) {
	kvm := runtime.HostKVM()
	dir := project(t, "platform-e2e")
	mustMoat(t, dir, "up")
	want := "systrap"
	if kvm.Usable {
		want = "kvm"
	}
	if out := mustMoat(t, dir, "status"); !strings.Contains(out, "platform:   gVisor on "+want) {
		t.Errorf("status does not say the sandbox runs on %s:\n%s", want, out)
	}
	if kvm.Usable {
		return // the refusal below needs a host without KVM
	}
	kdir := project(t, "platform-kvm-e2e")
	if err := os.WriteFile(filepath.Join(kdir, "moat.toml"), []byte("[sandbox]\nplatform = \"kvm\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := moat(t, kdir, nil, "run", "--", "true")
	if r.code == 0 {
		t.Fatal("platform = \"kvm\" started on a host without KVM")
	}
	for _, s := range []string{"sandbox.platform", kvm.Why, `platform = "auto"`} {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("stderr lacks %q:\n%s", s, r.stderr)
		}
	}
	// A failure inside the daemon is an error (1), never bad usage (2),
	// which a bad flag is.
	if r := moat(t, kdir, nil, "up"); r.code != 1 {
		t.Errorf("up failing inside the daemon: exit %d, want 1\n%s", r.code, r.stderr)
	}
	if r := moat(t, kdir, nil, "up", "--no-such-flag"); r.code != 2 {
		t.Errorf("up with a bad flag: exit %d, want 2\n%s", r.code, r.stderr)
	}
}
