// Package agent is the guest half of "moat attach": an SSH server that runs
// inside every sandbox and turns SSH session channels into processes owned
// by the sandbox user.
//
// SSH rather than a bespoke protocol because it already carries everything
// an interactive session needs (PTY, window changes, signals, exit codes,
// environment, stdin EOF) and because OpenSSH and editors can then reach the
// sandbox through "moat ssh-config" with no extra tooling. The server trusts
// exactly one public key, the daemon's per-sandbox key: there is no password,
// keyboard-interactive or "none" authentication.
//
// The invariant the package exists to keep is that nothing outlives a
// session: every session's processes run in their own process group (a new
// session with a PTY), and that group is killed when the command exits, when
// the client closes the channel, and when the connection goes away.
package agent

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// Server is the guest SSH server. The zero value is not usable: HostKey and
// AuthorizedKey are required, and Serve refuses to start without them rather
// than accept every key.
type Server struct {
	HostKey       ssh.Signer
	AuthorizedKey ssh.PublicKey // the only key accepted

	// UID, GID and Groups are the identity sessions run as. When the agent
	// already runs as UID no credential change is attempted, which is what
	// lets tests and a non-root agent work.
	UID, GID int
	Groups   []uint32

	Home  string
	Shell string   // "/bin/sh" when empty or missing on disk
	Dir   string   // default working directory (the workspace); Home when empty
	Env   []string // sessions' base environment: read only once Ready is closed, so PID 1 may complete it until then
	Log   *slog.Logger

	// Children is set when the agent runs inside PID 1, which must then
	// reap orphans without taking the agent's own children; see Children.
	Children *Children

	// Ready, when set, holds every channel until it is closed: PID 1
	// serves the agent (and so lets the daemon connect and authenticate)
	// while it is still writing the user's files, and no session may start
	// before those exist.
	Ready <-chan struct{}

	// GlobalRequest, when set, answers the connection's global requests
	// (the daemon's "oomkill@moat.dev"); unset, they are refused.
	GlobalRequest func(name string, payload []byte) (ok bool, reply []byte)

	// AgentSocket, when set, is where the guest's ssh-agent listens
	// (sshagent.go); sessions get SSH_AUTH_SOCK pointing at it.
	AgentSocket string
	agents      agentConns

	// SFTPCommand runs the sftp subsystem (moat's own "__sftp"); unset,
	// the subsystem is refused.
	SFTPCommand []string

	// cfg is the configuration new connections get; Rekey replaces it.
	cfg atomic.Pointer[ssh.ServerConfig]
}

// Rekey makes the agent present host and accept only auth from its next
// connection on, and gives later sessions env as their base environment:
// a forked sandbox's guest, restored from its parent's image, takes its
// own identity this way (moat fork). Connections already made keep the
// keys they were made with. The caller makes sure no session reads Env
// meanwhile: the daemon rekeys before it lets any session in.
func (s *Server) Rekey(host ssh.Signer, auth ssh.PublicKey, env []string) error {
	if host == nil || auth == nil {
		return errors.New("rekeying: no host key or no authorized key")
	}
	s.HostKey, s.AuthorizedKey, s.Env = host, auth, env
	cfg, err := s.config()
	if err != nil {
		return err
	}
	s.cfg.Store(cfg)
	return nil
}

// handshakeTimeout bounds how long an unauthenticated peer can hold a
// connection open: 10 s is generous for a loopback-speed netstack link and
// short enough that stuck dials do not pile up.
const handshakeTimeout = 10 * time.Second

// errUnauthorized is returned to the SSH library for every rejected key; the
// client only ever learns that authentication failed.
var errUnauthorized = errors.New("public key not authorized")

// Serve accepts connections on ln until ctx is done, then closes ln, tears
// down every connection (killing its sessions' processes) and waits for them.
// It returns nil after ctx is done and an error if ln fails for another
// reason.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	cfg, err := s.config()
	if err != nil {
		return err
	}
	s.cfg.Store(cfg)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	if s.AgentSocket != "" {
		if err := s.serveAgentSocket(ctx); err != nil {
			s.log().Warn("serving the ssh-agent socket", "err", err)
		}
	}
	var conns sync.WaitGroup
	err = s.accept(ctx, ln, &conns)
	stop()
	cancel()
	conns.Wait()
	return err
}

