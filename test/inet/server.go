package inet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Recording limits keep a flood test from eating the test process's memory. Counters go on
// counting past them; only the stored records stop.
const (
	maxRecords    = 10000   // requests, SNIs, connection payloads or datagrams kept per server
	maxPayloadLen = 1 << 20 // bytes kept per TCP connection
)

// Req is one HTTP request a server received.
type Req struct {
	Method string
	Host   string // the Host header (or :authority), as sent
	Path   string
	Query  string         // raw query, without '?'
	SNI    string         // TLS server name of the request's connection; empty for plain HTTP
	Header http.Header    // as received
	Remote netip.AddrPort // who connected: the host's veth end when the gate dialed
}

// Server is one server of a Net. It records what it receives; every method is safe for
// concurrent use, also while the server is serving.
type Server struct {
	Addr netip.AddrPort // where it listens; the real port when 0 was asked for
	// Cert is the certificate an HTTPS server presents (nil for other kinds): a test compares
	// it with what a client saw to tell a spliced connection (this certificate, untouched)
	// from an intercepted one.
	Cert *x509.Certificate
	kind string     // http, https, tcp or udp
	t    testing.TB // for the server's error log, until Close

	mu       sync.Mutex // guards the records and closed
	conns    int
	hits     int
	bytesIn  int64
	reqs     []Req
	snis     []string
	payloads [][]byte
	closed   bool

	stop func() // makes the serving goroutines return
	once sync.Once
	wg   sync.WaitGroup // the serving goroutines
}

// Hits counts requests for an HTTP or HTTPS server, connections for a TCP server, datagrams
// for a UDP server.
func (s *Server) Hits() int { s.mu.Lock(); defer s.mu.Unlock(); return s.hits }

// Conns counts accepted TCP connections, including ones that never completed a TLS handshake
// or an HTTP request. Always 0 for UDP.
func (s *Server) Conns() int { s.mu.Lock(); defer s.mu.Unlock(); return s.conns }

// BytesIn counts every byte read from clients: request heads and bodies, TLS records,
// raw TCP data, datagrams.
func (s *Server) BytesIn() int64 { s.mu.Lock(); defer s.mu.Unlock(); return s.bytesIn }

// Contacted reports whether anything at all reached the server: a connection, a byte or a
// datagram. An attacker server in a denial test must report false.
func (s *Server) Contacted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns > 0 || s.hits > 0 || s.bytesIn > 0
}

// Requests returns the HTTP requests received, in order.
func (s *Server) Requests() []Req {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Req(nil), s.reqs...)
}

// SNIs returns the server name of every TLS ClientHello received, in order; "" for a
// ClientHello without one.
func (s *Server) SNIs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.snis...)
}

// Payloads returns what a TCP server read, one entry per connection in accept order (the
// first MiB of each), or what a UDP server received, one entry per datagram.
func (s *Server) Payloads() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]byte, len(s.payloads))
	for i, p := range s.payloads {
		out[i] = append([]byte(nil), p...)
	}
	return out
}

