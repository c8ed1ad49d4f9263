package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// The guest's ssh-agent. Keys never enter the guest: the agent listens on a
// unix socket (AgentSocket), and each client of that socket is carried on
// an "auth-agent@openssh.com" channel back over the SSH connection the
// daemon holds to this agent, where the daemon's filter in front of the
// host's own agent answers (internal/sshagent). Sessions get SSH_AUTH_SOCK.

// agentChannel is the channel type OpenSSH uses for agent forwarding.
const agentChannel = "auth-agent@openssh.com"

// agentConns remembers the daemon's connection, through which agent
// channels are opened.
type agentConns struct {
	mu   sync.Mutex
	conn ssh.Conn // the latest authenticated connection, nil when none
}

func (a *agentConns) set(c ssh.Conn) {
	a.mu.Lock()
	a.conn = c
	a.mu.Unlock()
}

func (a *agentConns) drop(c ssh.Conn) {
	a.mu.Lock()
	if a.conn == c {
		a.conn = nil
	}
	a.mu.Unlock()
}

func (a *agentConns) get() ssh.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn
}

// serveAgentSocket listens on AgentSocket (a directory of its own, 0700,
// owned by the sessions' user) until ctx ends.
func (s *Server) serveAgentSocket(ctx context.Context) error {
	dir := filepath.Dir(s.AgentSocket)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	os.Chmod(dir, 0o700)
	os.Chown(dir, s.UID, s.GID)
	os.Remove(s.AgentSocket)
	ln, err := net.Listen("unix", s.AgentSocket)
	if err != nil {
		return err
	}
	os.Chown(s.AgentSocket, s.UID, s.GID)
	os.Chmod(s.AgentSocket, 0o600)
	go func() { <-ctx.Done(); ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			go s.forwardAgent(c)
		}
	}()
	return nil
}

// forwardAgent carries one agent client to the daemon.
func (s *Server) forwardAgent(c net.Conn) {
	defer c.Close()
	conn := s.agents.get()
	if conn == nil {
		return // no daemon connected: the client sees the agent hang up
	}
	ch, reqs, err := conn.OpenChannel(agentChannel, nil)
	if err != nil {
		s.log().Debug("opening an agent channel", "err", err)
		return
	}
	go ssh.DiscardRequests(reqs)
	defer ch.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(ch, c)
		ch.CloseWrite()
		close(done)
	}()
	io.Copy(c, ch)
	<-done
}

// serveDirectTCPIP is ssh -L (and editors' port forwarding): a connection
// from inside the guest to the host and port the client names. The guest
// dials as it would for itself, through the gate for anything outside.
func (s *Server) serveDirectTCPIP(ctx context.Context, nch ssh.NewChannel) {
	var m struct {
		Host     string
		Port     uint32
		OrigHost string
		OrigPort uint32
	}
	if err := ssh.Unmarshal(nch.ExtraData(), &m); err != nil || m.Port == 0 || m.Port > 65535 {
		nch.Reject(ssh.ConnectionFailed, "bad direct-tcpip request")
		return
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := d.DialContext(dctx, "tcp", net.JoinHostPort(m.Host, strconv.Itoa(int(m.Port))))
	cancel()
	if err != nil {
		nch.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	ch, reqs, err := nch.Accept()
	if err != nil {
		c.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	stop := context.AfterFunc(ctx, func() { c.Close(); ch.Close() })
	defer stop()
	done := make(chan struct{})
	go func() {
		io.Copy(ch, c)
		ch.CloseWrite()
		close(done)
	}()
	io.Copy(c, ch)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	<-done
	c.Close()
	ch.Close()
}
