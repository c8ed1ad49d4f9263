// Command tlsprobe is the measuring end of the TLS benchmark (bench/tls.sh): the same program runs
// on the host (straight to the test internet: the direct baseline) and inside sandboxes (through
// the gate, intercepted or spliced), and prints one JSON object of figures. It is built static
// by the benchmark and copied into the workspace.
//
//	tlsprobe [-ca PEM] [-connect ADDR] get URL          download, discard: bytes and seconds
//	tlsprobe [-ca PEM] [-connect ADDR] handshakes NAME N PORT
//	                                                     N sequential TCP connects and full TLS
//	                                                     handshakes (no resumption) to NAME:PORT;
//	                                                     a NAME with %d is a new name each time:
//	                                                     p50/p99 in µs
//
// Trust is the system roots (in a sandbox they hold the sandbox's CA) plus -ca. -connect dials
// ADDR instead of what the name resolves to, keeping the name for SNI and Host: on the host,
// where test names do not resolve.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

var (
	caFile  = flag.String("ca", "", "extra root certificates (PEM)")
	connect = flag.String("connect", "", "dial this address instead of the name's")
)

func main() {
	flag.Parse()
	args := flag.Args()
	if len(args) < 2 {
		fail("usage: tlsprobe [-ca PEM] [-connect ADDR] get URL | handshakes NAME N PORT")
	}
	roots := pool()
	var out any
	switch args[0] {
	case "get":
		out = get(roots, args[1])
	case "handshakes":
		if len(args) < 4 {
			fail("usage: tlsprobe handshakes NAME N PORT")
		}
		out = handshakes(roots, args[1], atoi(args[2]), args[3])
	default:
		fail("unknown mode " + args[0])
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "tlsprobe:", msg)
	os.Exit(2)
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > 100000 {
		fail("bad count " + s)
	}
	return n
}

func pool() *x509.CertPool {
	p, err := x509.SystemCertPool()
	if err != nil || p == nil {
		p = x509.NewCertPool()
	}
	if *caFile != "" {
		b, err := os.ReadFile(*caFile)
		if err != nil || !p.AppendCertsFromPEM(b) {
			fail("reading -ca " + *caFile)
		}
	}
	return p
}

func dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if *connect != "" {
		addr = *connect
	}
	return (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
}

func get(roots *x509.CertPool, url string) map[string]float64 {
	tr := &http.Transport{
		Proxy:              nil,
		DialContext:        dial,
		TLSClientConfig:    &tls.Config{RootCAs: roots},
		DisableCompression: true,
		ReadBufferSize:     1 << 20,
	}
	start := time.Now()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Minute}).Get(url)
	if err != nil {
		fail(err.Error())
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		fail("status " + resp.Status)
	}
	buf := make([]byte, 1<<20)
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
	return map[string]float64{"bytes": float64(n), "seconds": time.Since(start).Seconds(), "http": float64(resp.ProtoMajor)}
}

func handshakes(roots *x509.CertPool, name string, n int, port string) map[string]float64 {
	var d []time.Duration
	for i := 0; i < n; i++ {
		host := name
		if strings.Contains(name, "%d") {
			host = fmt.Sprintf(name, i)
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		raw, err := dial(ctx, "tcp", net.JoinHostPort(host, port))
		if err != nil {
			cancel()
			fail(host + ": " + err.Error())
		}
		// No session cache: every handshake is a full one, as a new client process makes.
		c := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: host, NextProtos: []string{"http/1.1"}})
		err = c.HandshakeContext(ctx)
		took := time.Since(start)
		cancel()
		c.Close()
		if err != nil {
			fail(host + ": " + err.Error())
		}
		d = append(d, took)
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	pct := func(p float64) float64 { return float64(d[int(float64(len(d)-1)*p)].Microseconds()) }
	return map[string]float64{"p50_us": pct(0.5), "p99_us": pct(0.99), "n": float64(n)}
}
