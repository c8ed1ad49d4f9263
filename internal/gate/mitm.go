package gate

// TLS interception. Most allowed TLS is spliced: the gate reads the SNI,
// decides, and copies bytes it cannot read, so pinned certificates and
// mutual TLS keep working and a bulk download costs two copies. Some hosts
// need the gate to read the requests: a host a secret is bound to (the
// gate swaps the placeholder for the value on the way out and scrubs the
// value from the answer), a host with method/path rules (each request is
// decided), and every host when the network config says inspect = true.
// For those the gate is the guest's TLS server, with a leaf certificate
// minted by the sandbox's CA for the name the policy allowed, and a client
// of the real host, verified against the host's roots.
//
// Requests are carried by net/http and httputil.ReverseProxy rather than by
// hand: HTTP/2 on both legs, WebSocket upgrades, trailers, 100-continue and
// hop-by-hop headers are each a source of request smuggling when
// re-implemented, and bodies stream through both (never buffered whole,
// never cut).
//
// What interception cannot do, by construction: a host that asks for a
// client certificate (mutual TLS) or that the guest pins cannot be
// intercepted, so only hosts that need it are; and after a WebSocket
// upgrade the gate copies the stream as bytes, so a placeholder inside a
// WebSocket message is not swapped (frames carry their length, and the
// two differ in length); from a bound host, frames are read one by one
// and scrubbed (wsscrub.go).
// Credentials go in the upgrade request's headers, where they are swapped.
//
// Everything else an answer carries is scrubbed of secret values: its
// header (names too), its body as it streams, its trailers and its 1xx
// responses, each on its own path through the proxy (modifyResponse,
// scrubTrailer, scrubbing1xx). A bound host's body in an encoding the gate
// cannot read is dropped, never passed on unscrubbed.

import (
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/peek"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/secret"
)

// Certs mints the certificates the gate presents when it terminates TLS;
// the sandbox's CA (tlsca.CA) is one. Leaf is called only for a name the
// policy has decided on, and must be safe for concurrent use.
type Certs interface {
	Leaf(name string) (*tls.Certificate, error)
}

// Credentials holds the sandbox's secrets: which hosts they are bound to,
// and how to swap a placeholder for the value in a request and the value
// back for the placeholder in an answer. The secret package's Set is one.
type Credentials interface {
	// Bound reports whether any secret is bound to host: its traffic is
	// intercepted, and refused over plain HTTP.
	Bound(host string) bool
	// Request swaps placeholders for values in a request to host and
	// returns the names of the secrets swapped and where. An error
	// (secret.ErrRequired) refuses the request; its text names the
	// secret, never the value, and is shown to the guest.
	Request(host string, h http.Header, u *url.URL) (secret.Applied, error)
	// ScrubHeader replaces values with placeholders in an answer's header.
	ScrubHeader(h http.Header)
	// ScrubBody does the same to a body as it streams.
	ScrubBody(body io.ReadCloser) io.ReadCloser
	// ScrubString does it to one string (for the audit).
	ScrubString(s string) string
	// Scrubs reports whether there are values to scrub at all.
	Scrubs() bool
}

// maxRequests bounds the requests in flight through intercepted
// connections, across the daemon. Each holds a goroutine or two and
// buffers on both legs, and HTTP/2 lets one connection carry many: 8192
// connections times 100 streams would take the daemon's memory with them
// (threat model 30). 4096 is far above what an agent or a build keeps in
// flight; beyond it a request is answered 503 with Retry-After.
const maxRequests = 4096

var requests atomic.Int64

