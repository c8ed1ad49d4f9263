package e2e

// The guest's ssh-agent (threat model 27): a real ssh-agent on the host holds two
// keys, the configuration allows one; in the guest, ssh-add lists only that one, ssh-keygen
// signs with it through the agent, and cannot with the other.

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/test/inet"
)

const gitSSHIP = "198.51.100.90"

// hostAgent starts a real ssh-agent holding two fresh keys, "allowed" and "other", and
// returns its socket, the keys' directory and their SHA256 fingerprints.
func hostAgent(t *testing.T) (sock, keys string, fps []string) {
	t.Helper()
	keys = t.TempDir()
	for _, name := range []string{"allowed", "other"} {
		k := filepath.Join(keys, name)
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name+"@host", "-f", k).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v %s", err, out)
		}
		out, err := exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", k+".pub").Output()
		if err != nil {
			t.Fatal(err)
		}
		fps = append(fps, strings.Fields(string(out))[1])
	}
	sock = filepath.Join(t.TempDir(), "agent.sock")
	agentCmd := exec.Command("ssh-agent", "-D", "-a", sock)
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agentCmd.Process.Kill(); agentCmd.Wait() })
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, name := range []string{"allowed", "other"} {
		add := exec.Command("ssh-add", filepath.Join(keys, name))
		add.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
		if out, err := add.CombinedOutput(); err != nil {
			t.Fatalf("ssh-add: %v %s", err, out)
		}
	}

	return sock, keys, fps
}

func TestSSHAgentFilter(t *testing.T) {
	sock, keys, fps := hostAgent(t)
	// A git server on SSH in the test internet, accepting only the allowed key.
	n := inet.Start(t)
	n.SetA("git-ssh.test", gitSSHIP)
	gitRoot := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", "--bare", filepath.Join(gitRoot, "repo.git")).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	pubBytes, _ := os.ReadFile(filepath.Join(keys, "allowed.pub"))
	allowedPub, _, _, _, err := ssh.ParseAuthorizedKey(pubBytes)
	if err != nil {
		t.Fatal(err)
	}
	n.GitSSH(t, gitSSHIP, 22, gitRoot, allowedPub)

	g := newGateEnv(t, n, "sshagent-e2e", "[ssh_agent]\nkeys = [\""+fps[0]+"\"]\n\n[network]\nuse = [\"none\"]\nallow = [\"git-ssh.test:22\"]\n")
	dir := g.dir
	os.Chmod(dir, 0o777)
	for _, name := range []string{"allowed", "other"} {
		b, _ := os.ReadFile(filepath.Join(keys, name+".pub"))
		os.WriteFile(filepath.Join(dir, name+".pub"), b, 0o644)
	}
	env := append(g.env, "SSH_AUTH_SOCK="+sock)
	script := `echo "SOCK=$SSH_AUTH_SOCK"
ssh-add -l -E sha256 | sed 's/^/LIST=/'
echo data > d
ssh-keygen -Y sign -f allowed.pub -n test d >/dev/null 2>&1 && echo SIGN_ALLOWED=ok || echo SIGN_ALLOWED=failed
ssh-keygen -Y sign -f other.pub -n test d >/dev/null 2>&1 && echo SIGN_OTHER=ok || echo SIGN_OTHER=failed
ssh-add -D >/dev/null 2>&1 && echo REMOVE=ok || echo REMOVE=refused
git init -q -b main work && cd work && git -c user.email=a@b -c user.name=agent commit -q --allow-empty -m "pushed over ssh through the gate" &&
GIT_SSH_COMMAND="ssh -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes" git push -q ssh://git@git-ssh.test/repo.git main 2>&1 && echo PUSH=ok || echo PUSH=failed
true`
	r := moat(t, dir, env, "run", "--", "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("guest: exit %d %s", r.code, r.stderr)
	}
	got := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			got[k] = append(got[k], v)
		}
	}
	t.Logf("guest:\n%s", r.stdout)
	if len(got["LIST"]) != 1 || !strings.Contains(got["LIST"][0], fps[0]) || !strings.Contains(got["LIST"][0], "allowed@host") {
		t.Errorf("ssh-add -l in the guest: %q, want only %s", got["LIST"], fps[0])
	}
	if strings.Join(got["SIGN_ALLOWED"], "") != "ok" || strings.Join(got["SIGN_OTHER"], "") != "failed" {
		t.Errorf("signing: allowed %q, other %q; want ok, failed", got["SIGN_ALLOWED"], got["SIGN_OTHER"])
	}
	if strings.Join(got["PUSH"], "") != "ok" {
		t.Errorf("git push over SSH through the gate: %q", got["PUSH"])
	}
	if out, err := exec.Command("git", "--git-dir", filepath.Join(gitRoot, "repo.git"), "log", "-1", "--format=%s", "main").Output(); err != nil || strings.TrimSpace(string(out)) != "pushed over ssh through the gate" {
		t.Errorf("the server's repository: %v %q", err, out)
	}
	if strings.Join(got["REMOVE"], "") != "refused" {
		t.Errorf("ssh-add -D in the guest: %q, want refused", got["REMOVE"])
	}
	// The host's agent still holds both keys, and no private key is in the guest's reach.
	list := exec.Command("ssh-add", "-l")
	list.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
	if out, _ := list.Output(); strings.Count(string(out), "\n") != 2 {
		t.Errorf("the host's agent now lists:\n%s", out)
	}
	// A sandbox without [ssh_agent] gets no agent at all.
	plain := project(t, "noagent-e2e")
	if r := moat(t, plain, env, "run", "--", "sh", "-c", `echo "[$SSH_AUTH_SOCK]"`); r.stdout != "[]\n" {
		t.Errorf("a sandbox without [ssh_agent]: SSH_AUTH_SOCK %q", r.stdout)
	}
}

