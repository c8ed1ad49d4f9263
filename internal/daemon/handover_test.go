package daemon

import (
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"moat.dev/moat/internal/config"
)

func TestSecretVars(t *testing.T) {
	got := SecretVars(map[string]config.Secret{
		"A": {From: "env:HOST_A"},
		"B": {From: "file:/x"},
		"C": {From: "command:pass c"},
	}, []string{"claude", "gone"})
	slices.Sort(got)
	want := []string{"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "HOST_A"}
	if !slices.Equal(got, want) {
		t.Fatalf("SecretVars = %q, want %q", got, want)
	}
}

func TestSplitEnv(t *testing.T) {
	rest, vals := SplitEnv([]string{"PATH=/bin", "HOST_A=canary=1", "HOME=/root"}, []string{"HOST_A", "UNSET"})
	if !slices.Equal(rest, []string{"PATH=/bin", "HOME=/root"}) {
		t.Errorf("rest = %q", rest)
	}
	if len(vals) != 1 || vals["HOST_A"] != "canary=1" {
		t.Errorf("values = %q", vals)
	}
}

// The values cross a real pipe by fd number, as between CLI and daemon.
func TestHandover(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	big := string(make([]byte, 200<<10)) // beyond a pipe's buffer
	done := make(chan error, 1)
	go func() { done <- WriteHandover(w, map[string]string{"K": "v", "BIG": big}) }()
	// ReadHandover takes the fd and closes it, as the daemon does with the
	// one it inherits; so it gets a copy that no *os.File owns. Handing it
	// r's own fd left r's finalizer to close that number a second time,
	// whenever the GC ran, by then another test's file.
	fd, err := syscall.Dup(int(r.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	t.Setenv(SecretsFDEnv, strconv.Itoa(fd))
	got, err := ReadHandover() // closes fd
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got["K"] != "v" || len(got["BIG"]) != len(big) {
		t.Fatalf("ReadHandover = %d values, K=%q", len(got), got["K"])
	}
	t.Setenv(SecretsFDEnv, "")
	if got, err := ReadHandover(); err != nil || len(got) != 0 {
		t.Fatalf("without a pipe: %v, %v", got, err)
	}
	t.Setenv(SecretsFDEnv, "x")
	if _, err := ReadHandover(); err == nil {
		t.Fatal("a bad fd number must be an error")
	}
}

// TestEnviron checks that the daemon keeps only what it names of the
// starting CLI's environment.
func TestEnviron(t *testing.T) {
	in := []string{"PATH=/bin", "HOME=/root", "LANG=C.UTF-8", "LC_ALL=C", "MOAT_HOME=/m", "MOAT_UPSTREAM_DNS=10.0.0.1",
		"OPENAI_API_KEY=sk-x", "AWS_SECRET_ACCESS_KEY=y", "SSH_AUTH_SOCK=/tmp/agent", SecretsFDEnv + "=9", "GOPROXY=https://u:p@proxy", "GOMAXPROCS=2"}
	want := []string{"PATH=/bin", "HOME=/root", "LANG=C.UTF-8", "LC_ALL=C", "MOAT_HOME=/m", "MOAT_UPSTREAM_DNS=10.0.0.1", "GOMAXPROCS=2"}
	if got := Environ(in, false); !slices.Equal(got, want) {
		t.Errorf("Environ = %q\nwant %q", got, want)
	}
	if got := Environ(in, true); !slices.Contains(got, "SSH_AUTH_SOCK=/tmp/agent") {
		t.Errorf("Environ with the SSH agent forwarded = %q, want SSH_AUTH_SOCK", got)
	}
}