// WaitHits waits until Hits reaches want, failing t after within.
func (s *Server) WaitHits(t testing.TB, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for s.Hits() < want {
		if time.Now().After(deadline) {
			t.Fatalf("inet: %s server %s: %d hits after %v, want %d", s.kind, s.Addr, s.Hits(), within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close stops the server and closes its connections. The Net closes every server at cleanup;
// closing earlier is for tests of an upstream going away.
func (s *Server) Close() {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.stop()
		s.wg.Wait()
	})
}

func (s *Server) logf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed { // after Close the test may be over, and t.Logf would panic
		s.t.Logf("inet: %s server %s: %s", s.kind, s.Addr, fmt.Sprintf(format, args...))
	}
}

// errorLog sends an http.Server's error log (TLS handshake failures and the like) to t.
type errorLog struct{ s *Server }

func (e errorLog) Write(p []byte) (int, error) {
	e.s.logf("%s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// HTTP starts a plain HTTP server on ip:port; a nil h answers every request with a line naming
// the server, so a test can tell which upstream it reached.
func (n *Net) HTTP(t testing.TB, ip string, port int, h http.Handler) *Server {
	t.Helper()
	s, l := n.listen(t, "http", ip, port)
	s.serveHTTP(l, h, nil)
	n.adopt(t, s)
	return s
}

// HTTPS starts an HTTPS server on ip:port with a certificate for names from n.CA() (for ip
// itself when names is empty). It presents that certificate whatever the SNI, and records
// every SNI it is sent.
func (n *Net) HTTPS(t testing.TB, ip string, port int, names []string, h http.Handler) *Server {
	t.Helper()
	if len(names) == 0 {
		names = []string{ip}
	}
	cert, err := n.ca.Issue(names...)
	if err != nil {
		t.Fatalf("inet: %v", err)
	}
	s, l := n.listen(t, "https", ip, port)
	if s.Cert, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
		t.Fatalf("inet: parsing the server certificate: %v", err)
	}
	// http.Server offers h2 and http/1.1 over ALPN on its own (ServeTLS adds them to
	// NextProtos), so every HTTPS server of a Net speaks HTTP/2 to clients that ask.
	s.serveHTTP(l, h, &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			s.mu.Lock()
			if len(s.snis) < maxRecords {
				s.snis = append(s.snis, hello.ServerName)
			}
			s.mu.Unlock()
			return nil, nil
		},
	})
	n.adopt(t, s)
	return s
}

// Download starts an HTTP server on ip:port that answers every request with size zero bytes,
// or with n of them for ?n=<count>: the upstream of throughput benchmarks.
func (n *Net) Download(t testing.TB, ip string, port int, size int64) *Server {
	t.Helper()
	return n.HTTP(t, ip, port, bytesHandler{size: size})
}

// Bytes is a handler that answers /anything?n=<count> with count zero bytes, fast: mount it on
// a mux of an HTTP server.
func Bytes() http.Handler { return bytesHandler{size: -1} }

type bytesHandler struct{ size int64 } // -1: n is required

// zeros is shared by every download; 1 MiB per Write keeps the per-call overhead out of
// throughput figures.
var zeros = sync.OnceValue(func() []byte { return make([]byte, 1<<20) })

func (h bytesHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	size := h.size
	if q := r.URL.Query().Get("n"); q != "" {
		v, err := strconv.ParseInt(q, 10, 64)
		if err != nil || v < 0 {
			http.Error(w, "inet: n must be a byte count", http.StatusBadRequest)
			return
		}
		size = v
	}
	if size < 0 {
		http.Error(w, "inet: ask for /bytes?n=<count>", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	if r.Method == http.MethodHead {
		return
	}
	buf := zeros()
	for size > 0 {
		k := min(size, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		size -= k
	}
}

// TCP starts a raw TCP server on ip:port that writes banner as soon as a client connects
// (server speaks first, like SSH) and then records what the client sends until it hangs up.
func (n *Net) TCP(t testing.TB, ip string, port int, banner string) *Server {
	t.Helper()
	s, l := n.listen(t, "tcp", ip, port)
	var (
		mu     sync.Mutex // guards open and closed
		open   = map[net.Conn]bool{}
		closed bool
	)
	s.stop = func() {
		l.Close()
		mu.Lock()
		closed = true
		for c := range open {
			c.Close()
		}
		mu.Unlock()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					s.logf("accepting: %v", err)
				}
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				return
			}
			open[c] = true
			mu.Unlock()
			s.mu.Lock()
			s.hits++
			slot := -1
			if len(s.payloads) < maxRecords {
				slot = len(s.payloads)
				s.payloads = append(s.payloads, []byte{})
			}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serveRaw(c, banner, slot)
				mu.Lock()
				delete(open, c)
				mu.Unlock()
			}()
		}
	}()
	n.adopt(t, s)
	return s
}

// bannerTimeout bounds writing the banner to a client that does not read.
const bannerTimeout = 10 * time.Second

