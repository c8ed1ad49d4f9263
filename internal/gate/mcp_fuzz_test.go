package gate

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzDecideMCP holds the gate's reading of a body to a server's: whatever
// the gate lets through, Go's own decoder (case-insensitive keys, the last
// of two wins, as a Go server reads) finds no call the rules refuse in it.
func FuzzDecideMCP(f *testing.F) {
	for _, s := range []string{
		call(1, "read_file"), call(1, "delete_repo"),
		"[" + call(1, "read_file") + "," + call(2, "search_x") + "]",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","NAME":"delete_repo"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"delete_repo"}}`,
		`{"jsonrpc":"2.0","id":"x","method":"resources/read","params":{"uri":"repo://public/a"}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		d := decideMCP(&testMCP, body)
		if !d.Allowed() {
			return
		}
		type msg struct {
			Method string
			Params struct {
				Name string
				URI  string
			}
		}
		var msgs []msg
		if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '[' {
			if json.Unmarshal(b, &msgs) != nil {
				return
			}
		} else {
			var m msg
			if json.Unmarshal(b, &m) != nil {
				return
			}
			msgs = []msg{m}
		}
		for _, m := range msgs {
			switch m.Method {
			case "tools/call":
				if ok, _ := mcpMatch(testMCP.Tools, m.Params.Name); !ok {
					t.Fatalf("let through %q, which calls %q", body, m.Params.Name)
				}
			case "resources/read", "resources/subscribe", "resources/unsubscribe":
				if ok, _ := mcpMatch(testMCP.Resources, m.Params.URI); !ok {
					t.Fatalf("let through %q, which reads %q", body, m.Params.URI)
				}
			}
		}
	})
}
