package gate

// Host-local MCP servers: a server on the host's own loopback (an
// editor's, a local tool's), declared as [mcp.NAME] url =
// "http://127.0.0.1:PORT/PATH". The guest reaches it at the gateway's
// PORT, and nowhere else: the daemon's front end for the gateway's ports
// (internal/daemon/forward.go, the reverse forwards' netstack.GatewayPorts)
// hands each connection to that port to ServeLocalMCP, which reads it as
// HTTP and decides every request with the same code as a remote
// server's (mcpAdmit, mcpAnswer, mcpAudit): rules per tool and resource,
// JSON-RPC errors for refusals, filtered listings, one record per call,
// the watcher. Only the front differs: plain HTTP from the guest instead
// of TLS the gate terminates, and an upstream that is the host's
// 127.0.0.1:PORT instead of a name the policy decided.
//
// Why here and not as a reverse forward: a forward copies bytes, so the
// host's port would be open to anything the guest sends. Why in this
// process: it is the one that already parses the guest's bytes and
// already dials the host's loopback for reverse forwards; the dialer
// below reaches only 127.0.0.1 on a declared server's port, checked
// again at each dial, so the declaration adds exactly that port and only
// for requests the rules let through.
//
// A request outside the server's path, a body that is not MCP, an
// upgrade (a WebSocket would carry calls unread) and an HTTP method
// streamable HTTP does not use are refused and audited; bytes that are
// not HTTP get net/http's 400 and the connection closes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"moat.dev/moat/internal/audit"
)

// mcpLocal is the machinery of the host-local servers, shared by their
// connections: one HTTP server for the guest's side, one transport (and
// its pool of connections to the host's ports) for the other.
type mcpLocal struct {
	server    *http.Server
	transport *http.Transport
	proxy     *httputil.ReverseProxy
}

// localDialTimeout bounds a dial of the host's loopback: a server there
// answers at once or is not running.
const localDialTimeout = 5 * time.Second

func (g *Gate) newMCPLocal() *mcpLocal {
	if !slices.ContainsFunc(g.o.MCP, func(s MCPServer) bool { return s.Local }) {
		return nil
	}
	discard := log.New(io.Discard, "", 0)
	l := &mcpLocal{}
	l.server = &http.Server{
		// HTTP/1.1 only: the guest connects in the clear, and h2c is
		// not offered (nothing that speaks MCP needs it).
		Handler:           http.HandlerFunc(g.serveLocalMCP),
		ReadHeaderTimeout: guestHeader,
		IdleTimeout:       guestIdle,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          discard,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if lc, ok := c.(*localConn); ok {
				return context.WithValue(ctx, localConnKey{}, lc)
			}
			return ctx
		},
	}
	l.transport = &http.Transport{
		Proxy:                 nil,
		DialContext:           g.dialLocal,
		ResponseHeaderTimeout: upstreamHeaders,
		MaxIdleConnsPerHost:   32,
		// Bounds the host's sockets one server's guest requests open
		// (an SSE stream holds one for its life); more wait for one.
		MaxConnsPerHost:        256,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: 1 << 20,
		// The answer is read to filter it: asked for as identity
		// (mcpAdmit drops Accept-Encoding), never decompressed here.
		DisableCompression: true,
	}
	l.proxy = &httputil.ReverseProxy{
		Rewrite:        rewriteLocal,
		Transport:      l.transport,
		FlushInterval:  -1, // SSE events reach the guest as they are whole
		ErrorLog:       discard,
		ErrorHandler:   g.localFailed,
		ModifyResponse: g.modifyResponse,
		BufferPool:     proxyBuffers{},
	}
	return l
}

// LocalMCPPort reports whether a host-local MCP server is declared on the
// gateway's port: the daemon's front end then hands its connections to
// ServeLocalMCP instead of refusing them.
func (g *Gate) LocalMCPPort(port uint16) bool {
	return g.local != nil && slices.ContainsFunc(g.o.MCP, func(s MCPServer) bool { return s.Local && s.Port == port })
}

// localConn is a guest's connection to a host-local server's gateway
// port, as the HTTP server serves it.
type localConn struct {
	net.Conn
	port   uint16
	once   sync.Once
	closed chan struct{}
}

