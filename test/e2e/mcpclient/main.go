// Command mcpclient is the guest's MCP client in test/e2e/mcp_test.go: the
// official Go SDK's client over streamable HTTP, as an agent would run it.
// It lists the server's tools and calls each tool named on its command
// line, with the credential in $MCP_TOKEN (the guest's placeholder) as a
// bearer token, and prints what it got as KEY=value lines. With "serve" it
// is instead a stdio MCP server with one tool, local_echo, for an agent
// to start in the guest.
//
//	mcpclient URL TOOL...
//	mcpclient serve
//	mcpclient bench URL N     N calls of read_file: p50, p99, calls/s
//
// MCP_DIAL=ip:port dials there whatever the URL's host (the test's
// direct run on the host, which has no name for the server).
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return transport.RoundTrip(r)
}

var transport = func() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if a := os.Getenv("MCP_DIAL"); a != "" {
		t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", a)
		}
	}
	return t
}()

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mcpclient URL TOOL...")
		os.Exit(2)
	}
	if os.Args[1] == "serve" {
		serve()
		return
	}
	if os.Args[1] == "bench" && len(os.Args) == 4 {
		bench(os.Args[2], os.Args[3])
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := &http.Client{Transport: bearer{os.Getenv("MCP_TOKEN")}}
	c := mcp.NewClient(&mcp.Implementation{Name: "moat-e2e", Version: "v1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: os.Args[1], HTTPClient: hc, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connecting:", err)
		os.Exit(1)
	}
	defer s.Close()
	tools, err := s.ListTools(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listing tools:", err)
		os.Exit(1)
	}
	var names []string
	for _, t := range tools.Tools {
		names = append(names, t.Name)
	}
	fmt.Printf("TOOLS=%s\n", strings.Join(names, ","))
	for _, name := range os.Args[2:] {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"q": "x"}})
		if err != nil {
			fmt.Printf("ERR_%s=%s\n", name, strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		var text []string
		for _, ct := range res.Content {
			if tc, ok := ct.(*mcp.TextContent); ok {
				text = append(text, tc.Text)
			}
		}
		fmt.Printf("OK_%s=%s\n", name, strings.Join(text, " "))
	}
}

// serve is a stdio MCP server until its client goes away.
func serve() {
	s := mcp.NewServer(&mcp.Implementation{Name: "moat-e2e-local", Version: "v1"}, nil)
	type in struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "local_echo", Description: "echoes its text"},
		func(ctx context.Context, req *mcp.CallToolRequest, args in) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: args.Text}}}, nil, nil
		})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "serving:", err)
		os.Exit(1)
	}
}

// bench calls read_file n times over one session and prints the
// latencies' p50 and p99 and the calls per second.
func bench(url, ns string) {
	n, err := strconv.Atoi(ns)
	if err != nil || n < 1 {
		fmt.Fprintln(os.Stderr, "bench: N must be a positive number")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "moat-e2e-bench", Version: "v1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer{os.Getenv("MCP_TOKEN")}}, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connecting:", err)
		os.Exit(1)
	}
	defer s.Close()
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for range n {
		t := time.Now()
		if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"q": "x"}}); err != nil {
			fmt.Fprintln(os.Stderr, "calling:", err)
			os.Exit(1)
		}
		lat = append(lat, time.Since(t))
	}
	total := time.Since(start)
	slices.Sort(lat)
	fmt.Printf("CALLS=%d\nP50_US=%d\nP99_US=%d\nPER_S=%.0f\n", n, lat[n*50/100].Microseconds(),
		lat[min(n-1, n*99/100)].Microseconds(), float64(n)/total.Seconds())
}