// Timeouts of the intercepted path. None applies to bodies: a download,
// an upload, a WebSocket or an event stream may last hours.
const (
	// guestIdle: how long a kept-alive guest connection may sit between
	// requests. Clients pool connections for about as long.
	guestIdle = 2 * time.Minute
	// guestHeader: how long a request head may take to arrive once begun
	// (slow-loris, threat model 30).
	guestHeader = 30 * time.Second
	// upstreamHandshake bounds the TLS handshake with the real host.
	upstreamHandshake = 10 * time.Second
	// upstreamHeaders bounds the wait for an answer's head. 15 min:
	// model APIs answer a request that is not streamed only once the whole
	// completion is written, and allow that up to 10 minutes.
	upstreamHeaders = 15 * time.Minute
	// refusedFor bounds a connection kept open only to show the refusal
	// page: long enough for a client to send its request and read it.
	refusedFor = 10 * time.Second
	// maxAuditPath bounds the path written to the audit.
	maxAuditPath = 512
)

// mitm is the gate's shared machinery for intercepted connections: one
// TLS config (so session tickets work across connections), one HTTP
// server serving every intercepted connection, and one upstream transport
// whose connection pool all of them share.
type mitm struct {
	tls       *tls.Config
	server    *http.Server
	transport *http.Transport
	proxy     *httputil.ReverseProxy
}

func (g *Gate) newMITM() *mitm {
	m := &mitm{}
	m.tls = &tls.Config{
		// The name is the one the policy decided on, carried by the
		// connection, not what crypto/tls parsed again from the same bytes.
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			gc, ok := hello.Conn.(*guestConn)
			if !ok {
				return nil, errors.New("connection not from the gate")
			}
			return g.o.Certs.Leaf(gc.ic.name)
		},
		NextProtos: []string{"h2", "http/1.1"},
		MinVersion: tls.VersionTLS12,
	}
	discard := log.New(io.Discard, "", 0)
	m.server = &http.Server{
		Handler:           http.HandlerFunc(g.serveIntercepted),
		ReadHeaderTimeout: guestHeader,
		// 100 streams a connection (the HTTP/2 default is 250): see
		// maxRequests.
		HTTP2:          &http.HTTP2Config{MaxConcurrentStreams: 100},
		IdleTimeout:    guestIdle,
		MaxHeaderBytes: 1 << 20,
		// net/http logs what it cannot serve with the request's URL in
		// it, and a URL may carry a token in its query: nothing is logged.
		ErrorLog: discard,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tls.Conn); ok {
				if gc, ok := tc.NetConn().(*guestConn); ok {
					return context.WithValue(ctx, interceptionKey{}, gc.ic)
				}
			}
			return ctx
		},
	}
	m.transport = &http.Transport{
		// Never the host's proxy variables: the gate dials what it decided.
		Proxy:       nil,
		DialContext: g.dialUpstream,
		TLSClientConfig: &tls.Config{
			RootCAs:    g.o.UpstreamRoots,
			MinVersion: tls.VersionTLS12,
		},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   upstreamHandshake,
		ResponseHeaderTimeout: upstreamHeaders,
		ExpectContinueTimeout: time.Second,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   32,
		// Bounds what one host's requests open upstream; more wait for a
		// connection (as long as their guest waits).
		MaxConnsPerHost:        256,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: 1 << 20,
		// 64 KiB: a bulk download moves in fewer, larger reads.
		ReadBufferSize:  64 << 10,
		WriteBufferSize: 64 << 10,
		// What an upstream may send over HTTP/2 before the gate reads it
		// (the guest reads it): Go's 4 MiB a stream, which a download over
		// a long path needs, but 16 MiB a connection instead of Go's
		// 1 GiB, so a guest that stops reading many streams of one
		// connection leaves at most that in the daemon.
		HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 4 << 20, MaxReceiveBufferPerConnection: 16 << 20},
	}
	m.proxy = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      scrubbing1xx{g: g, rt: m.transport},
		FlushInterval:  -1, // server-sent events and any trickle reach the guest as they arrive
		ErrorLog:       discard,
		ErrorHandler:   g.upstreamFailed,
		ModifyResponse: g.modifyResponse,
		BufferPool:     proxyBuffers{},
	}
	return m
}

// proxyBuffers lends the proxy 64 KiB copy buffers instead of allocating
// 32 KiB for every answer.
type proxyBuffers struct{}

var proxyBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func (proxyBuffers) Get() []byte  { return *proxyBufs.Get().(*[]byte) }
func (proxyBuffers) Put(b []byte) { proxyBufs.Put(&b) }

// interception is one guest connection the gate terminates.
type interception struct {
	name      string // the SNI, as the policy decided on it
	authority string // name:port, what the upstream is dialed as
	port      uint16
	dst       netip.AddrPort
	inspect   bool          // request rules apply: decide every request
	refused   *audit.Record // the SNI was denied: every request gets this refusal
	// granted is the watcher's answer that let the connection through
	// without a rule ("once", "hour"): it covers the connection's
	// requests too, as it would have on a spliced connection.
	granted string
	// mu guards active, the requests in flight: the connection's record
	// is written after those of its requests (an upgraded request
	// outlives the connection's HTTP server). Not a WaitGroup: an HTTP/2
	// handler may start just as its connection closes, an Add concurrent
	// with a Wait.
	mu     sync.Mutex
	active int
	idle   sync.Cond
}

func (ic *interception) begin() {
	ic.mu.Lock()
	ic.active++
	ic.mu.Unlock()
}

func (ic *interception) end() {
	ic.mu.Lock()
	if ic.active--; ic.active == 0 && ic.idle.L != nil {
		ic.idle.Broadcast()
	}
	ic.mu.Unlock()
}

// wait returns once no request is in flight.
func (ic *interception) wait() {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.idle.L == nil {
		ic.idle.L = &ic.mu
	}
	for ic.active > 0 {
		ic.idle.Wait()
	}
}

type interceptionKey struct{}

// interceptWhy says why the gate would terminate TLS to name: "" to splice.
// must is set when splicing is not an option (a secret or request rules
// depend on reading the requests); without Certs such a flow is refused.
func (g *Gate) interceptWhy(name string, d policy.Decision) (why string, must bool) {
	switch {
	case g.o.Credentials != nil && g.o.Credentials.Bound(name):
		return "a secret is bound to it", true
	case d.Inspect:
		return "request rules apply to it", true
	case g.mcpDeclared(name):
		return "an MCP server is declared on it", true
	case g.o.Inspect:
		return "inspect = true", false
	}
	return "", false
}

// intercept terminates the guest's TLS (head is the ClientHello already
// read) and carries its requests to the real host, each decided and
// audited on its own. It returns when the guest's connection is over.
func (g *Gate) intercept(ctx context.Context, c net.Conn, head []byte, tg target, dst netip.AddrPort, t *tcpTrace, why string) {
	ic := &interception{name: tg.name, authority: net.JoinHostPort(tg.name, strconv.Itoa(int(tg.port))),
		port: tg.port, dst: dst, inspect: t.dec.Inspect}
	if t.granted {
		ic.granted = t.rec.Rule
	}
	gc := newGuestConn(c, head, ic)
	t.rec.Verdict = t.verdict()
	t.rec.Reason = audit.TLSTerminated(why)
	g.traced(t)
	g.auditStart(t)
	if err := g.serveGuest(ctx, gc, 0); err != nil {
		t.rec.Reason = audit.GuestHandshake(err)
	} else {
		ic.wait()
	}
	t.rec.BytesUp, t.rec.BytesDown = gc.up.Load(), gc.down.Load()
	t.rec.DurationMS = g.o.Now().Sub(t.start).Milliseconds()
	g.auditEnd(t)
}

// refuseTLSLegibly answers a denied SNI. With a CA the guest trusts, the
// gate completes the handshake with a leaf for the denied name and
// answers every request with the same page plain HTTP gets, so an agent
// reads why instead of guessing at a handshake failure. The leaf is
// minted only after the policy decided (to deny), for the exact SNI, and
// the CA's cache bounds how many exist; a guest that sends many names
// costs one signature each, no more than the handshakes it pays for.
// Without an SNI (or with an encrypted ClientHello) there is no name to
// present a certificate for: those keep the TLS alert.
func (g *Gate) refuseTLSLegibly(ctx context.Context, c net.Conn, head []byte, dst netip.AddrPort, t *tcpTrace) {
	g.deny(t)
	if g.m == nil || t.sni == "" {
		refuseTLS(c)
		return
	}
	rec := t.rec
	ic := &interception{name: t.sni, port: dst.Port(), dst: dst, refused: &rec}
	g.serveGuest(ctx, newGuestConn(c, head, ic), refusedFor)
}