func (c *localConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

type localConnKey struct{}

// ServeLocalMCP serves the guest's connection c to the gateway's port
// until it ends or ctx does. A port no server is declared on gets c
// closed at once (the front end asks LocalMCPPort first).
func (g *Gate) ServeLocalMCP(ctx context.Context, c net.Conn, port uint16) {
	if !g.LocalMCPPort(port) {
		c.Close()
		return
	}
	lc := &localConn{Conn: c, port: port, closed: make(chan struct{})}
	stop := context.AfterFunc(ctx, func() { lc.Close() })
	defer stop()
	g.local.server.Serve(&oneConn{c: lc, closed: lc.closed})
}

// localServerFor is the host-local server on port whose path p is on.
func (g *Gate) localServerFor(port uint16, p string) *MCPServer {
	for i := range g.o.MCP {
		s := &g.o.MCP[i]
		if s.Local && s.Port == port && mcpPathUnder(p, s.Path) {
			return s
		}
	}
	return nil
}

// localPaths lists the paths served on port, for a refusal.
func (g *Gate) localPaths(port uint16) string {
	var ps []string
	for _, s := range g.o.MCP {
		if s.Local && s.Port == port {
			ps = append(ps, s.Path)
		}
	}
	return strings.Join(ps, ", ")
}

// serveLocalMCP decides one request on a host-local server's port and,
// if allowed, carries it to the host's 127.0.0.1.
func (g *Gate) serveLocalMCP(w http.ResponseWriter, r *http.Request) {
	lc, _ := r.Context().Value(localConnKey{}).(*localConn)
	if lc == nil {
		// Not a connection ServeLocalMCP set up: cannot happen, fail closed.
		http.Error(w, "moat: no decision for this connection", http.StatusForbidden)
		return
	}
	start := g.o.Now()
	rs := &reqState{rec: audit.Record{Time: start.UTC(), Proto: "http", Dst: lc.LocalAddr().String(),
		Method: clip(r.Method, 32), Path: auditPath(r.URL.EscapedPath(), g.o.Credentials)}}
	rec := &rs.rec
	done := func(status int) {
		rec.Status = status
		rec.DurationMS = g.o.Now().Sub(start).Milliseconds()
		if rec.Verdict == audit.Allow {
			g.audit(*rec)
		} else {
			// Not a destination to allow (the ledger's kind of denial):
			// nothing but the declared path is ever served here.
			g.auditMCP(*rec)
		}
	}
	if n := requests.Add(1); n > maxRequests {
		requests.Add(-1)
		rec.Verdict, rec.Reason = audit.Deny, audit.ReasonTooManyRequests
		w.Header().Set("Retry-After", "1")
		http.Error(w, "moat: too many requests in flight through the gate; retry", http.StatusServiceUnavailable)
		done(http.StatusServiceUnavailable)
		return
	}
	defer requests.Add(-1)
	s := g.localServerFor(lc.port, r.URL.EscapedPath())
	if s == nil {
		paths := g.localPaths(lc.port)
		rec.Verdict, rec.Reason = audit.Deny, audit.NotMCPLocalPath(paths)
		http.Error(w, fmt.Sprintf("moat: gateway port %d serves only the MCP endpoint %s of a server on the host; nothing else on the host's port is reachable from the sandbox",
			lc.port, paths), http.StatusNotFound)
		done(http.StatusNotFound)
		return
	}
	rec.Rule, rec.Reason = "mcp."+s.Name, audit.ReasonMCPLocal
	rec.Upstream = net.JoinHostPort(s.Host, strconv.Itoa(int(s.Port)))
	if c := g.o.Credentials; c != nil && c.Scrubs() {
		// No value is ever sent to the host's server (no secret is bound
		// to it), but one may be in what it answers: the host's own
		// environment and files are at hand there.
		rs.scrubHeader, rs.scrub = true, true
	}
	if !g.mcpAdmit(w, r, rs, s) {
		return // answered and audited (mcpRefuseBody, mcpRefuseCalls)
	}
	defer g.mcpAudit(rs, start)
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &countingBody{ReadCloser: r.Body, n: &rs.up}
	}
	ctx := context.WithValue(r.Context(), reqStateKey{}, rs)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		a := i.Conn.RemoteAddr().String()
		rs.upstream.Store(&a)
	}})
	cw := &statusWriter{ResponseWriter: w}
	g.local.proxy.ServeHTTP(cw, r.WithContext(ctx))
	if rec.Verdict == "" {
		rec.Verdict = audit.Allow
	}
	rec.BytesUp, rec.BytesDown = rs.up.Load(), rs.down.Load()
	done(cw.status)
}

// rewriteLocal points the request at the host's server. Host becomes
// the server's own 127.0.0.1:PORT: a local server that guards against
// DNS rebinding (the Go SDK's does by default) refuses any other.
func rewriteLocal(pr *httputil.ProxyRequest) {
	s := stateOf(pr.In).mcp.server
	hp := net.JoinHostPort(s.Host, strconv.Itoa(int(s.Port)))
	pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", hp, hp
}

// dialLocal dials the host's loopback, on a declared local server's
// port only: whatever addr the transport asks for, nothing else is
// reachable through it.
func (g *Gate) dialLocal(ctx context.Context, _, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || ap.Addr() != netip.AddrFrom4([4]byte{127, 0, 0, 1}) || !g.LocalMCPPort(ap.Port()) {
		return nil, fmt.Errorf("%s is not a host-local MCP server's address; refused", clip(addr, 64))
	}
	d := net.Dialer{Timeout: localDialTimeout}
	return d.DialContext(ctx, "tcp4", ap.String())
}

// localFailed answers a request the host's server did not: as a JSON-RPC
// error, which an MCP client shows, saying what to check.
func (g *Gate) localFailed(w http.ResponseWriter, r *http.Request, err error) {
	rs := stateOf(r)
	var ue *url.Error
	for errors.As(err, &ue) {
		err = ue.Err
	}
	msg := err.Error()
	if g.o.Credentials != nil {
		msg = g.o.Credentials.ScrubString(msg)
	}
	name, at := "", ""
	if rs != nil {
		rs.rec.Reason = audit.MCPLocalFailed(msg)
		rs.rec.Verdict = audit.Allow
		name, at = rs.mcp.server.Name, rs.rec.Upstream
	}
	if r.Context().Err() != nil {
		return // the guest went away
	}
	writeJSON(w, http.StatusBadGateway, rpcError(json.RawMessage("null"), -32603,
		fmt.Sprintf("moat: MCP server %q on the host's %s did not answer: %s; is it running?", name, at, msg), nil))
}
