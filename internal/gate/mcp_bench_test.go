package gate

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// BenchmarkMCPCall measures one tools/call (a POST answered as an SSE
// event) from a kept-alive client: direct to the server, and through
// the gate (terminated TLS on both legs, the body read and decided, the
// secret swapped, the answer's stream filtered). Each reports p50 and
// p99; calls/s is 1e9 / ns/op. Figures: docs/benchmarks.md.
func BenchmarkMCPCall(b *testing.B) {
	f := newMCPFixture(b, testMCP)
	body := call(1, "read_file")
	run := func(b *testing.B, c *http.Client, url string) {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			req, _ := http.NewRequest("POST", url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Authorization", "Bearer "+f.ph)
			resp, err := c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(got), "ran read_file") {
				b.Fatalf("answer %q", got)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		reportPercentiles(b, lat)
	}
	b.Run("direct", func(b *testing.B) {
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", f.upAddr+":443")
			},
			TLSClientConfig: &tls.Config{RootCAs: f.upRoots},
		}
		defer tr.CloseIdleConnections()
		run(b, &http.Client{Transport: tr}, "https://mcp.test/mcp")
	})
	b.Run("gate", func(b *testing.B) {
		run(b, f.c, "https://mcp.test/mcp")
	})
}
