// Command probe is the guest side of the gate's end-to-end tests: it does, from inside a
// sandbox, what shell tools cannot (or cannot time precisely): raw UDP and QUIC-like
// datagrams, DNS questions of any type to any server, ICMP echo with a chosen payload, raw
// and packet sockets, IPv6 dials, TLS ClientHellos split into 1-byte segments, without SNI
// or with an Encrypted ClientHello, unix socket connects, and small servers (a CONNECT
// relay, a resolver, a listener) that an attacker inside the sandbox would run.
//
// The test builds it statically (CGO_ENABLED=0) once per test binary and copies it into
// the sandbox's workspace. Every operation prints exactly one JSON line on stdout and exits
// 0, whatever happened to the network, so one shell script can run many operations and the
// test reads one result per line; an unknown operation exits 2. "probe batch" runs many
// operations in one process, one after another or at once (see batch).
package main

import (
	"bufio"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// result is the one line every operation prints.
type result struct {
	Op   string  `json:"op"`
	Tag  string  `json:"tag,omitempty"` // -tag: lets the test find its line among many
	OK   bool    `json:"ok"`            // the operation reached its goal (connected, got a reply)
	Err  string  `json:"err,omitempty"`
	MS   float64 `json:"ms"`             // wall time of the whole operation
	Data string  `json:"data,omitempty"` // what came back (response bytes, DNS answers, ...)
}

// maxData bounds what a result carries back: enough for a status line and a short body.
const maxData = 4096

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	if os.Args[1] == "batch" {
		batch(os.Args[2:])
		return
	}
	r, ok := runOp(os.Args[1:])
	if !ok {
		usage()
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: probe tcp|udp|dns|dnsflood|ping|raw|packet|tls|unix|proxy|servedns|listen|flood [flags] args\n"+
		"       probe batch [-parallel] < one JSON array of arguments per line")
	os.Exit(2)
}

// batch runs one operation per line of stdin (a JSON array: the op, its flags, its
// arguments), one after another or all at once, and prints each result as it is done. A
// test runs many operations per guest session this way without paying a process start (and
// a sudo) for each.
func batch(args []string) {
	fs := flag.NewFlagSet("batch", flag.ExitOnError)
	parallel := fs.Bool("parallel", false, "run the operations at the same time")
	fs.Parse(args)
	var ops [][]string
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var argv []string
		if err := json.Unmarshal(sc.Bytes(), &argv); err != nil || len(argv) == 0 {
			fmt.Fprintf(os.Stderr, "probe batch: line %q: want a JSON array of strings\n", sc.Text())
			os.Exit(2)
		}
		ops = append(ops, argv)
	}
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	run := func(argv []string) {
		r, _ := runOp(argv)
		mu.Lock()
		enc.Encode(r)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, argv := range ops {
		if *parallel {
			wg.Add(1)
			go func() { defer wg.Done(); run(argv) }()
		} else {
			run(argv)
		}
	}
	wg.Wait()
}

// usageError is what arg panics with when an operation lacks an argument; runOp turns it
// into a failed result, so one bad line does not end a batch.
type usageError string

