package inet

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// GitSSH serves git over SSH at ip:port, as a code host does: the repositories under root, for
// clients presenting the one authorized key; only git-upload-pack and git-receive-pack run, on
// a repository path under root. The test's real client (OpenSSH and git in the guest, their key
// in the host's agent behind moat's filter) is what is under test; this is its far end.
func (n *Net) GitSSH(t testing.TB, ip string, port int, root string, authorized ssh.PublicKey) *Server {
	t.Helper()
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if string(k.Marshal()) == string(authorized.Marshal()) {
			return &ssh.Permissions{}, nil
		}
		return nil, errors.New("unauthorized key")
	}}
	cfg.AddHostKey(signer)
	s, l := n.listen(t, "tcp", ip, port)
	s.stop = func() { l.Close() }
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			s.hits++
			s.mu.Unlock()
			go s.serveGitSSH(c, cfg, root)
		}
	}()
	n.adopt(t, s)
	return s
}

func (s *Server) serveGitSSH(c net.Conn, cfg *ssh.ServerConfig, root string) {
	defer c.Close()
	_, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		s.logf("git ssh handshake: %v", err)
		return
	}
	go ssh.DiscardRequests(reqs)
	for nch := range chans {
		if nch.ChannelType() != "session" {
			nch.Reject(ssh.UnknownChannelType, "session only")
			continue
		}
		ch, creqs, err := nch.Accept()
		if err != nil {
			continue
		}
		go func() {
			defer ch.Close()
			for r := range creqs {
				if r.Type != "exec" {
					r.Reply(r.Type == "env", nil)
					continue
				}
				var m struct{ Command string }
				ssh.Unmarshal(r.Payload, &m)
				code := s.gitExec(ch, m.Command, root)
				r.Reply(true, nil)
				ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
				return
			}
		}()
	}
}

// gitExec runs "git-receive-pack '/repo.git'" (or upload-pack) on the channel.
func (s *Server) gitExec(ch ssh.Channel, command, root string) int {
	prog, arg, ok := strings.Cut(command, " ")
	arg = strings.Trim(arg, "'")
	if !ok || (prog != "git-receive-pack" && prog != "git-upload-pack") || strings.Contains(arg, "..") {
		fmt.Fprintf(ch.Stderr(), "inet git ssh: refusing %q\n", command)
		return 1
	}
	cmd := exec.Command("git", strings.TrimPrefix(prog, "git-"), filepath.Join(root, filepath.Clean("/"+arg)))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		return 1
	}
	return 0
}