// serveGuest completes the TLS handshake with the guest and serves its
// requests until the connection ends, or for at most limit when it is
// not zero. It returns the handshake's error.
func (g *Gate) serveGuest(ctx context.Context, gc *guestConn, limit time.Duration) error {
	tc := tls.Server(gc, g.m.tls)
	hctx, cancel := context.WithTimeout(ctx, g.o.PeekTimeout)
	err := tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		tc.Close()
		return err
	}
	stop := context.AfterFunc(ctx, func() { tc.Close() })
	defer stop()
	if limit > 0 {
		tm := time.AfterFunc(limit, func() { tc.Close() })
		defer tm.Stop()
	}
	// The server hands the connection to its HTTP/1.1 or HTTP/2 side by
	// the protocol negotiated; Serve returns once the connection closed.
	g.m.server.Serve(&oneConn{c: tc, closed: gc.closed})
	return nil
}

// reqState is one intercepted request's audit record in the making,
// shared between the handler and the proxy's hooks.
type reqState struct {
	ic          *interception
	rec         audit.Record
	scrub       bool // the answer's body
	scrubHeader bool
	switched    bool // answered 101: the proxy wrote it on the hijacked connection
	upstream    atomic.Pointer[string]
	up, down    atomic.Int64

	// mcp is set for a request to a declared MCP server (mcpserve.go).
	mcp *mcpState
}

type reqStateKey struct{}

func stateOf(r *http.Request) *reqState {
	rs, _ := r.Context().Value(reqStateKey{}).(*reqState)
	return rs
}