// runOp runs one operation; ok is false for an unknown operation.
func runOp(argv []string) (r result, ok bool) {
	op, args := argv[0], argv[1:]
	r.Op = op
	fs := flag.NewFlagSet(op, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	tag := fs.String("tag", "", "label echoed in the result")
	timeout := fs.Duration("timeout", 3*time.Second, "bound of the whole operation")
	var run func() (string, error)
	switch op {
	case "tcp":
		run = tcpOp(fs, timeout)
	case "udp":
		run = udpOp(fs, timeout)
	case "dns":
		run = dnsOp(fs, timeout)
	case "dnsflood":
		run = dnsFloodOp(fs, timeout)
	case "ping":
		run = pingOp(fs, timeout)
	case "raw":
		run = rawOp(fs)
	case "packet":
		run = packetOp(fs)
	case "tls":
		run = tlsOp(fs, timeout)
	case "unix":
		run = unixOp(fs, timeout)
	case "proxy":
		run = proxyOp(fs, timeout)
	case "servedns":
		run = serveDNSOp(fs, timeout)
	case "listen":
		run = listenOp(fs, timeout)
	case "flood":
		run = floodOp(fs, timeout)
	default:
		r.Err = "unknown operation"
		return r, false
	}
	if err := fs.Parse(args); err != nil {
		r.Tag, r.Err = *tag, "usage: "+err.Error()
		return r, true
	}
	r.Tag = *tag
	start := time.Now()
	data, err := func() (data string, err error) {
		defer func() {
			if u, isUsage := recover().(usageError); isUsage {
				err = errors.New(string(u))
			}
		}()
		return run()
	}()
	r.OK, r.MS, r.Data = err == nil, float64(time.Since(start).Microseconds())/1000, clip(data)
	if err != nil {
		r.Err = err.Error()
	}
	return r, true
}

func clip(s string) string {
	if len(s) > maxData {
		return s[:maxData]
	}
	return s
}

// unescape turns \r\n and friends in a command-line argument into bytes.
func unescape(s string) string {
	u, err := strconv.Unquote(`"` + strings.ReplaceAll(s, `"`, `\"`) + `"`)
	if err != nil {
		return s
	}
	return u
}

func arg(fs *flag.FlagSet, i int) string {
	if fs.NArg() <= i {
		panic(usageError(fmt.Sprintf("usage: %s needs at least %d arguments after its flags", fs.Name(), i+1)))
	}
	return fs.Arg(i)
}

// tcpOp: probe tcp [-6] [-send S] [-read] ADDR. OK once connected; Data is what was read
// until EOF or the deadline when -read or -send is given.
func tcpOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	v6 := fs.Bool("6", false, "dial tcp6")
	send := fs.String("send", "", "bytes to write after connecting (\\r\\n escapes)")
	read := fs.Bool("read", false, "read until EOF or the deadline")
	return func() (string, error) {
		network := "tcp4"
		if *v6 {
			network = "tcp6"
		}
		deadline := time.Now().Add(*timeout)
		c, err := net.DialTimeout(network, arg(fs, 0), *timeout)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(deadline)
		if *send != "" {
			if _, err := c.Write([]byte(unescape(*send))); err != nil {
				return "", fmt.Errorf("connected, then write: %w", err)
			}
		}
		if !*read && *send == "" {
			return "", nil
		}
		b, err := io.ReadAll(io.LimitReader(c, maxData))
		if err != nil && !isTimeout(err) && !errors.Is(err, syscall.ECONNRESET) {
			return string(b), fmt.Errorf("connected, then read: %w", err)
		}
		return string(b), nil
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// udpOp: probe udp [-6] [-quic] ADDR [PAYLOAD]. OK when a reply came back.
func udpOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	v6 := fs.Bool("6", false, "dial udp6")
	quic := fs.Bool("quic", false, "send a QUIC v1 Initial-shaped datagram (1200 bytes, long header)")
	return func() (string, error) {
		network := "udp4"
		if *v6 {
			network = "udp6"
		}
		payload := []byte("moat-udp-leak")
		if fs.NArg() > 1 {
			payload = []byte(unescape(fs.Arg(1)))
		}
		if *quic {
			payload = quicInitial()
		}
		c, err := net.DialTimeout(network, arg(fs, 0), *timeout)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(*timeout))
		if _, err := c.Write(payload); err != nil {
			return "", fmt.Errorf("write: %w", err)
		}
		buf := make([]byte, 65536)
		n, err := c.Read(buf)
		if err != nil {
			return "", fmt.Errorf("read: %w", err)
		}
		return string(buf[:n]), nil
	}
}

// quicInitial is a datagram shaped like a QUIC v1 client Initial: long header, version 1,
// 8-byte connection IDs, padded to the 1200 bytes RFC 9000 requires.
func quicInitial() []byte {
	b := make([]byte, 1200)
	b[0] = 0xc3
	binary.BigEndian.PutUint32(b[1:5], 1)
	b[5] = 8
	rand.Read(b[6:14])
	b[14] = 8
	rand.Read(b[15:23])
	copy(b[23:], "moat-quic-leak")
	return b
}

// dnsOp: probe dns [-tcp] SERVER NAME TYPE. OK when an answer came back; Data is
// "RCODE n=<answers> <answer>;<answer>...".
func dnsOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	useTCP := fs.Bool("tcp", false, "ask over TCP")
	return func() (string, error) {
		server, name, typ := arg(fs, 0), arg(fs, 1), strings.ToUpper(arg(fs, 2))
		qt, ok := dns.StringToType[typ]
		if !ok {
			return "", fmt.Errorf("unknown type %q", typ)
		}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qt)
		cl := &dns.Client{Net: "udp", Timeout: *timeout}
		if *useTCP {
			cl.Net = "tcp"
		}
		r, _, err := cl.Exchange(m, server)
		if err != nil {
			return "", err
		}
		return describe(r), nil
	}
}