func (s *Server) serveRaw(c net.Conn, banner string, slot int) {
	defer c.Close()
	if banner != "" {
		c.SetWriteDeadline(time.Now().Add(bannerTimeout))
		if _, err := c.Write([]byte(banner)); err != nil {
			return
		}
	}
	buf := make([]byte, 32<<10)
	for {
		k, err := c.Read(buf)
		if k > 0 && slot >= 0 {
			s.mu.Lock()
			if room := maxPayloadLen - len(s.payloads[slot]); room > 0 {
				s.payloads[slot] = append(s.payloads[slot], buf[:min(k, room)]...)
			}
			s.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// UDP starts a UDP server on ip:port that records every datagram and echoes it back, so a
// test can also show a path that works.
func (n *Net) UDP(t testing.TB, ip string, port int) *Server {
	t.Helper()
	ap := n.endpoint(t, ip, port)
	c, err := n.listenUDP(ap)
	if err != nil {
		t.Fatalf("inet: listening on udp %s: %v", ap, err)
	}
	s := &Server{Addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), kind: "udp", t: t}
	s.stop = func() { c.Close() }
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			k, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					s.logf("reading: %v", err)
				}
				return
			}
			s.mu.Lock()
			s.hits++
			s.bytesIn += int64(k)
			if len(s.payloads) < maxRecords {
				s.payloads = append(s.payloads, append([]byte(nil), buf[:k]...))
			}
			s.mu.Unlock()
			c.WriteToUDPAddrPort(buf[:k], from)
		}
	}()
	n.adopt(t, s)
	return s
}

// endpoint parses ip and makes sure the namespace has it.
func (n *Net) endpoint(t testing.TB, ip string, port int) netip.AddrPort {
	t.Helper()
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		t.Fatalf("inet: server address %q: %v", ip, err)
	}
	if port < 0 || port > 65535 {
		t.Fatalf("inet: server port %d out of range", port)
	}
	if err := n.addHost(addr); err != nil {
		t.Fatalf("inet: adding host %s: %v", addr, err)
	}
	return netip.AddrPortFrom(addr, uint16(port))
}

// listen opens a counting TCP listener in the namespace for a server of kind.
func (n *Net) listen(t testing.TB, kind, ip string, port int) (*Server, net.Listener) {
	t.Helper()
	ap := n.endpoint(t, ip, port)
	l, err := n.listenTCP(ap)
	if err != nil {
		t.Fatalf("inet: listening on tcp %s: %v", ap, err)
	}
	s := &Server{Addr: l.Addr().(*net.TCPAddr).AddrPort(), kind: kind, t: t}
	return s, countingListener{l, s}
}

// adopt hands a started server to t's cleanup and to the Net's teardown.
func (n *Net) adopt(t testing.TB, s *Server) {
	n.track(s)
	t.Cleanup(s.Close)
}

// readHeaderTimeout bounds a client that opens a connection and never finishes its request.
const readHeaderTimeout = 30 * time.Second

func (s *Server) serveHTTP(l net.Listener, h http.Handler, cfg *tls.Config) {
	if h == nil {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "inet %s %s %s%s\n", s.kind, s.Addr, r.Host, r.URL.Path)
		})
	}
	srv := &http.Server{
		Handler:           s.record(h),
		TLSConfig:         cfg,
		ReadHeaderTimeout: readHeaderTimeout,
		ErrorLog:          log.New(errorLog{s}, "", 0),
	}
	s.stop = func() { srv.Close() }
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var err error
		if cfg != nil {
			err = srv.ServeTLS(l, "", "")
		} else {
			err = srv.Serve(l)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			s.logf("serving: %v", err)
		}
	}()
}

func (s *Server) record(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := Req{Method: r.Method, Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone()}
		if r.TLS != nil {
			req.SNI = r.TLS.ServerName
		}
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			req.Remote = ap
		}
		s.mu.Lock()
		s.hits++
		if len(s.reqs) < maxRecords {
			s.reqs = append(s.reqs, req)
		}
		s.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

// countingListener counts connections and the bytes read from them.
type countingListener struct {
	net.Listener
	s *Server
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.s.mu.Lock()
	l.s.conns++
	l.s.mu.Unlock()
	return &countingConn{Conn: c, s: l.s}, nil
}

type countingConn struct {
	net.Conn
	s *Server
}

func (c *countingConn) Read(p []byte) (int, error) {
	k, err := c.Conn.Read(p)
	if k > 0 {
		c.s.mu.Lock()
		c.s.bytesIn += int64(k)
		c.s.mu.Unlock()
	}
	return k, err
}