// serveIntercepted decides one request inside an intercepted connection
// and, if allowed, carries it to the real host.
func (g *Gate) serveIntercepted(w http.ResponseWriter, r *http.Request) {
	ic, _ := r.Context().Value(interceptionKey{}).(*interception)
	if ic == nil {
		// Not a connection the gate set up: cannot happen, fail closed.
		http.Error(w, "moat: no decision for this connection", http.StatusForbidden)
		return
	}
	if ic.refused != nil {
		// Already audited (and counted in the ledger) as the connection's
		// denial: each request on it only shows the page, and the
		// connection closes after it (HTTP/2: a GOAWAY).
		w.Header().Set("Connection", "close")
		g.refusalFor(ic.name, ic.port, *ic.refused, false).serve(w)
		return
	}
	ic.begin()
	defer ic.end()
	creds := g.o.Credentials
	rs := &reqState{ic: ic, rec: audit.Record{
		Time: g.o.Now().UTC(), Proto: "http", Dst: ic.dst.String(), Name: ic.name, NameFrom: audit.FromSNI,
		Method: clip(r.Method, 32), Path: auditPath(r.URL.EscapedPath(), creds)}}
	start := g.o.Now()
	rec := &rs.rec
	var steps []audit.Step
	step := func(name string, ok bool, since time.Time) {
		if g.o.Trace {
			steps = append(steps, stepOf(name, ok, g.o.Now().Sub(since)))
		}
	}
	done := func(status int) {
		rec.Status = status
		rec.DurationMS = g.o.Now().Sub(start).Milliseconds()
		if g.o.Trace {
			rec.Steps, rec.RejectedBy = steps, rejectedBy(steps)
		}
		g.audit(*rec)
	}
	// refuse answers with the page; byRule says the policy refused this
	// request (request rules), so the page offers a request rule.
	refuse := func(reason audit.Reason, byRule bool) {
		rec.Verdict, rec.Reason = audit.Deny, reason
		rf := g.refusalFor(ic.name, ic.port, *rec, byRule)
		rf.serve(w)
		done(rf.status)
	}

	if n := requests.Add(1); n > maxRequests {
		requests.Add(-1)
		step(audit.StepCapacity, false, start)
		rec.Verdict, rec.Reason = audit.Deny, audit.ReasonTooManyRequests
		w.Header().Set("Retry-After", "1")
		http.Error(w, "moat: too many requests in flight through the gate; retry", http.StatusServiceUnavailable)
		done(http.StatusServiceUnavailable)
		return
	}
	defer requests.Add(-1)
	if host, ok := sameHost(r.Host, ic.name); !ok {
		step(audit.StepPolicy, false, start)
		refuse(audit.Fronting(clip(host, 256), ic.name), false)
		return
	}
	at := g.o.Now()
	d := g.decideRequest(ic, r)
	rec.Rule, rec.Layer = ruleOf(d)
	decider := audit.StepPolicy
	if ic.inspect {
		decider = audit.StepRequestRules
	}
	step(decider, d.Verdict == policy.Allow, at)
	if d.Verdict != policy.Allow {
		reason := audit.ReasonNoRule
		if d.Rule != nil {
			reason = audit.ReasonBlocked
		}
		switch {
		case g.report.Load():
			rec.Verdict, rec.Reason = audit.WouldDeny, reason
		case ic.granted != "" && d.Rule == nil:
			rec.Rule, rec.Layer = ic.granted, "interactive"
		default:
			refuse(reason, ic.inspect)
			return
		}
	}
	if creds != nil {
		at := g.o.Now()
		applied, err := creds.Request(ic.name, r.Header, r.URL)
		step(audit.StepSecrets, err == nil, at)
		if err != nil {
			// The rule that allowed the host did not decide this.
			rec.Rule, rec.Layer = "", ""
			refuse(audit.Reason(creds.ScrubString(err.Error())), false)
			return
		}
		rec.Transforms = applied
		// Values go only to bound hosts, so only their answers can echo
		// one: their bodies are scrubbed (Request asked them for an
		// identity encoding, which scrubbing needs). Every answer's
		// header is scrubbed; that costs nothing.
		rs.scrubHeader = creds.Scrubs()
		rs.scrub = rs.scrubHeader && creds.Bound(ic.name)
		if rs.scrub {
			// Compressed WebSocket frames cannot be scrubbed (wsscrub.go):
			// the host is not offered compression.
			r.Header.Del("Sec-WebSocket-Extensions")
		}
	}
	if s := g.mcpFor(ic, r); s != nil {
		if !g.mcpAdmit(w, r, rs, s) {
			return
		}
		defer g.mcpAudit(rs, start)
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &countingBody{ReadCloser: r.Body, n: &rs.up}
	}
	ctx := context.WithValue(r.Context(), reqStateKey{}, rs)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		a := i.Conn.RemoteAddr().String()
		rs.upstream.Store(&a)
	}})
	cw := &statusWriter{ResponseWriter: w}
	g.m.proxy.ServeHTTP(cw, r.WithContext(ctx))
	if rec.Verdict == "" {
		rec.Verdict = audit.Allow
	}
	if a := rs.upstream.Load(); a != nil {
		rec.Upstream = *a
	}
	rec.BytesUp, rec.BytesDown = rs.up.Load(), rs.down.Load()
	if cw.status == 0 && rs.switched {
		cw.status = http.StatusSwitchingProtocols
	}
	done(cw.status)
}

// decideRequest decides one request by the policy in force now: a rule
// change reaches requests on connections already open, not only new ones.
func (g *Gate) decideRequest(ic *interception, r *http.Request) policy.Decision {
	p := g.livePolicy()
	if p == nil {
		return policy.Decision{Verdict: policy.Deny}
	}
	if !ic.inspect {
		return p.Name(ic.name, ic.port)
	}
	// The path as it goes upstream, escapes kept: Request normalizes it
	// (and reads %2F both ways), so it decides what the host will see.
	return p.Request(ic.name, ic.port, r.Method, r.URL.EscapedPath())
}

