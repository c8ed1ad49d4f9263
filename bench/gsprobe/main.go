// Command gsprobe is the small-requests load of bench/gate-service.sh,
// the one figure test/e2e/benchprobe (which the benchmark runs for the
// rest) has no mode for: many small HTTPS requests over a few kept-alive
// connections, as an agent's package manager or API client makes them.
//
//	gsprobe reqs URL N C    N GETs of URL over C connections after C warm-up
//	                        requests: requests/s, p50 and p95 in µs, errors
//
// It trusts the system store and resolves with the system resolver, so
// the benchmark decides by what it mounts over /etc/resolv.conf and the
// bundle whether it goes through the gate service or straight to the
// upstream. The name is resolved once, before timing.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) != 5 || os.Args[1] != "reqs" {
		fail("usage: gsprobe reqs URL N C")
	}
	u, err := url.Parse(os.Args[2])
	if err != nil || u.Scheme != "https" {
		fail("want an https:// URL, got " + os.Args[2])
	}
	n, c := count(os.Args[3]), count(os.Args[4])
	ips, err := net.LookupHost(u.Hostname())
	if err != nil || len(ips) == 0 {
		fail(fmt.Sprintf("resolving %s: %v", u.Hostname(), err))
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	addr := net.JoinHostPort(ips[0], port)
	d := &net.Dialer{Timeout: 10 * time.Second}
	cl := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp4", addr)
		},
		MaxIdleConnsPerHost: c,
		MaxConnsPerHost:     c,
		// HTTP/1.1 on both paths, so the figures compare the same protocol.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}}
	one := func() (time.Duration, error) {
		t := time.Now()
		resp, err := cl.Get(u.String())
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		return time.Since(t), err
	}
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			if _, err := one(); err != nil {
				fail("warm-up: " + err.Error())
			}
		})
	}
	wg.Wait()

	var next atomic.Int64
	var errs atomic.Int64
	lat := make([][]time.Duration, c)
	start := time.Now()
	deadline := start.Add(2 * time.Minute)
	for w := range c {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && time.Now().Before(deadline) {
				d, err := one()
				if err != nil {
					errs.Add(1)
					continue
				}
				lat[w] = append(lat[w], d)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	all := slices.Concat(lat...)
	if len(all) == 0 {
		fail("no request succeeded")
	}
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[int(float64(len(all)-1)*p)].Microseconds()) }
	json.NewEncoder(os.Stdout).Encode(map[string]float64{
		"n": float64(len(all)), "errors": float64(errs.Load()), "rps": float64(len(all)) / took.Seconds(),
		"p50_us": pct(0.5), "p95_us": pct(0.95),
	})
}

func count(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > 1000000 {
		fail("bad count " + s)
	}
	return n
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "gsprobe:", msg)
	os.Exit(2)
}
