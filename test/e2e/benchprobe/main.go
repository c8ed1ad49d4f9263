// Command benchprobe is the measuring end of the gate benchmarks
// (bench/gate.sh): the same program runs on the host (the direct
// baseline) and inside a sandbox (through the gate), and prints one JSON
// object of figures. It is built static by the benchmark and copied into
// the sandbox's workspace.
//
//	benchprobe get URL [KIB]               download with reads of KIB KiB (1024), print bytes and seconds
//	benchprobe connect ADDR N              N sequential connects: p50/p99 in µs
//	benchprobe parallel ADDR N             N connects at once: total ms, TCP retransmits
//	benchprobe refused ADDR N              N sequential connects that must be refused: p50/p99 in µs
//	benchprobe dns SERVER NAME N           N A queries of one name after a first one: p50/p99 in µs
//	                                       (a NAME with %d asks N distinct names: every one uncached)
//	benchprobe hold idle|get TARGET N SECS  N connections held unread for SECS seconds: "idle" opens
//	                                       TARGET (host:port) and sends nothing, "get" sends a GET for
//	                                       TARGET (a URL) and never reads the answer; prints one line
//	                                       when all are open, then holds them
//
// The host "local" (http://local/bytes?n=N, local:0, local) stands for a
// server this process starts on 127.0.0.1: run in the sandbox, that is the
// same operation without leaving the guest, the guest's own share of the
// gated figure (its kernel is gVisor's, and every syscall and wake-up in it
// costs far more than on the host).
//
// Addresses are resolved once, before timing, so connect figures hold
// connects only.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

func main() {
	if len(os.Args) < 3 {
		fail("usage: benchprobe get|connect|parallel|refused|dns ...")
	}
	var out any
	switch os.Args[1] {
	case "get":
		kib := 1024
		if len(os.Args) > 3 {
			kib = atoi(os.Args[3])
		}
		out = get(os.Args[2], kib)
	case "connect":
		out = connect(os.Args[2], atoi(os.Args[3]))
	case "parallel":
		out = parallel(os.Args[2], atoi(os.Args[3]))
	case "refused":
		out = refused(os.Args[2], atoi(os.Args[3]))
	case "dns":
		out = lookup(os.Args[2], os.Args[3], atoi(os.Args[4]))
	case "hold":
		if len(os.Args) < 6 {
			fail("usage: benchprobe hold idle|get TARGET N SECS")
		}
		hold(os.Args[2], os.Args[3], atoi(os.Args[4]), atoi(os.Args[5]))
		return
	default:
		fail("unknown mode " + os.Args[1])
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "benchprobe:", msg)
	os.Exit(2)
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > 100000 {
		fail("bad count " + s)
	}
	return n
}

// get downloads url, reading the body kib KiB at a time. The read size is
// the client's, and in a sandbox it decides much of the figure: each read
// is a syscall into gVisor. io.Copy to io.Discard would read 8 KiB at a
// time; curl and browsers read 16 KiB to 1 MiB.
func get(rawURL string, kib int) map[string]float64 {
	u, err := url.Parse(rawURL)
	if err != nil {
		fail(err.Error())
	}
	if u.Hostname() == "local" {
		u.Host = serveLocalHTTP()
	}
	c := &http.Client{Timeout: 5 * time.Minute}
	buf := make([]byte, kib<<10)
	start := time.Now()
	resp, err := c.Get(u.String())
	if err != nil {
		fail(err.Error())
	}
	var n int64
	for {
		k, err := resp.Body.Read(buf)
		n += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			fail(err.Error())
		}
	}
	resp.Body.Close()
	return map[string]float64{"bytes": float64(n), "seconds": time.Since(start).Seconds()}
}

// hold opens n connections at once and keeps them, reading nothing, for
// secs seconds: what a guest that stops reading leaves the gate to hold.
// It prints {"opened":N,"failed":F} when every dial has returned, so the
// caller measures only after that, and exits when the time is up.
func hold(kind, target string, n, secs int) {
	addr, req := "", ""
	switch kind {
	case "idle":
		addr = resolve(target)
	case "get":
		u, err := url.Parse(target)
		if err != nil || u.Scheme != "http" {
			fail("hold get wants an http:// URL, got " + target)
		}
		port := u.Port()
		if port == "" {
			port = "80"
		}
		addr = resolve(net.JoinHostPort(u.Hostname(), port))
		req = "GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\n\r\n"
	default:
		fail("hold: unknown kind " + kind + " (idle or get)")
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	failed := 0
	sem := make(chan struct{}, 64) // a burst the gate's handshake queue takes
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			c, err := net.DialTimeout("tcp4", addr, 30*time.Second)
			if err == nil && req != "" {
				c.SetWriteDeadline(time.Now().Add(30 * time.Second))
				if _, err = io.WriteString(c, req); err != nil {
					c.Close()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			conns = append(conns, c)
		}()
	}
	wg.Wait()
	json.NewEncoder(os.Stdout).Encode(map[string]int{"opened": len(conns), "failed": failed})
	time.Sleep(time.Duration(secs) * time.Second)
	for _, c := range conns {
		c.Close()
	}
}

func pct(d []time.Duration, p float64) float64 {
	slices.Sort(d)
	i := int(float64(len(d)-1) * p)
	return float64(d[i].Microseconds())
}

// resolve turns host:port into ip:port once, outside the timed loop; the
// host "local" starts a listener on 127.0.0.1 that takes every connection
// and closes it when the client does.
func resolve(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		fail(err.Error())
	}
	if host == "local" {
		return serveLocalTCP()
	}
	ips, err := net.LookupHost(host)
	if err != nil || len(ips) == 0 {
		fail(fmt.Sprintf("resolving %s: %v", host, err))
	}
	return net.JoinHostPort(ips[0], port)
}