func describe(r *dns.Msg) string {
	var parts []string
	for _, rr := range r.Answer {
		switch v := rr.(type) {
		case *dns.A:
			parts = append(parts, "A "+v.A.String())
		case *dns.AAAA:
			parts = append(parts, "AAAA "+v.AAAA.String())
		default:
			parts = append(parts, strings.ReplaceAll(rr.String(), "\t", " "))
		}
	}
	return fmt.Sprintf("%s n=%d %s", dns.RcodeToString[r.Rcode], len(r.Answer), strings.Join(parts, ";"))
}

// dnsFloodOp: probe dnsflood SERVER SUFFIX N. Sends N A queries for random names under
// SUFFIX, 32 at a time; Data is "sent=N answered=K pool=P other=O".
func dnsFloodOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	return func() (string, error) {
		server, suffix := arg(fs, 0), arg(fs, 1)
		n, err := strconv.Atoi(arg(fs, 2))
		if err != nil {
			return "", err
		}
		pool := netip.MustParsePrefix("198.18.0.0/15")
		var answered, inPool, other atomic.Int64
		work := make(chan int)
		var wg sync.WaitGroup
		per := min(*timeout, time.Second)
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cl := &dns.Client{Net: "udp", Timeout: per}
				for i := range work {
					m := new(dns.Msg)
					m.SetQuestion(dns.Fqdn(fmt.Sprintf("f%d-%s.%s", i, randLabel(20), suffix)), dns.TypeA)
					r, _, err := cl.Exchange(m, server)
					if err != nil {
						continue
					}
					answered.Add(1)
					for _, rr := range r.Answer {
						if a, ok := rr.(*dns.A); ok {
							if ip, ok := netip.AddrFromSlice(a.A.To4()); ok && pool.Contains(ip) {
								inPool.Add(1)
							} else {
								other.Add(1)
							}
						}
					}
				}
			}()
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		return fmt.Sprintf("sent=%d answered=%d pool=%d other=%d", n, answered.Load(), inPool.Load(), other.Load()), nil
	}
}

func randLabel(n int) string {
	const alpha = "abcdefghijklmnopqrstuvwxyz234567"
	b := make([]byte, n)
	for i := range b {
		k, _ := rand.Int(rand.Reader, big.NewInt(int64(len(alpha))))
		b[i] = alpha[k.Int64()]
	}
	return string(b)
}

// pingOp: probe ping [-size N] [-pattern HEX] ADDR. OK when an echo reply came back. It
// uses an ICMP datagram ("ping") socket, and a raw socket when that is not available.
func pingOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	size := fs.Int("size", 56, "payload bytes")
	pattern := fs.String("pattern", "6d6f61742d69636d702d6c65616b", "payload pattern, hex (default: moat-icmp-leak)")
	return func() (string, error) {
		dst, err := netip.ParseAddr(arg(fs, 0))
		if err != nil {
			return "", err
		}
		pat, err := hex.DecodeString(*pattern)
		if err != nil || len(pat) == 0 {
			return "", fmt.Errorf("pattern: %v", err)
		}
		payload := make([]byte, *size)
		for i := range payload {
			payload[i] = pat[i%len(pat)]
		}
		network, to := "udp4", net.Addr(&net.UDPAddr{IP: dst.AsSlice()})
		c, err := icmp.ListenPacket(network, "0.0.0.0")
		if err != nil {
			network, to = "ip4:icmp", &net.IPAddr{IP: dst.AsSlice()}
			var rerr error
			if c, rerr = icmp.ListenPacket(network, "0.0.0.0"); rerr != nil {
				return "", fmt.Errorf("no ICMP socket: datagram: %v; raw: %v", err, rerr)
			}
		}
		defer c.Close()
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: payload}}
		wire, _ := msg.Marshal(nil)
		c.SetDeadline(time.Now().Add(*timeout))
		if _, err := c.WriteTo(wire, to); err != nil {
			return "", fmt.Errorf("%s: send: %w", network, err)
		}
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return "", fmt.Errorf("%s: no reply: %w", network, err)
			}
			m, err := icmp.ParseMessage(1, buf[:n])
			if err == nil && m.Type == ipv4.ICMPTypeEchoReply {
				return fmt.Sprintf("%s reply from %v", network, from), nil
			}
		}
	}
}