// sameHost reports whether a request's Host (or :authority) names the
// TLS connection's name, the port dropped and the spelling normalised as
// the policy normalises names. It returns the host it compared.
func sameHost(hostport, name string) (string, bool) {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	n, err := policy.NormalizeName(host)
	if err != nil {
		return host, false
	}
	want, err := policy.NormalizeName(name)
	return host, err == nil && n == want
}

// rewrite points the outgoing request at the connection's host. The Host
// header stays what the guest sent: the same name, checked above.
func rewrite(pr *httputil.ProxyRequest) {
	rs := stateOf(pr.In)
	pr.Out.URL.Scheme = "https"
	pr.Out.URL.Host = rs.ic.authority
}

// scrubbing1xx scrubs the 1xx responses (103 Early Hints, 100 Continue)
// of the requests whose answers are scrubbed. The proxy copies a 1xx
// response's header to the guest from a ClientTrace hook of its own,
// before ModifyResponse sees anything, and a hook the handler adds to the
// request's context runs after the proxy's; one added here, between the
// proxy and the transport, runs first and scrubs the header the proxy
// then copies.
type scrubbing1xx struct {
	g  *Gate
	rt http.RoundTripper
}

func (t scrubbing1xx) RoundTrip(r *http.Request) (*http.Response, error) {
	if rs := stateOf(r); rs != nil && rs.scrubHeader {
		creds := t.g.o.Credentials
		r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
			Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
				creds.ScrubHeader(http.Header(h))
				return nil
			},
		}))
	}
	return t.rt.RoundTrip(r)
}

// unscrubbableError is an answer from a bound host whose body the gate
// cannot read to scrub: it is dropped, and the audit says why.
type unscrubbableError struct{ encoding string }

func (e *unscrubbableError) Error() string {
	return fmt.Sprintf("the answer is encoded with %q, which the gate cannot read to scrub secrets from it; it was dropped", clip(e.encoding, 64))
}

// modifyResponse scrubs secret values from the answer and counts it.
func (g *Gate) modifyResponse(resp *http.Response) error {
	rs := stateOf(resp.Request)
	if rs == nil {
		return nil
	}
	if rs.scrubHeader {
		g.o.Credentials.ScrubHeader(resp.Header)
		// The names the proxy announces in the Trailer header now; the
		// values once the body is read (scrubTrailer).
		g.o.Credentials.ScrubHeader(resp.Trailer)
	}
	if rs.scrub {
		if hasBody(resp) && resp.StatusCode != http.StatusSwitchingProtocols {
			body, err := decompressed(resp)
			if err != nil {
				return err
			}
			// The value and its placeholder may differ in length: the
			// length is no longer known, and the answer is chunked (or
			// framed by HTTP/2) instead.
			resp.Body = g.o.Credentials.ScrubBody(body)
			resp.ContentLength = -1
			resp.Header.Del("Content-Length")
		}
	}
	if rs.scrubHeader && resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body = &scrubTrailer{ReadCloser: resp.Body, resp: resp, creds: g.o.Credentials}
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// After an upgrade the body is the upstream's end of a byte
		// stream the proxy copies both ways (WebSocket frames are not
		// scrubbed: see the notes at the top of this file).
		rs.switched = true
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			return nil
		}
		if rs.scrub {
			if !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
				return fmt.Errorf("the answer switches to %q, a protocol the gate cannot scrub secrets from; it was dropped", clip(resp.Header.Get("Upgrade"), 64))
			}
			rwc = &wsScrubbing{ReadWriteCloser: rwc, s: &wsScrubber{r: rwc, creds: g.o.Credentials, rs: rs}}
		}
		resp.Body = &countingRWC{ReadWriteCloser: rwc, rs: rs}
		return nil
	}
	if rs.mcp != nil {
		if err := g.mcpAnswer(resp, rs.mcp); err != nil {
			return err
		}
	}
	resp.Body = &countingBody{ReadCloser: resp.Body, n: &rs.down}
	return nil
}

