package cli

import (
	"errors"
	"testing"

	"moat.dev/moat/internal/config"
)

func TestSandboxRuntime(t *testing.T) {
	for _, tc := range []struct {
		flag, configured, want string
		err                    bool
	}{
		{"", "", "gvisor", false},
		{"", "gvisor", "gvisor", false},
		{"", "docker", "docker", false},
		{"docker", "gvisor", "docker", false},
		{"gvisor", "docker", "gvisor", false},
		{"podman", "", "", true},
	} {
		var cfg config.Config
		cfg.Sandbox.Runtime = tc.configured
		got, err := sandboxRuntime(tc.flag, cfg)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("flag %q, config %q: got %q, %v; want %q (error: %v)", tc.flag, tc.configured, got, err, tc.want, tc.err)
		}
		var ee *exitError
		if err != nil && (!errors.As(err, &ee) || ee.code != ExitUsage) {
			t.Errorf("flag %q: %v is not a usage error (exit %d)", tc.flag, err, ExitUsage)
		}
	}
}
