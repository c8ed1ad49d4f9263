package session

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// Proxy is the daemon's half of every session. It keeps one authenticated
// SSH connection to the guest agent and serves local clients (the CLI,
// through the control socket) as an SSH server of its own, carrying each
// of their channels on a channel of that one connection. The client still
// speaks SSH end to end and still checks the agent's host key, which the
// proxy presents; what it no longer pays is a handshake with the guest.
//
// That handshake is about six round trips through the guest's network
// stack plus a key exchange whose other half runs inside gVisor: 20 to 25
// ms on a 2-core systrap host, the largest part of a warm `moat exec`,
// against about 1 ms for a handshake with the daemon over a unix socket.
// OpenSSH's ControlMaster multiplexes for the same reason.
//
// The session semantics stay the agent's: a channel the client closes, or
// whose connection drops, is closed towards the agent, which hangs up its
// process group.
type Proxy struct {
	dial   func(ctx context.Context) (net.Conn, error)
	client *ssh.ClientConfig
	server *ssh.ServerConfig
	log    *slog.Logger
	agent  func() AgentConn

	mu    sync.Mutex
	guest *ssh.Client // guarded by mu; nil until connected, and after it fails
}

// ProxyConfig configures NewProxy.
type ProxyConfig struct {
	// Dial opens a new connection to the guest agent's SSH port.
	Dial func(ctx context.Context) (net.Conn, error)
	// Client authenticates the proxy to the agent, and is the one key a
	// local client must present.
	Client ssh.Signer
	// Host is the agent's host key: the agent must prove it, and the proxy
	// presents it to local clients, so a client verifies the same key
	// whether it reaches the agent directly or through the proxy.
	Host ssh.Signer
	Log  *slog.Logger
	// Agent, when set, serves the ssh-agent channels the guest opens
	// ("auth-agent@openssh.com", from the agent socket in the guest):
	// each channel gets a fresh agent, closed when the channel ends.
	// Unset, the guest's agent channels are refused.
	Agent func() AgentConn
}

// AgentConn is an ssh-agent for one channel.
type AgentConn interface {
	agent.Agent
	Close() error
}

// handshakeTimeout bounds an SSH handshake, with the guest or a local
// client: the guest's first one, in a sandbox that has only just booted,
// takes a few hundred milliseconds on a loaded host.
const handshakeTimeout = 10 * time.Second

// NewProxy returns a proxy that connects to the guest on first use, or
// when Handshake hands it a connection.
func NewProxy(c ProxyConfig) *Proxy {
	want := c.Client.PublicKey().Marshal()
	server := &ssh.ServerConfig{
		ServerVersion: "SSH-2.0-moat-daemon",
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if subtle.ConstantTimeCompare(key.Marshal(), want) == 1 {
				return &ssh.Permissions{}, nil
			}
			return nil, errors.New("public key not authorized")
		},
	}
	server.AddHostKey(c.Host)
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Proxy{dial: c.Dial, client: ClientConfig(c.Client, c.Host.PublicKey()), server: server, log: log, agent: c.Agent}
}

// ClientConfig is how moat's own clients (the CLI, the proxy) talk to an
// agent or a proxy: the sandbox's client key, the agent's host key, and one
// choice of algorithms each. Both ends are always moat, on one host, so
// there is nothing to negotiate: curve25519 is the cheapest key exchange
// (the default hybrid ML-KEM exchange costs about 3 ms more per handshake),
// and AES-GCM runs on the CPU's AES instructions.
func ClientConfig(key ssh.Signer, hostKey ssh.PublicKey) *ssh.ClientConfig {
	return &ssh.ClientConfig{
		User:              "agent",
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback:   ssh.FixedHostKey(hostKey),
		HostKeyAlgorithms: []string{hostKey.Type()},
		Config: ssh.Config{
			KeyExchanges: []string{ssh.KeyExchangeCurve25519},
			Ciphers:      []string{ssh.CipherAES128GCM},
		},
		Timeout: handshakeTimeout,
	}
}

// Handshake authenticates to the agent over conn and keeps the connection
// for the sessions to come, replacing any earlier one. The daemon calls it
// while the guest boots: the first handshake that succeeds is the sign
// that the agent is up.
func (p *Proxy) Handshake(conn net.Conn) error {
	c, err := p.handshake(conn)
	if err != nil {
		return err
	}
	p.mu.Lock()
	old := p.guest
	p.guest = c
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
	go p.forget(c)
	return nil
}

func (p *Proxy) handshake(conn net.Conn) (*ssh.Client, error) {
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	cc, chans, reqs, err := ssh.NewClientConn(conn, "guest", p.client)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("connecting to the guest agent: %w", err)
	}
	conn.SetDeadline(time.Time{})
	c := ssh.NewClient(cc, chans, reqs)
	if p.agent != nil {
		go p.serveAgent(c.HandleChannelOpen("auth-agent@openssh.com"))
	}
	return c, nil
}

// serveAgent answers the guest's agent channels.
func (p *Proxy) serveAgent(chans <-chan ssh.NewChannel) {
	for nch := range chans {
		ch, reqs, err := nch.Accept()
		if err != nil {
			continue
		}
		go ssh.DiscardRequests(reqs)
		go func() {
			a := p.agent()
			defer a.Close()
			defer ch.Close()
			agent.ServeAgent(a, ch)
		}()
	}
}

