package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The exit codes and messages moat gate serve had before it became this
// binary: 2 for bad usage, 1 for an error such as a configuration that
// cannot be read, each saying what to do.
func TestRunRefuses(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "gate.toml")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"moat-gate"}, exitUsage, "Usage: moat-gate serve --config FILE"},
		{[]string{"moat-gate", "run"}, exitUsage, `unknown command "run"`},
		{[]string{"moat-gate", "serve"}, exitUsage, "--config FILE is required"},
		{[]string{"moat-gate", "serve", "--config", missing, "extra"}, exitUsage, "--config FILE is required, and nothing else"},
		{[]string{"moat-gate", "serve", "--bogus"}, exitUsage, "flag provided but not defined"},
	} {
		var stderr bytes.Buffer
		if got := run(tc.args, &stderr); got != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, got, stderr.String(), tc.code, tc.want)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("the configuration is read after the root check; run as root for the last case")
	}
	var stderr bytes.Buffer
	if got := run([]string{"moat-gate", "serve", "--config", missing}, &stderr); got != exitError || !strings.Contains(stderr.String(), missing) {
		t.Errorf("a missing configuration: exit %d, stderr %q; want exit %d naming %s", got, stderr.String(), exitError, missing)
	}
}