// decompressed is the answer's body as the gate can scrub it. Request
// asks bound hosts for identity encoding; one that compresses anyway
// with gzip or deflate is decompressed (the guest gets it as identity),
// any other encoding cannot be read and the answer is refused.
func decompressed(resp *http.Response) (io.ReadCloser, error) {
	ce := strings.ToLower(strings.TrimSpace(strings.Join(resp.Header.Values("Content-Encoding"), ",")))
	var open func(io.Reader) (io.Reader, error)
	switch ce {
	case "", "identity":
		return resp.Body, nil
	case "gzip", "x-gzip":
		open = func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }
	case "deflate":
		open = func(r io.Reader) (io.Reader, error) { return zlib.NewReader(r) }
	default:
		return nil, &unscrubbableError{encoding: ce}
	}
	resp.Header.Del("Content-Encoding")
	resp.Uncompressed = true
	return &lazyDecoder{src: resp.Body, open: open}, nil
}

// lazyDecoder opens its decompressor at the first Read: the gzip and zlib
// readers read their header when made, which would hold up the answer's
// head until the first bytes of its body came.
type lazyDecoder struct {
	src  io.ReadCloser
	open func(io.Reader) (io.Reader, error)
	r    io.Reader
}

func (l *lazyDecoder) Read(p []byte) (int, error) {
	if l.r == nil {
		r, err := l.open(l.src)
		if err != nil {
			return 0, err
		}
		l.r = r
	}
	return l.r.Read(p)
}

func (l *lazyDecoder) Close() error { return l.src.Close() }

// scrubTrailer scrubs the answer's trailers once its body is read: the
// transport fills resp.Trailer (HTTP/1.1 chunked, HTTP/2 trailing
// HEADERS) just before the body's EOF, and the proxy copies them to the
// guest after it.
type scrubTrailer struct {
	io.ReadCloser
	resp  *http.Response
	creds Credentials
}

func (b *scrubTrailer) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.creds.ScrubHeader(b.resp.Trailer)
	}
	return n, err
}

func hasBody(resp *http.Response) bool {
	switch {
	case resp.Request != nil && resp.Request.Method == http.MethodHead,
		resp.StatusCode == http.StatusNoContent, resp.StatusCode == http.StatusNotModified,
		resp.StatusCode < 200:
		return false
	}
	return true
}

// upstreamFailed answers a request the real host did not: the reason,
// readable, with what a person can do about it.
func (g *Gate) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	rs := stateOf(r)
	// A url.Error carries the URL, and a URL may carry a swapped secret
	// in its query: only the cause is ever shown or logged.
	var ue *url.Error
	for errors.As(err, &ue) {
		err = ue.Err
	}
	msg := err.Error()
	if g.o.Credentials != nil {
		msg = g.o.Credentials.ScrubString(msg)
	}
	if rs != nil {
		rs.rec.Reason = audit.Upstream(msg)
		if rs.rec.Verdict == "" {
			rs.rec.Verdict = audit.Allow
		}
		var de *dialError
		if errors.As(err, &de) && de.refusedClass != "" {
			// As for a spliced flow: every address in a refused class
			// (rebinding to a private address) is a denial, not an outage.
			rs.rec.Verdict = audit.Deny
		}
	}
	if r.Context().Err() != nil {
		// The guest went away; there is nobody to answer.
		return
	}
	body := fmt.Sprintf("moat: the gate could not carry this request to %s: %s\n", r.Host, msg)
	var uae x509.UnknownAuthorityError
	if errors.As(err, &uae) {
		body += "If the host's certificate is signed by a private CA, add it to [network] trust on the host.\n"
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusBadGateway)
	io.WriteString(w, body)
}