func connect(addr string, n int) map[string]float64 {
	addr = resolve(addr)
	var ds []time.Duration
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; i < n && time.Now().Before(deadline); i++ {
		t := time.Now()
		c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
		if err != nil {
			fail(err.Error())
		}
		ds = append(ds, time.Since(t))
		c.Close()
	}
	return map[string]float64{"n": float64(len(ds)), "p50_us": pct(ds, 0.5), "p99_us": pct(ds, 0.99)}
}

// refused times connects that must fail with a refusal (a reset): the
// time for a denial to reach the client.
func refused(addr string, n int) map[string]float64 {
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "local" {
		addr = "127.0.0.1:" + port // nothing listens there: the kernel refuses
	} else {
		addr = resolve(addr)
	}
	var ds []time.Duration
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; i < n && time.Now().Before(deadline); i++ {
		t := time.Now()
		c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
		d := time.Since(t)
		if err == nil {
			c.Close()
			fail("connected to " + addr + ", want a refusal")
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			fail(fmt.Sprintf("connecting to %s: %v, want connection refused", addr, err))
		}
		ds = append(ds, d)
	}
	return map[string]float64{"n": float64(len(ds)), "p50_us": pct(ds, 0.5), "p99_us": pct(ds, 0.99)}
}

func parallel(addr string, n int) map[string]float64 {
	addr = resolve(addr)
	before := retrans()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	var failed int
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp4", addr, 30*time.Second)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			conns = append(conns, c)
		}()
	}
	wg.Wait()
	took := time.Since(start)
	after := retrans()
	for _, c := range conns {
		c.Close()
	}
	return map[string]float64{"n": float64(n), "failed": float64(failed), "ms": float64(took.Microseconds()) / 1000,
		"retrans": float64(after - before)}
}

// retrans reads the TCP RetransSegs counter (gVisor and Linux both keep it).
func retrans() int64 {
	f, err := os.Open("/proc/net/snmp")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var head []string
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 || fs[0] != "Tcp:" {
			continue
		}
		if head == nil {
			head = fs
			continue
		}
		for i, h := range head {
			if h == "RetransSegs" && i < len(fs) {
				v, _ := strconv.ParseInt(fs[i], 10, 64)
				return v
			}
		}
	}
	return -1
}

func lookup(server, name string, n int) map[string]float64 {
	if server == "local" {
		server = serveLocalDNS()
	}
	c := &dns.Client{Timeout: 3 * time.Second}
	distinct := strings.Contains(name, "%d")
	var ds []time.Duration
	for i := 0; i <= n; i++ {
		qn := name
		if distinct {
			qn = fmt.Sprintf(name, i)
		}
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(qn), dns.TypeA)
		t := time.Now()
		r, _, err := c.Exchange(q, server)
		if err != nil {
			fail(err.Error())
		}
		if len(r.Answer) == 0 {
			fail("no answer for " + qn)
		}
		if i > 0 { // the first warms the cache, or the path
			ds = append(ds, time.Since(t))
		}
	}
	return map[string]float64{"n": float64(len(ds)), "p50_us": pct(ds, 0.5), "p99_us": pct(ds, 0.99)}
}

// The local servers: the far end of an operation kept inside this process.

func listenLocal(network string) net.Listener {
	l, err := net.Listen(network, "127.0.0.1:0")
	if err != nil {
		fail(err.Error())
	}
	return l
}

// serveLocalHTTP serves /bytes?n=N (zeros, written 1 MiB at a time, as
// the test network's download server does) and returns its address.
func serveLocalHTTP() string {
	l := listenLocal("tcp4")
	zeros := make([]byte, 1<<20)
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		size, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || size < 0 {
			http.Error(w, "n must be a byte count", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		for size > 0 {
			k := min(size, int64(len(zeros)))
			if _, err := w.Write(zeros[:k]); err != nil {
				return
			}
			size -= k
		}
	}))
	return l.Addr().String()
}

// serveLocalTCP takes every connection and closes it when the client does.
func serveLocalTCP() string {
	l := listenLocal("tcp4")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return l.Addr().String()
}

// serveLocalDNS answers every A query from memory: what a cached answer
// costs when nothing but the guest is involved.
func serveLocalDNS() string {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		fail(err.Error())
	}
	s := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A:   net.IPv4(198, 51, 100, 10),
			})
		}
		w.WriteMsg(m)
	})}
	go s.ActivateAndServe()
	return pc.LocalAddr().String()
}