// TestSSHAgentConfirm: with confirm = true each signature waits for a watcher's answer; with
// none attached it is refused.
func TestSSHAgentConfirm(t *testing.T) {
	sock, keys, fps := hostAgent(t)
	n := inet.Start(t)
	g := newGateEnv(t, n, "sshconfirm-e2e", "[ssh_agent]\nkeys = [\""+fps[0]+"\"]\nconfirm = true\n")
	os.Chmod(g.dir, 0o777)
	b, _ := os.ReadFile(filepath.Join(keys, "allowed.pub"))
	os.WriteFile(filepath.Join(g.dir, "allowed.pub"), b, 0o644)
	g.env = append(g.env, "SSH_AUTH_SOCK="+sock, "MOAT_HOLD_TIMEOUT=20s")
	g.up(t)
	t.Cleanup(func() { moat(t, g.dir, g.env, "destroy", "--yes", g.name) })
	sign := "echo data > d; ssh-keygen -Y sign -f allowed.pub -n test d >/dev/null 2>&1 && echo SIGNED || echo REFUSED"
	if out := g.sh(t, sign); strings.TrimSpace(out) != "REFUSED" {
		t.Fatalf("a signature with no watcher: %q, want refused", out)
	}
	w := attachWatcher(t, g)
	r := startGuest(t, g, sign)
	ev := w.waitFor(t, "the signature question", func(ev control.Event) bool {
		return ev.Type == control.EventHold && ev.Hold != nil && ev.Hold.Kind == "ssh-sign"
	})
	if !strings.Contains(ev.Hold.Name, fps[0]) {
		t.Errorf("the question names %q, want the key %s", ev.Hold.Name, fps[0])
	}
	answer(t, w, ev.Hold, control.AnswerOnce, "")
	if out := strings.TrimSpace(r.wait(t)); out != "SIGNED" {
		t.Fatalf("after once: %q", out)
	}
}