// forget drops c once its connection ends (the agent restarted, the guest
// stopped), so the next session dials again.
func (p *Proxy) forget(c *ssh.Client) {
	err := c.Wait()
	p.mu.Lock()
	if p.guest == c {
		p.guest = nil
	}
	p.mu.Unlock()
	p.log.Debug("guest connection closed", "err", err)
}

// guestClient returns the connection to the agent, dialing one if there is
// none.
func (p *Proxy) guestClient(ctx context.Context) (*ssh.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.guest != nil {
		return p.guest, nil
	}
	conn, err := p.dial(ctx)
	if err != nil {
		return nil, err
	}
	c, err := p.handshake(conn)
	if err != nil {
		return nil, err
	}
	p.guest = c
	go p.forget(c)
	return c, nil
}

// GlobalRequest sends a global request to the agent on the shared
// connection and returns its answer; bounded by ctx.
func (p *Proxy) GlobalRequest(ctx context.Context, name string, payload []byte) (ok bool, reply []byte, err error) {
	c, err := p.guestClient(ctx)
	if err != nil {
		return false, nil, err
	}
	type answer struct {
		ok    bool
		reply []byte
		err   error
	}
	ch := make(chan answer, 1)
	go func() {
		ok, reply, err := c.SendRequest(name, true, payload)
		ch <- answer{ok, reply, err}
	}()
	select {
	case a := <-ch:
		return a.ok, a.reply, a.err
	case <-ctx.Done():
		return false, nil, ctx.Err()
	}
}

// Close closes the connection to the agent.
func (p *Proxy) Close() {
	p.mu.Lock()
	c := p.guest
	p.guest = nil
	p.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Serve serves one local client on nc until it disconnects, and closes nc.
// Every channel the client opens is opened on the agent's connection; when
// the client goes away, each of its channels is closed there.
func (p *Proxy) Serve(nc net.Conn) {
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(nc, p.server)
	if err != nil {
		p.log.Warn("rejecting local ssh client", "err", err)
		return
	}
	nc.SetDeadline(time.Time{})
	defer sc.Close()
	var wg sync.WaitGroup
	// Global requests (keepalives) are answered "no" as the agent would;
	// the loop ends with the connection.
	wg.Go(func() { ssh.DiscardRequests(reqs) })
	for nch := range chans {
		wg.Go(func() { p.forward(nch) })
	}
	wg.Wait()
}

// forward opens nch's twin on the agent's connection and splices the two.
// The agent's refusal, and its reason, reach the client unchanged.
func (p *Proxy) forward(nch ssh.NewChannel) {
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	g, err := p.guestClient(ctx)
	cancel()
	if err != nil {
		nch.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	gch, greqs, err := g.OpenChannel(nch.ChannelType(), nch.ExtraData())
	if err != nil {
		var oce *ssh.OpenChannelError
		if errors.As(err, &oce) {
			nch.Reject(oce.Reason, oce.Message)
			return
		}
		nch.Reject(ssh.ConnectionFailed, "opening a channel to the guest agent: "+err.Error())
		return
	}
	lch, lreqs, err := nch.Accept()
	if err != nil {
		gch.Close()
		return
	}
	splice(lch, lreqs, gch, greqs)
}

// splice relays one channel pair until the agent's side has closed and
// everything it sent has been passed on: data and stderr, EOF once both are
// drained, and requests (exit-status, exit-signal) with their replies; the
// client's data, EOF and requests (env, pty-req, exec, window-change,
// signal) the other way. The client closing its side closes the agent's.
func splice(local ssh.Channel, lreqs <-chan *ssh.Request, guest ssh.Channel, greqs <-chan *ssh.Request) {
	go func() {
		io.Copy(guest, local)
		guest.CloseWrite()
	}()
	// relaying is held while a client's request waits for the agent's
	// reply. A short command can exit, and the agent close its channel,
	// before that reply has been passed on; closing the client's channel
	// first would lose it (the client would see its exec fail with EOF).
	var relaying sync.Mutex
	go func() {
		for req := range lreqs {
			relaying.Lock()
			ok, err := guest.SendRequest(req.Type, req.WantReply, req.Payload)
			if req.WantReply {
				req.Reply(ok && err == nil, nil)
			}
			relaying.Unlock()
		}
		// The client closed the channel, or its connection is gone: the
		// agent hangs up the command.
		guest.Close()
	}()
	var data, all sync.WaitGroup
	data.Go(func() { io.Copy(local, guest) })
	data.Go(func() { io.Copy(local.Stderr(), guest.Stderr()) })
	all.Go(func() {
		data.Wait()
		local.CloseWrite()
	})
	all.Go(func() {
		for req := range greqs {
			ok, err := local.SendRequest(req.Type, req.WantReply, req.Payload)
			if req.WantReply {
				req.Reply(ok && err == nil, nil)
			}
		}
	})
	all.Wait()
	relaying.Lock()
	local.Close()
	relaying.Unlock()
}
