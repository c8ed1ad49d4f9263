package gate

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"moat.dev/moat/internal/audit"
)

var testMCP = MCPServer{Name: "gh", Host: "mcp.test", Port: 443, Path: "/mcp", Source: "/p/moat.toml",
	Tools:     []string{"search_*", "read_file", "!search_private*"},
	Resources: []string{"repo://public/*"}}

func TestMCPMatch(t *testing.T) {
	for _, tc := range []struct {
		patterns []string
		s        string
		allow    bool
		rule     string
	}{
		{[]string{"search_*"}, "search_code", true, "search_*"},
		{[]string{"search_*"}, "research", false, ""},
		{[]string{"read_file"}, "read_file2", false, ""},
		{[]string{"*"}, "anything", true, "*"},
		{[]string{"*_file"}, "read_file", true, "*_file"},
		{[]string{"a*b*c"}, "aXbYc", true, "a*b*c"},
		{[]string{"a*b*c"}, "aXcYb", false, ""},
		// A refusal wins, whatever the order.
		{[]string{"search_*", "!search_private*"}, "search_private_repo", false, "!search_private*"},
		{[]string{"!search_private*", "search_*"}, "search_private_repo", false, "!search_private*"},
		{[]string{"!delete_*"}, "read_file", false, ""},
		{nil, "read_file", false, ""},
		// Case matters: tool names are case-sensitive.
		{[]string{"read_file"}, "READ_FILE", false, ""},
	} {
		allow, rule := mcpMatch(tc.patterns, tc.s)
		if allow != tc.allow || rule != tc.rule {
			t.Errorf("mcpMatch(%q, %q) = %v %q, want %v %q", tc.patterns, tc.s, allow, rule, tc.allow, tc.rule)
		}
	}
}

func call(id int, tool string) string {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": map[string]any{"q": "x"}}})
	return string(b)
}