func (s *Server) config() (*ssh.ServerConfig, error) {
	// Fail closed: a server without a key to compare against would have to
	// either reject everything (useless) or accept everything (dangerous).
	if s.HostKey == nil {
		return nil, errors.New("configuring ssh server: no host key")
	}
	if s.AuthorizedKey == nil {
		return nil, errors.New("configuring ssh server: no authorized key")
	}
	want := s.AuthorizedKey.Marshal()
	cfg := &ssh.ServerConfig{
		ServerVersion: "SSH-2.0-moat-agent",
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if subtle.ConstantTimeCompare(key.Marshal(), want) == 1 {
				return &ssh.Permissions{}, nil
			}
			s.log().Warn("rejecting unauthorized public key",
				"remote", meta.RemoteAddr().String(), "user", meta.User(),
				"fingerprint", ssh.FingerprintSHA256(key))
			return nil, errUnauthorized
		},
	}
	cfg.AddHostKey(s.HostKey)
	return cfg, nil
}

func (s *Server) accept(ctx context.Context, ln net.Listener, conns *sync.WaitGroup) error {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accepting connections: %w", err)
			}
			// Transient failures (EMFILE, ECONNABORTED) must not take the
			// agent down with every session in it; back off like net/http.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log().Warn("accepting connection", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		backoff = 0
		cfg := s.cfg.Load()
		conns.Go(func() {
			defer s.recoverPanic("connection")
			s.serveConn(ctx, nc, cfg)
		})
	}
}

// channelHandler serves one accepted-for-dispatch channel until it is done.
// direct-tcpip (port forwarding) slots in here beside "session".
type channelHandler func(ctx context.Context, nch ssh.NewChannel)

func (s *Server) channelHandler(typ string) channelHandler {
	switch typ {
	case "session":
		return s.serveSession
	case "direct-tcpip":
		return s.serveDirectTCPIP
	}
	return nil
}

func (s *Server) serveConn(ctx context.Context, nc net.Conn, cfg *ssh.ServerConfig) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Closing the net.Conn is the one way to unblock both the handshake and
	// the SSH mux, so it is also how cancellation reaches this connection.
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	defer nc.Close()

	log := s.log().With("remote", nc.RemoteAddr().String())
	nc.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(nc, cfg)
	if err != nil {
		log.Warn("rejecting connection", "err", err)
		return
	}
	nc.SetDeadline(time.Time{})
	log.Debug("connection authenticated", "user", sc.User())
	s.agents.set(sc)
	defer s.agents.drop(sc)

	var wg sync.WaitGroup
	// Global requests (keepalives today, tcpip-forward later) must be
	// serviced or the mux stalls; the loop ends when the connection closes.
	wg.Go(func() {
		for r := range reqs {
			ok, reply := false, []byte(nil)
			if s.GlobalRequest != nil {
				ok, reply = s.GlobalRequest(r.Type, r.Payload)
			}
			if r.WantReply {
				r.Reply(ok, reply)
			}
		}
	})
	for nch := range chans {
		h := s.channelHandler(nch.ChannelType())
		if h == nil {
			nch.Reject(ssh.UnknownChannelType, fmt.Sprintf("channel type %q is not supported", nch.ChannelType()))
			continue
		}
		wg.Go(func() {
			defer s.recoverPanic("channel")
			h(ctx, nch)
		})
	}
	// chans is closed: the peer is gone. Cancelling tells every session to
	// kill its process group; wait so none is left running unowned.
	cancel()
	wg.Wait()
	log.Debug("connection closed")
}

// recoverPanic keeps a bug in one connection or channel from taking the
// agent down with every other session, and, when the agent runs inside
// PID 1, the whole sandbox: the failure is logged and that one connection
// or channel ends, as net/http does for a handler.
func (s *Server) recoverPanic(what string) {
	if v := recover(); v != nil {
		s.log().Error("panic serving "+what, "panic", v, "stack", string(debug.Stack()))
	}
}

func (s *Server) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}

// shell returns the configured shell, or /bin/sh when it is unset or missing
// so that a bad image or passwd entry still leaves the sandbox reachable.
func (s *Server) shell() string {
	if s.Shell != "" {
		if _, err := os.Stat(s.Shell); err == nil {
			return s.Shell
		}
	}
	return "/bin/sh"
}

// credential is nil when the agent already runs as the session user, so a
// non-root agent (tests, rootless runtimes) never attempts setuid.
func (s *Server) credential() *syscall.Credential {
	if os.Getuid() == s.UID {
		return nil
	}
	// Groups is copied into the credential as-is; an empty list still calls
	// setgroups(0), dropping root's supplementary groups.
	return &syscall.Credential{Uid: uint32(s.UID), Gid: uint32(s.GID), Groups: s.Groups}
}

// defaultDir is where sessions start when the client names no directory.
func (s *Server) defaultDir() string {
	switch {
	case s.Dir != "":
		return s.Dir
	case s.Home != "":
		return s.Home
	}
	return "/"
}
