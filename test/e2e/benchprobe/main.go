// Command benchprobe is the measuring end of the gate benchmarks
// (bench/gate.sh): the same program runs on the host (the direct
// baseline) and inside a sandbox (through the gate), and prints one JSON
// object of figures. It is built static by the benchmark and copied into
// the sandbox's workspace.
//
//	benchprobe get URL                     download, print bytes and seconds
//	benchprobe connect ADDR N              N sequential connects: p50/p99 in µs
//	benchprobe parallel ADDR N             N connects at once: total ms, TCP retransmits
//	benchprobe dns SERVER NAME N           N A queries of one name after a first one: p50/p99 in µs
//	                                       (a NAME with %d asks N distinct names: every one uncached)

// Addresses are resolved once, before timing, so connect figures hold
// connects only.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

func main() {
	if len(os.Args) < 3 {
		fail("usage: benchprobe get|connect|parallel|dns ...")
	}
	var out any
	switch os.Args[1] {
	case "get":
		out = get(os.Args[2])
	case "connect":
		out = connect(os.Args[2], atoi(os.Args[3]))
	case "parallel":
		out = parallel(os.Args[2], atoi(os.Args[3]))
	case "dns":
		out = lookup(os.Args[2], os.Args[3], atoi(os.Args[4]))
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

func get(url string) map[string]float64 {
	c := &http.Client{Timeout: 5 * time.Minute}
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		fail(err.Error())
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		fail(err.Error())
	}
	return map[string]float64{"bytes": float64(n), "seconds": time.Since(start).Seconds()}
}

func pct(d []time.Duration, p float64) float64 {
	slices.Sort(d)
	i := int(float64(len(d)-1) * p)
	return float64(d[i].Microseconds())
}

// resolve turns host:port into ip:port once, outside the timed loop.
func resolve(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		fail(err.Error())
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
	for _, c := range conns {
		c.Close()
	}
	return map[string]float64{"n": float64(n), "failed": float64(failed), "ms": float64(took.Microseconds()) / 1000,
		"retrans": float64(retrans() - before)}
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