// auditPath is a request's path as the audit records it: never the query
// (tokens live there), scrubbed, and bounded.
func auditPath(p string, creds Credentials) string {
	if creds != nil {
		p = creds.ScrubString(p)
	}
	return clip(p, maxAuditPath)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// dialUpstream is the transport's dialer: the same resolution, address
// class checks and dial-time control as a spliced connection.
func (g *Gate) dialUpstream(ctx context.Context, _, addr string) (net.Conn, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return nil, err
	}
	tg := target{name: host, port: uint16(port)}
	if ip, err := netip.ParseAddr(host); err == nil {
		tg = target{addr: ip, port: uint16(port)}
	}
	return g.dialTarget(ctx, tg, &tcpTrace{})
}

// guestConn is the guest's end of an intercepted connection: it replays
// the ClientHello the gate already read, counts bytes, and says when it
// closed.
type guestConn struct {
	net.Conn
	ic       *interception
	head     []byte
	up, down atomic.Int64
	once     sync.Once
	closed   chan struct{}
}

func newGuestConn(c net.Conn, head []byte, ic *interception) *guestConn {
	return &guestConn{Conn: c, ic: ic, head: head, closed: make(chan struct{})}
}

func (c *guestConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		c.up.Add(int64(n))
		return n, nil
	}
	n, err := c.Conn.Read(p)
	c.up.Add(int64(n))
	return n, err
}

func (c *guestConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.down.Add(int64(n))
	return n, err
}

func (c *guestConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// oneConn is a listener that yields one connection, then waits for it to
// close: http.Server.Serve returns when the connection is over.
type oneConn struct {
	c      net.Conn
	closed <-chan struct{}
	taken  bool
}

func (l *oneConn) Accept() (net.Conn, error) {
	if !l.taken {
		l.taken = true
		return l.c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error   { return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

type countingRWC struct {
	io.ReadWriteCloser
	rs *reqState
}

func (c *countingRWC) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p)
	c.rs.down.Add(int64(n))
	return n, err
}

func (c *countingRWC) Write(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Write(p)
	c.rs.up.Add(int64(n))
	return n, err
}

// statusWriter remembers the status the guest was answered with. It
// keeps the writer's Flush and Hijack reachable for the proxy (SSE and
// upgrades) through Unwrap.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 || w.status < 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// plainRequestAllowed applies to a plain-HTTP request what the gate knows
// of its host beyond the name: a host a secret is bound to gets nothing in
// the clear (threat model 25: the guest would send the placeholder, and a gate
// that swapped it would put the secret on the wire), and request rules
// decide its method and path. The connection carries this one request
// (forceClose), so deciding its head decides the connection.
func (g *Gate) plainRequestAllowed(req peek.Request, dst netip.AddrPort, t *tcpTrace) bool {
	creds := g.o.Credentials
	path := targetPath(req.Target)
	t.rec.Method, t.rec.Path = clip(req.Method, 32), auditPath(path, creds)
	if req.Host == "" {
		return true
	}
	if creds != nil && creds.Bound(req.Host) {
		t.rec.Reason = audit.ReasonSecretInClear
		return false
	}
	if !t.dec.Inspect {
		return true
	}
	p := g.livePolicy()
	if p == nil {
		return false
	}
	d := p.Request(req.Host, dst.Port(), req.Method, path)
	t.rec.Rule, t.rec.Layer = ruleOf(d)
	if d.Verdict == policy.Allow {
		return true
	}
	reason := audit.ReasonNoRule
	if d.Rule != nil {
		reason = audit.ReasonBlocked
	}
	switch {
	case g.report.Load():
		t.rec.Reason, t.wouldDeny = reason, true
		return true
	case t.granted && d.Rule == nil:
		return true
	}
	t.rec.Reason, t.request = reason, true
	return false
}

// targetPath is the path of a request target in origin or absolute form,
// escapes kept, without its query.
func targetPath(target string) string {
	if u, err := url.ParseRequestURI(target); err == nil {
		return u.EscapedPath()
	}
	p, _, _ := strings.Cut(target, "?")
	return p
}