// rawOp: probe raw ADDR:PORT. Sends one UDP datagram to ADDR:PORT through a raw IP socket
// (IP_HDRINCL), bypassing the guest kernel's UDP layer. OK when the kernel took it.
func rawOp(fs *flag.FlagSet) func() (string, error) {
	return func() (string, error) {
		dst, err := netip.ParseAddrPort(arg(fs, 0))
		if err != nil {
			return "", err
		}
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		if err != nil {
			return "", fmt.Errorf("raw socket: %w", err)
		}
		defer syscall.Close(fd)
		src := localAddr()
		pkt := ipUDP(src, dst, []byte("moat-raw-leak"))
		sa := &syscall.SockaddrInet4{Addr: dst.Addr().As4()}
		if err := syscall.Sendto(fd, pkt, 0, sa); err != nil {
			return "", fmt.Errorf("sendto: %w", err)
		}
		return "sent", nil
	}
}

// packetOp: probe packet ADDR:PORT. Writes whole Ethernet frames on tap0 through a packet
// socket: a UDP datagram to ADDR:PORT and a TCP SYN to ADDR:PORT, addressed to the
// gateway's MAC. OK when the kernel took both.
func packetOp(fs *flag.FlagSet) func() (string, error) {
	return func() (string, error) {
		dst, err := netip.ParseAddrPort(arg(fs, 0))
		if err != nil {
			return "", err
		}
		ifi, err := net.InterfaceByName("tap0")
		if err != nil {
			return "", err
		}
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, int(htons(syscall.ETH_P_ALL)))
		if err != nil {
			return "", fmt.Errorf("packet socket: %w", err)
		}
		defer syscall.Close(fd)
		gw := gatewayMAC()
		src := localAddr()
		var sent []string
		for _, ipPkt := range [][]byte{ipUDP(src, dst, []byte("moat-packet-leak")), ipTCPSyn(src, dst)} {
			frame := append(append(append([]byte{}, gw...), ifi.HardwareAddr...), 0x08, 0x00)
			frame = append(frame, ipPkt...)
			sa := &syscall.SockaddrLinklayer{Protocol: htons(syscall.ETH_P_IP), Ifindex: ifi.Index, Halen: 6}
			copy(sa.Addr[:], gw)
			if err := syscall.Sendto(fd, frame, 0, sa); err != nil {
				return strings.Join(sent, ","), fmt.Errorf("sendto: %w", err)
			}
			sent = append(sent, strconv.Itoa(len(frame)))
		}
		return "sent " + strings.Join(sent, ","), nil
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// gatewayMAC reads the gateway's link address from the guest's ARP table, or falls back
// to the one moat's netstack uses.
func gatewayMAC() net.HardwareAddr {
	if b, err := os.ReadFile("/proc/net/arp"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) >= 4 && f[0] == "10.88.0.1" {
				if mac, err := net.ParseMAC(f[3]); err == nil && mac.String() != "00:00:00:00:00:00" {
					return mac
				}
			}
		}
	}
	return net.HardwareAddr{0x02, 0x6d, 0x6f, 0x61, 0x74, 0x01}
}

func localAddr() netip.Addr {
	if ifi, err := net.InterfaceByName("tap0"); err == nil {
		if as, err := ifi.Addrs(); err == nil {
			for _, a := range as {
				if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
					return p.Addr()
				}
			}
		}
	}
	return netip.MustParseAddr("10.88.0.2")
}

func ipHeader(src, dst netip.Addr, proto byte, payloadLen int) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+payloadLen))
	binary.BigEndian.PutUint16(h[4:], 0x4d4f)
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], csum(h, 0))
	return h
}

func ipUDP(src netip.Addr, dst netip.AddrPort, payload []byte) []byte {
	u := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], 40000)
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[8:], payload)
	binary.BigEndian.PutUint16(u[6:], csum(u, pseudo(src, dst.Addr(), 17, len(u))))
	return append(ipHeader(src, dst.Addr(), 17, len(u)), u...)
}