func TestDecideMCP(t *testing.T) {
	type want struct {
		allowed   bool
		malformed string // a part of the reason; "" when it parses
		reasons   []audit.Reason
	}
	for _, tc := range []struct {
		name string
		body string
		want want
	}{
		{"allowed tool", call(1, "search_code"), want{allowed: true, reasons: []audit.Reason{""}}},
		{"tool no rule allows", call(1, "delete_repo"), want{reasons: []audit.Reason{audit.ReasonMCPNoRule}}},
		{"tool a ! pattern refuses", call(1, "search_private"), want{reasons: []audit.Reason{audit.ReasonMCPBlocked}}},
		{"resource allowed", `{"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"repo://public/x"}}`, want{allowed: true, reasons: []audit.Reason{""}}},
		{"resource refused", `{"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"repo://private/x"}}`, want{reasons: []audit.Reason{audit.ReasonMCPNoRule}}},
		{"subscribe decided like read", `{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"file:///etc"}}`, want{reasons: []audit.Reason{audit.ReasonMCPNoRule}}},
		{"handshake passes", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`, want{allowed: true, reasons: []audit.Reason{""}}},
		{"discovery passes", `{"jsonrpc":"2.0","id":0,"method":"server/discover","params":{}}`, want{allowed: true, reasons: []audit.Reason{""}}},
		{"notification passes", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, want{allowed: true, reasons: []audit.Reason{""}}},
		{"response passes", `{"jsonrpc":"2.0","id":7,"result":{}}`, want{allowed: true, reasons: []audit.Reason{""}}},
		{"unknown method refused", `{"jsonrpc":"2.0","id":3,"method":"tasks/run","params":{}}`, want{reasons: []audit.Reason{audit.ReasonMCPMethod}}},
		{"batch all allowed", "[" + call(1, "search_a") + "," + call(2, "read_file") + "]", want{allowed: true, reasons: []audit.Reason{"", ""}}},
		{"batch mixed refused whole", "[" + call(1, "read_file") + "," + call(2, "delete_repo") + "]",
			want{reasons: []audit.Reason{audit.ReasonMCPBatch, audit.ReasonMCPNoRule}}},
		{"not JSON", `{"jsonrpc":"2.0",`, want{malformed: "not JSON"}},
		{"empty", "  ", want{malformed: "empty body"}},
		{"empty batch", "[]", want{malformed: "empty batch"}},
		{"batch with a non-object", "[" + call(1, "read_file") + ",1]", want{malformed: "batch member 1: not a JSON object"}},
		{"no jsonrpc", `{"id":1,"method":"tools/call","params":{"name":"read_file"}}`, want{malformed: "not JSON-RPC 2.0"}},
		{"call without id", `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"read_file"}}`, want{malformed: "without an id"}},
		{"call without params", `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`, want{malformed: "without params"}},
		{"name not a string", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":["read_file"]}}`, want{malformed: "without a name string"}},
		{"method not a string", `{"jsonrpc":"2.0","id":1,"method":1}`, want{malformed: "method that is not a string"}},
		{"id an object", `{"jsonrpc":"2.0","id":{},"method":"ping"}`, want{malformed: "neither a string nor a number"}},
		// Two readings of one message: the gate refuses rather than guess the server's.
		{"name twice", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","name":"delete_repo"}}`, want{malformed: `"name" twice`}},
		{"method twice", `{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"delete_repo"}}`, want{malformed: `"method" twice`}},
		{"method by case", `{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"delete_repo"}}`, want{malformed: `"Method" twice`}},
		{"method by case alone", `{"jsonrpc":"2.0","id":1,"METHOD":"tools/call","params":{"name":"delete_repo"}}`, want{malformed: `take for "method"`}},
		{"params by long s", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file"},"paramſ":{"name":"delete_repo"}}`, want{malformed: "twice"}},
		{"name by Kelvin sign", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","name` + "\u212a" + `":"x"}}`, want{allowed: true, reasons: []audit.Reason{""}}},
		{"neither request nor response", `{"jsonrpc":"2.0","id":1}`, want{malformed: "neither a request"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideMCP(&testMCP, []byte(tc.body))
			if tc.want.malformed != "" {
				if !strings.Contains(d.Malformed, tc.want.malformed) || d.Allowed() {
					t.Fatalf("malformed = %q (allowed %v), want one containing %q", d.Malformed, d.Allowed(), tc.want.malformed)
				}
				return
			}
			if d.Malformed != "" {
				t.Fatalf("malformed: %s", d.Malformed)
			}
			if d.Allowed() != tc.want.allowed {
				t.Errorf("allowed = %v, want %v", d.Allowed(), tc.want.allowed)
			}
			var got []audit.Reason
			for _, c := range d.Calls {
				got = append(got, c.Reason)
			}
			if !equalReasons(got, tc.want.reasons) {
				t.Errorf("reasons = %q, want %q", got, tc.want.reasons)
			}
		})
	}
}

func equalReasons(a, b []audit.Reason) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDecideMCPBoundsTheBatch(t *testing.T) {
	parts := make([]string, mcpMaxBatch+1)
	for i := range parts {
		parts[i] = `{"jsonrpc":"2.0","method":"notifications/x"}`
	}
	if d := decideMCP(&testMCP, []byte("["+strings.Join(parts, ",")+"]")); !strings.Contains(d.Malformed, "a batch of") {
		t.Errorf("a batch of %d: %q", len(parts), d.Malformed)
	}
}

const toolList = `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"search_code"},{"name":"read_file"},{"name":"delete_repo"},{"name":"search_private"},{"title":"no name"}],"nextCursor":"c"}}`

func TestFilterAnswer(t *testing.T) {
	out, changed := testMCP.filterAnswer([]byte(toolList))
	var m struct {
		Result struct {
			Tools []struct{ Name string }
			Next  string `json:"nextCursor"`
		}
	}
	if !changed || json.Unmarshal(out, &m) != nil {
		t.Fatalf("changed %v: %s", changed, out)
	}
	var names []string
	for _, tl := range m.Result.Tools {
		names = append(names, tl.Name)
	}
	if strings.Join(names, ",") != "search_code,read_file" || m.Result.Next != "c" {
		t.Errorf("filtered to %q (cursor %q)", names, m.Result.Next)
	}
	res := `[{"jsonrpc":"2.0","id":2,"result":{"resources":[{"uri":"repo://public/a"},{"uri":"repo://private/b"}]}}]`
	out, changed = testMCP.filterAnswer([]byte(res))
	if !changed || !strings.Contains(string(out), "public/a") || strings.Contains(string(out), "private") {
		t.Errorf("resources: changed %v: %s", changed, out)
	}
	for _, keep := range []string{`{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`, `not json`, `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"read_file"}]}}`} {
		if out, changed := testMCP.filterAnswer([]byte(keep)); changed || string(out) != keep {
			t.Errorf("%s changed to %s", keep, out)
		}
	}
}

func sse(t *testing.T, stream string) (string, error) {
	t.Helper()
	f := &sseFilter{src: io.NopCloser(strings.NewReader(stream)), s: &testMCP}
	f.r = newBufReader(f.src)
	b, err := io.ReadAll(f)
	return string(b), err
}

func TestSSEFilter(t *testing.T) {
	notice := "event: message\nid: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"
	list := "event: message\r\nid: 2\r\ndata: " + toolList + "\r\n\r\n"
	out, err := sse(t, ": keepalive\n\n"+notice+list)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, ": keepalive\n\n"+notice+"event: message\r\nid: 2\r\ndata: {") ||
		!strings.Contains(out, "read_file") || strings.Contains(out, "delete_repo") || !strings.HasSuffix(out, "}\n\r\n") {
		t.Errorf("filtered stream:\n%q", out)
	}
	// Data split over several lines is one message.
	at := strings.Index(toolList, `{"name":"read_file"}`)
	split := "data: " + toolList[:at] + "\ndata: " + toolList[at:] + "\n\n"
	if out, err := sse(t, split); err != nil || strings.Contains(out, "delete_repo") || !strings.Contains(out, "read_file") {
		t.Errorf("split data: %v %q", err, out)
	}
	// Cut in the middle of an event: what came whole goes on, the rest does not.
	for _, cut := range []int{5, len(list) / 2, len(list) - 2} {
		out, err := sse(t, notice+list[:cut])
		if !errors.Is(err, io.ErrUnexpectedEOF) || out != notice {
			t.Errorf("cut at %d: %v, %q", cut, err, out)
		}
	}
	// An event over the bound is not held.
	big := "data: " + strings.Repeat("x", mcpMaxAnswer) + "\n\n"
	if _, err := sse(t, big); !errors.Is(err, errMCPAnswerTooLarge) {
		t.Errorf("oversized event: %v", err)
	}
}

func TestJSONFilterBounds(t *testing.T) {
	f := &jsonFilter{src: io.NopCloser(bytes.NewReader(make([]byte, mcpMaxAnswer+1))), s: &testMCP}
	if _, err := io.ReadAll(f); !errors.Is(err, errMCPAnswerTooLarge) {
		t.Errorf("oversized answer: %v", err)
	}
}

func TestMCPPathUnder(t *testing.T) {
	for _, tc := range []struct {
		p, prefix string
		want      bool
	}{
		{"/mcp", "/mcp", true},
		{"/mcp/", "/mcp", true},
		{"/mcp/x", "/mcp", true},
		{"/MCP", "/mcp", true},
		{"//mcp", "/mcp", true},
		{"/a/../mcp", "/mcp", true},
		{"/%6dcp", "/mcp", true},
		{"/%256dcp", "/mcp", true},
		{"/%zz", "/mcp", true}, // undecodable: decided, not let through
		{"/mcpx", "/mcp", false},
		{"/other", "/mcp", false},
		{"/anything", "/", true},
	} {
		if got := mcpPathUnder(tc.p, tc.prefix); got != tc.want {
			t.Errorf("mcpPathUnder(%q, %q) = %v", tc.p, tc.prefix, got)
		}
	}
}
