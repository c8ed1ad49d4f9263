package e2e

// The real OpenSSH client with `moat ssh-config`: ssh, scp (sftp) and ssh -L
// into a sandbox through its daemon.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSSHConfigOpenSSH(t *testing.T) {
	dir := project(t, "sshcfg-e2e")
	os.Chmod(dir, 0o777)
	if r := moat(t, dir, nil, "up"); r.code != 0 {
		t.Fatalf("up: %s", r.stderr)
	}
	cfgText := mustMoatEnv(t, dir, nil, "ssh-config", "sshcfg-e2e")
	for _, want := range []string{"Host moat-sshcfg-e2e", "ProxyCommand ", "ssh-proxy sshcfg-e2e", "StrictHostKeyChecking yes"} {
		if !strings.Contains(cfgText, want) {
			t.Fatalf("ssh-config lacks %q:\n%s", want, cfgText)
		}
	}
	cfg := filepath.Join(t.TempDir(), "ssh_config")
	if err := os.WriteFile(cfg, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, append([]string{"-F", cfg, "-o", "BatchMode=yes"}, args...)...)
		cmd.Env = moatEnv(nil)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	t.Run("ssh", func(t *testing.T) {
		out, err := run("ssh", "moat-sshcfg-e2e", "echo hi; id -un; pwd")
		if err != nil || !strings.HasPrefix(out, "hi\nagent\n") {
			t.Fatalf("ssh: %v\n%s", err, out)
		}
	})

	t.Run("scp_both_ways", func(t *testing.T) {
		local := filepath.Join(t.TempDir(), "up.txt")
		os.WriteFile(local, []byte("sent by scp\n"), 0o644)
		if out, err := run("scp", local, "moat-sshcfg-e2e:/tmp/up.txt"); err != nil {
			t.Fatalf("scp up: %v\n%s", err, out)
		}
		if out, err := run("ssh", "moat-sshcfg-e2e", "cat /tmp/up.txt; stat -c %U /tmp/up.txt"); err != nil || out != "sent by scp\nagent\n" {
			t.Fatalf("the copied file in the guest: %v %q", err, out)
		}
		back := filepath.Join(t.TempDir(), "hostname")
		if out, err := run("scp", "moat-sshcfg-e2e:/etc/hostname", back); err != nil {
			t.Fatalf("scp down: %v\n%s", err, out)
		}
		if b, _ := os.ReadFile(back); strings.TrimSpace(string(b)) != "sshcfg-e2e" {
			t.Errorf("scp'd /etc/hostname: %q", b)
		}
		// sftp runs as the agent user: root's files stay root's.
		if out, err := run("scp", local, "moat-sshcfg-e2e:/etc/moat-scp-test"); err == nil {
			t.Errorf("scp into /etc succeeded: %s", out)
		}
	})

	t.Run("ssh_L_to_a_guest_port", func(t *testing.T) {
		if out, err := run("ssh", "moat-sshcfg-e2e", "setsid python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 < /dev/null & sleep 1"); err != nil {
			t.Fatalf("starting a server in the guest: %v %s", err, out)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		cmd := exec.Command("ssh", "-F", cfg, "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes", "-N",
			"-L", fmt.Sprintf("127.0.0.1:%d:127.0.0.1:8765", port), "moat-sshcfg-e2e")
		cmd.Env = moatEnv(nil)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		var body string
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				body = string(b)
				break
			}
		}
		if !strings.Contains(body, "Directory listing") {
			t.Fatalf("through ssh -L: %q", body)
		}
	})
}