func ipTCPSyn(src netip.Addr, dst netip.AddrPort) []byte {
	t := make([]byte, 20)
	binary.BigEndian.PutUint16(t[0:], 40001)
	binary.BigEndian.PutUint16(t[2:], dst.Port())
	binary.BigEndian.PutUint32(t[4:], 0x6d6f6174)
	t[12] = 5 << 4
	t[13] = 0x02 // SYN
	binary.BigEndian.PutUint16(t[14:], 65535)
	binary.BigEndian.PutUint16(t[16:], csum(t, pseudo(src, dst.Addr(), 6, len(t))))
	return append(ipHeader(src, dst.Addr(), 6, len(t)), t...)
}

func pseudo(src, dst netip.Addr, proto byte, n int) uint32 {
	s, d := src.As4(), dst.As4()
	var sum uint32
	for i := 0; i < 4; i += 2 {
		sum += uint32(s[i])<<8 | uint32(s[i+1])
		sum += uint32(d[i])<<8 | uint32(d[i+1])
	}
	return sum + uint32(proto) + uint32(n)
}

func csum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// tlsOp: probe tls [-sni NAME] [-nosni] [-ech] [-split] [-ca FILE] [-host H] ADDR. OK when
// the handshake completed; Data is then the response to GET / with Host H (default: the
// SNI). -split writes the connection one byte per segment (TCP_NODELAY), so the ClientHello
// reaches the gate in as many segments as it has bytes. -ech sends a real Encrypted
// ClientHello: the outer SNI is -sni, the inner (encrypted) one is -inner.
func tlsOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	sni := fs.String("sni", "", "server name to send")
	nosni := fs.Bool("nosni", false, "send no server_name extension")
	ech := fs.Bool("ech", false, "send an Encrypted ClientHello whose public (outer) name is -sni")
	inner := fs.String("inner", "", "with -ech: the encrypted inner server name")
	split := fs.Bool("split", false, "write one byte per TCP segment")
	caFile := fs.String("ca", "", "PEM file of the CA to trust")
	host := fs.String("host", "", "Host header of the request (default: the SNI)")
	return func() (string, error) {
		deadline := time.Now().Add(*timeout)
		raw, err := net.DialTimeout("tcp4", arg(fs, 0), *timeout)
		if err != nil {
			return "", err
		}
		defer raw.Close()
		raw.SetDeadline(deadline)
		conn := raw
		if *split {
			raw.(*net.TCPConn).SetNoDelay(true)
			conn = byteConn{raw}
		}
		cfg := &tls.Config{ServerName: *sni, MinVersion: tls.VersionTLS12}
		if *caFile != "" {
			pem, err := os.ReadFile(*caFile)
			if err != nil {
				return "", err
			}
			cfg.RootCAs = x509.NewCertPool()
			cfg.RootCAs.AppendCertsFromPEM(pem)
		}
		if *nosni {
			cfg.ServerName = ""
			cfg.InsecureSkipVerify = true
		}
		if *ech {
			list, err := echConfigList(*sni)
			if err != nil {
				return "", err
			}
			cfg.EncryptedClientHelloConfigList = list
			cfg.MinVersion = tls.VersionTLS13
			cfg.ServerName = *inner
			cfg.InsecureSkipVerify = true
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(context.Background()); err != nil {
			return "", fmt.Errorf("handshake: %w", err)
		}
		h := *host
		if h == "" {
			h = *sni
		}
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", h)
		b, err := io.ReadAll(io.LimitReader(tc, maxData))
		if err != nil && len(b) == 0 {
			return "", fmt.Errorf("handshake done, then read: %w", err)
		}
		return string(b), nil
	}
}

// byteConn writes one byte per Write, so with TCP_NODELAY every byte is its own segment.
type byteConn struct{ net.Conn }

