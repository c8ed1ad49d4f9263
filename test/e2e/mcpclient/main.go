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
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mcpclient URL TOOL...")
		os.Exit(2)
	}
	if os.Args[1] == "serve" {
		serve()
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
