package main

// flood is threat model 30 from inside the guest: many connections that hold the gate's
// resources without ever giving it what it waits for (no request head, a head sent one byte
// at a time, a head or a ClientHello far over the gate's bounds, idle DNS-over-TCP). Each
// kind reports how many connections it opened, how many the gate closed, and when.

import (
	"encoding/json"
	"errors"
	"flag"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// floodKind is what one kind of connection saw.
type floodKind struct {
	Opened   int `json:"opened"`
	DialErrs int `json:"dial_errs"`
	Closed   int `json:"closed"`       // ended by the peer (EOF, reset) before -hold
	CloseP50 int `json:"close_p50_ms"` // of the closed ones, ms after their dial completed
	CloseMax int `json:"close_max_ms"`
	DialMax  int `json:"dial_max_ms"` // the slowest dial that completed
	closeMS  []int
	Replies  []string `json:"replies,omitempty"` // first line the peer sent, if any (big heads)
	Sent     int64    `json:"sent"`              // bytes written in all
	FirstErr string   `json:"first_err,omitempty"`
}

// floodOp: probe flood [-idle N] [-slow N] [-bighead N] [-bighello N] [-dnsidle N]
// [-hold D] HTTPADDR TLSADDR DNSADDR. Runs every kind at once; -timeout must exceed -hold.
// Data is a JSON object of floodKind by kind.
func floodOp(fs *flag.FlagSet, _ *time.Duration) func() (string, error) {
	idle := fs.Int("idle", 0, "connections to HTTPADDR that send nothing")
	slow := fs.Int("slow", 0, "connections to HTTPADDR that send a request head one byte every 250 ms")
	bighead := fs.Int("bighead", 0, "connections to HTTPADDR that send a 1 MiB request head")
	bighello := fs.Int("bighello", 0, "connections to TLSADDR that send a ClientHello declaring 16 MiB")
	dnsidle := fs.Int("dnsidle", 0, "connections to DNSADDR (DNS over TCP) that send nothing")
	hold := fs.Duration("hold", 15*time.Second, "how long each connection waits for the gate to close it")
	return func() (string, error) {
		httpAddr, tlsAddr, dnsAddr := arg(fs, 0), arg(fs, 1), arg(fs, 2)
		host, _, _ := net.SplitHostPort(httpAddr)
		// One lookup, so that thousands of dials are not thousands of questions; the
		// gate binds the name to the address it answered.
		if ips, err := net.LookupHost(host); err == nil && len(ips) > 0 {
			_, port, _ := net.SplitHostPort(httpAddr)
			httpAddr = net.JoinHostPort(ips[0], port)
			_, port, _ = net.SplitHostPort(tlsAddr)
			tlsAddr = net.JoinHostPort(ips[0], port)
		} else {
			return "", errors.New("resolving " + host + ": " + errString(err))
		}
		out := map[string]*floodKind{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		launch := func(kind string, n int, addr string, talk func(c net.Conn) (sent int64)) {
			k := &floodKind{}
			out[kind] = k
			for range n {
				wg.Go(func() {
					start := time.Now()
					c, err := net.DialTimeout("tcp4", addr, 10*time.Second)
					if err != nil {
						mu.Lock()
						k.DialErrs++
						if k.FirstErr == "" {
							k.FirstErr = err.Error()
						}
						mu.Unlock()
						return
					}
					defer c.Close()
					// The gate's clock for the connection starts at its accept, which is
					// when the dial completes: a dial queued behind thousands of others
					// is not time the gate held the connection.
					opened := time.Now()
					mu.Lock()
					k.Opened++
					k.DialMax = max(k.DialMax, int(opened.Sub(start).Milliseconds()))
					mu.Unlock()
					deadline := opened.Add(*hold)
					c.SetDeadline(deadline)
					// The reader learns when the peer ends the connection; the writer
					// (talk) stops at the first failed write.
					ended := make(chan string, 1)
					go func() {
						buf := make([]byte, 4096)
						var first string
						for {
							n, err := c.Read(buf)
							if first == "" && n > 0 {
								first, _, _ = strings.Cut(string(buf[:n]), "\n")
							}
							if err != nil {
								if errors.Is(err, os.ErrDeadlineExceeded) {
									ended <- "\x00" + first
								} else {
									ended <- first
								}
								return
							}
						}
					}()
					var sent int64
					if talk != nil {
						sent = talk(c)
					}
					reply := <-ended
					mu.Lock()
					defer mu.Unlock()
					k.Sent += sent
					if !strings.HasPrefix(reply, "\x00") {
						k.Closed++
						k.closeMS = append(k.closeMS, int(time.Since(opened).Milliseconds()))
					}
					if r := strings.TrimPrefix(reply, "\x00"); r != "" && len(k.Replies) < 8 {
						k.Replies = append(k.Replies, clipLine(strings.TrimSpace(r)))
					}
				})
			}
		}
		writeAll := func(c net.Conn, b []byte) int64 {
			n, _ := c.Write(b)
			return int64(n)
		}
		launch("idle", *idle, httpAddr, nil)
		launch("dnsidle", *dnsidle, dnsAddr, nil)
		launch("slow", *slow, httpAddr, func(c net.Conn) int64 {
			sent := writeAll(c, []byte("GET /slow HTTP/1.1\r\nHost: "+host+"\r\nX-Slow: "))
			for {
				time.Sleep(250 * time.Millisecond)
				if _, err := c.Write([]byte("a")); err != nil {
					return sent
				}
				sent++
			}
		})
		launch("bighead", *bighead, httpAddr, func(c net.Conn) int64 {
			head := "GET /bighead HTTP/1.1\r\nHost: " + host + "\r\nX-Huge: " + strings.Repeat("a", 1<<20) + "\r\n\r\n"
			return writeAll(c, []byte(head))
		})
		launch("bighello", *bighello, tlsAddr, func(c net.Conn) int64 {
			// A handshake record that declares a 16 MiB ClientHello, then junk in
			// records of 16 KiB until the gate stops reading.
			sent := writeAll(c, []byte{22, 3, 1, 0x40, 0x00, 1, 0xff, 0xff, 0xff})
			junk := make([]byte, 16<<10)
			for range 64 {
				n, err := c.Write(append([]byte{22, 3, 1, 0x40, 0x00}, junk...))
				sent += int64(n)
				if err != nil {
					break
				}
			}
			return sent
		})
		wg.Wait()
		for _, k := range out {
			if len(k.closeMS) > 0 {
				slices.Sort(k.closeMS)
				k.CloseP50, k.CloseMax = k.closeMS[len(k.closeMS)/2], k.closeMS[len(k.closeMS)-1]
			}
		}
		b, err := json.Marshal(out)
		return string(b), err
	}
}

func errString(err error) string {
	if err == nil {
		return "no address"
	}
	return err.Error()
}

func clipLine(s string) string {
	if len(s) > 100 {
		return s[:100]
	}
	return s
}