func (c byteConn) Write(p []byte) (int, error) {
	for i := range p {
		if _, err := c.Conn.Write(p[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(p), nil
}

// echConfigList builds an ECHConfigList (RFC 9849 §4) with one X25519 /
// HKDF-SHA256 / AES-128-GCM config for publicName and a fresh key nobody holds: enough for
// the client to send a real encrypted_client_hello extension.
func echConfigList(publicName string) ([]byte, error) {
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	pub := key.PublicKey().Bytes()
	var c []byte
	c = append(c, 7)                             // config_id
	c = binary.BigEndian.AppendUint16(c, 0x0020) // kem: DHKEM(X25519, HKDF-SHA256)
	c = binary.BigEndian.AppendUint16(c, uint16(len(pub)))
	c = append(c, pub...)
	c = binary.BigEndian.AppendUint16(c, 4)      // cipher_suites length
	c = binary.BigEndian.AppendUint16(c, 0x0001) // HKDF-SHA256
	c = binary.BigEndian.AppendUint16(c, 0x0001) // AES-128-GCM
	c = append(c, 0)                             // maximum_name_length
	c = append(c, byte(len(publicName)))
	c = append(c, publicName...)
	c = binary.BigEndian.AppendUint16(c, 0) // extensions
	var cfg []byte
	cfg = binary.BigEndian.AppendUint16(cfg, 0xfe0d)
	cfg = binary.BigEndian.AppendUint16(cfg, uint16(len(c)))
	cfg = append(cfg, c...)
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(cfg))), cfg...), nil
}

// unixOp: probe unix PATH. A leading @ names an abstract socket. OK when connected.
func unixOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	return func() (string, error) {
		c, err := net.DialTimeout("unix", arg(fs, 0), *timeout)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(*timeout))
		c.Write([]byte("moat-unix-leak\n"))
		b, _ := io.ReadAll(io.LimitReader(c, maxData))
		return string(b), nil
	}
}

// proxyOp: probe proxy [-timeout D] LISTEN. A CONNECT relay, the kind an agent would start
// to get around a filter: it dials whatever the client asks for. It serves until -timeout.
func proxyOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	return func() (string, error) {
		l, err := net.Listen("tcp4", arg(fs, 0))
		if err != nil {
			return "", err
		}
		time.AfterFunc(*timeout, func() { l.Close() })
		var relayed []string
		var mu sync.Mutex
		for {
			c, err := l.Accept()
			if err != nil {
				mu.Lock()
				defer mu.Unlock()
				return strings.Join(relayed, " "), nil
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				for {
					h, err := br.ReadString('\n')
					if err != nil || h == "\r\n" || h == "\n" {
						break
					}
				}
				f := strings.Fields(line)
				if len(f) < 2 || f[0] != "CONNECT" {
					fmt.Fprint(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
					return
				}
				up, err := net.DialTimeout("tcp4", f[1], 3*time.Second)
				mu.Lock()
				relayed = append(relayed, fmt.Sprintf("%s:%v", f[1], err == nil))
				mu.Unlock()
				if err != nil {
					fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
					return
				}
				defer up.Close()
				fmt.Fprint(c, "HTTP/1.1 200 Connection established\r\n\r\n")
				go func() { io.Copy(up, br); up.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, up)
			}()
		}
	}
}

// serveDNSOp: probe servedns [-timeout D] LISTEN ANSWER. A resolver run inside the guest
// that answers every A question with ANSWER, until -timeout.
func serveDNSOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	return func() (string, error) {
		answer := net.ParseIP(arg(fs, 1))
		var served atomic.Int64
		srv := &dns.Server{Addr: arg(fs, 0), Net: "udp", Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			if len(r.Question) == 1 && r.Question[0].Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: answer})
			}
			served.Add(1)
			w.WriteMsg(m)
		})}
		time.AfterFunc(*timeout, func() { srv.Shutdown() })
		if err := srv.ListenAndServe(); err != nil {
			return "", err
		}
		return fmt.Sprintf("served=%d", served.Load()), nil
	}
}

// listenOp: probe listen [-timeout D] [-log FILE] LISTEN. Accepts TCP connections until
// -timeout, appending a line per connection to FILE as it comes; Data says how many came.
func listenOp(fs *flag.FlagSet, timeout *time.Duration) func() (string, error) {
	logFile := fs.String("log", "", "file to append one line per accepted connection to")
	return func() (string, error) {
		l, err := net.Listen("tcp4", arg(fs, 0))
		if err != nil {
			return "", err
		}
		time.AfterFunc(*timeout, func() { l.Close() })
		var from []string
		for {
			c, err := l.Accept()
			if err != nil {
				return fmt.Sprintf("accepted=%d %s", len(from), strings.Join(from, " ")), nil
			}
			from = append(from, c.RemoteAddr().String())
			if *logFile != "" {
				if f, err := os.OpenFile(*logFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
					fmt.Fprintln(f, c.RemoteAddr())
					f.Close()
				}
			}
			c.Close()
		}
	}
}
