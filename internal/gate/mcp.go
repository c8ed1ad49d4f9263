package gate

// MCP rules. A remote MCP server is egress with credentials: one allowed
// host, one token, and behind it every tool the token can use (read a
// repository, and delete it). Deciding by host alone gives an agent all
// of them, so for a declared server ([mcp.NAME] in the configuration)
// the gate reads the JSON-RPC the guest posts and decides each call by
// the tool's name (tools/call) or the resource's URI (resources/read,
// subscribe, unsubscribe). This file is the decision, with no I/O:
//
//   - Patterns: "*" matches any run of characters, everything else is
//     literal and case-sensitive (tool names are). "!pattern" refuses.
//   - A refusal wins: a call is refused when any "!" pattern matches it,
//     whatever the order; otherwise it is allowed when any other pattern
//     matches; otherwise refused (default deny). First-match was the
//     alternative, but then ["search_*", "!search_private"] would let
//     search_private through, and the safe reading should not depend on
//     the order a person happened to write.
//   - Methods: calls are decided as above; the handshake, listings,
//     prompts, completion, logging and notifications pass; any other
//     method is refused (a method the gate does not know may be a way to
//     act that no rule was written for).
//   - A body that is not JSON-RPC the gate can read is refused whole
//     (fail closed), as is an object with a key twice or a key that only
//     case folding makes one of the keys decided on ("Method",
//     "nameſ"): servers differ in which of two keys they read.
//   - A batch with any refused member is refused whole: each request in
//     it gets an error, the allowed ones saying they were refused with
//     their batch. Forwarding only the allowed members would mean
//     merging the server's answer with the gate's, and batches left the
//     protocol in its 2025-06-18 revision.
// mcpserve.go carries it over HTTP; mcplocal.go serves host-local
// servers at the gateway's ports.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/config"
)

// MCPServer is one declared remote MCP server as the gate decides it.
type MCPServer struct {
	Name string
	// Host, Port and Path say which requests are the server's: those
	// on a connection to Host:Port whose path is Path or below it.
	Host      string
	Port      uint16
	Path      string
	Tools     []string // patterns, as written
	Resources []string
	// AuditArguments writes each call's arguments into its record.
	AuditArguments bool
	// Source is the file that declared it (for the refusal's hint).
	Source string
	// Local: the server is on the host's loopback, Host:Port, and the
	// guest reaches it at the gateway's Port (mcplocal.go).
	Local bool
}

// MCPServers converts the configuration's servers, sorted by name.
func MCPServers(m map[string]config.MCPServer) []MCPServer {
	out := make([]MCPServer, 0, len(m))
	for _, s := range config.SortedMCP(m) {
		if s.Host == "" {
			continue // a command: its calls never leave the guest
		}
		out = append(out, MCPServer{Name: s.Name, Host: s.Host, Port: s.Port, Path: s.Path,
			Tools: s.Tools, Resources: s.Resources, AuditArguments: s.AuditArguments, Source: s.Source, Local: s.Local})
	}
	return out
}

// mcpMatch decides s by patterns: refused when a "!" pattern matches,
// allowed when another does, refused when none does. rule is the
// pattern that decided ("" when none did).
func mcpMatch(patterns []string, s string) (allow bool, rule string) {
	for _, p := range patterns {
		if neg, ok := strings.CutPrefix(p, "!"); ok && globMatch(neg, s) {
			return false, p
		}
	}
	for _, p := range patterns {
		if !strings.HasPrefix(p, "!") && globMatch(p, s) {
			return true, p
		}
	}
	return false, ""
}

// globMatch reports whether s matches pattern, where "*" matches any run
// of bytes and everything else is literal.
func globMatch(pattern, s string) bool {
	pieces := strings.Split(pattern, "*")
	if len(pieces) == 1 {
		return s == pattern
	}
	if !strings.HasPrefix(s, pieces[0]) {
		return false
	}
	s = s[len(pieces[0]):]
	last := pieces[len(pieces)-1]
	for _, p := range pieces[1 : len(pieces)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, last)
}

// mcpPassMethods pass without a rule: the handshake, listings (filtered
// on the way back), prompts (text the server offers, no action), and
// client-side settings. Notifications ("notifications/...") pass too.
var mcpPassMethods = map[string]bool{
	"initialize": true,
	// The 2026 revision's discovery, which the Go SDK's client (v1.8)
	// sends before initialize: the server's capabilities and versions.
	"server/discover":          true,
	"ping":                     true,
	"tools/list":               true,
	"resources/list":           true,
	"resources/templates/list": true,
	"prompts/list":             true,
	"prompts/get":              true,
	"completion/complete":      true,
	"logging/setLevel":         true,
}

// mcpCall is one JSON-RPC message of a request body, decided.
type mcpCall struct {
	ID     json.RawMessage // nil for a notification (or a response)
	Method string
	Tool   string // tools/call
	URI    string // resources/read, subscribe, unsubscribe
	Args   json.RawMessage
	// Decided marks the calls that get an audit record of their own:
	// tools/call and resources/*, and whatever was refused.
	Decided bool
	Allow   bool
	Rule    string
	Reason  audit.Reason
	// Granted is the watcher's answer that let an undecided call
	// through ("" when none did).
	Granted string
}

// mcpBody is a request body, parsed and decided.
type mcpBody struct {
	Batch bool
	Calls []mcpCall
	// Malformed says why the body could not be decided ("": it was).
	Malformed string
}

// Allowed reports whether the whole body may go to the server.
func (b *mcpBody) Allowed() bool {
	if b.Malformed != "" {
		return false
	}
	for _, c := range b.Calls {
		if !c.Allow {
			return false
		}
	}
	return true
}

// ListsTools reports whether the body asks for a listing whose answer
// the gate filters.
func (b *mcpBody) ListsTools() bool {
	for _, c := range b.Calls {
		if c.Method == "tools/list" || c.Method == "resources/list" {
			return true
		}
	}
	return false
}

// mcpMaxBatch bounds the members of one batch: far more than a client
// sends, few enough that deciding them costs nothing.
const mcpMaxBatch = 256

// decideMCP parses body (a POST's, already bounded in size) and decides
// each message by s's rules.
func decideMCP(s *MCPServer, body []byte) *mcpBody {
	out := &mcpBody{}
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		out.Malformed = "empty body"
		return out
	}
	var msgs []json.RawMessage
	if body[0] == '[' {
		out.Batch = true
		if err := json.Unmarshal(body, &msgs); err != nil {
			out.Malformed = "not JSON: " + jsonErr(err)
			return out
		}
		switch {
		case len(msgs) == 0:
			out.Malformed = "an empty batch"
			return out
		case len(msgs) > mcpMaxBatch:
			out.Malformed = fmt.Sprintf("a batch of %d messages (at most %d)", len(msgs), mcpMaxBatch)
			return out
		}
	} else {
		if !json.Valid(body) {
			out.Malformed = "not JSON"
			return out
		}
		msgs = []json.RawMessage{body}
	}
	for i, m := range msgs {
		c, err := parseMCPMessage(m)
		if err != nil {
			if out.Batch {
				out.Malformed = fmt.Sprintf("batch member %d: %v", i, err)
			} else {
				out.Malformed = err.Error()
			}
			out.Calls = nil
			return out
		}
		s.decide(&c)
		out.Calls = append(out.Calls, c)
	}
	if out.Batch && !out.Allowed() {
		for i := range out.Calls {
			if c := &out.Calls[i]; c.Allow {
				c.Allow, c.Decided, c.Reason = false, true, audit.ReasonMCPBatch
			}
		}
	}
	return out
}

// decide sets c's verdict by s's rules.
func (s *MCPServer) decide(c *mcpCall) {
	switch {
	case c.Method == "":
		c.Allow = true // a response to the server's own request
	case c.Method == "tools/call":
		c.Decided = true
		c.Allow, c.Rule = mcpMatch(s.Tools, c.Tool)
	case c.Method == "resources/read" || c.Method == "resources/subscribe" || c.Method == "resources/unsubscribe":
		c.Decided = true
		c.Allow, c.Rule = mcpMatch(s.Resources, c.URI)
	case mcpPassMethods[c.Method] || strings.HasPrefix(c.Method, "notifications/"):
		c.Allow = true
	default:
		c.Decided = true
		c.Reason = audit.ReasonMCPMethod
		return
	}
	if !c.Allow && c.Reason == "" {
		c.Reason = audit.ReasonMCPNoRule
		if c.Rule != "" {
			c.Reason = audit.ReasonMCPBlocked
		}
	}
}

// mcpKeys are the keys decisions read, at the top of a message and in
// its params: an object may hold each once, spelled exactly.
var mcpKeys = []string{"jsonrpc", "id", "method", "params", "result", "error", "name", "uri", "arguments"}

// parseMCPMessage reads one JSON-RPC message strictly.
func parseMCPMessage(raw json.RawMessage) (mcpCall, error) {
	var c mcpCall
	top, err := strictObject(raw)
	if err != nil {
		return c, err
	}
	if v, ok := top["jsonrpc"]; !ok || string(v) != `"2.0"` {
		return c, errors.New(`not JSON-RPC 2.0 (no "jsonrpc": "2.0")`)
	}
	if id, ok := top["id"]; ok {
		if len(id) == 0 || (id[0] != '"' && id[0] != '-' && (id[0] < '0' || id[0] > '9')) {
			return c, errors.New("an id that is neither a string nor a number")
		}
		c.ID = id
	}
	m, hasMethod := top["method"]
	if !hasMethod {
		_, res := top["result"]
		_, er := top["error"]
		if c.ID == nil || res == er {
			return c, errors.New("neither a request, a notification nor a response")
		}
		return c, nil
	}
	if err := json.Unmarshal(m, &c.Method); err != nil || c.Method == "" {
		return c, errors.New("a method that is not a string")
	}
	needs := ""
	switch c.Method {
	case "tools/call":
		needs = "name"
	case "resources/read", "resources/subscribe", "resources/unsubscribe":
		needs = "uri"
	default:
		return c, nil
	}
	if c.ID == nil {
		return c, fmt.Errorf("%s without an id", c.Method)
	}
	ps, ok := top["params"]
	if !ok {
		return c, fmt.Errorf("%s without params", c.Method)
	}
	params, err := strictObject(ps)
	if err != nil {
		return c, fmt.Errorf("%s params: %w", c.Method, err)
	}
	var v string
	if err := json.Unmarshal(params[needs], &v); err != nil || v == "" {
		return c, fmt.Errorf("%s without a %s string in its params", c.Method, needs)
	}
	if needs == "name" {
		c.Tool, c.Args = v, params["arguments"]
	} else {
		c.URI = v
	}
	return c, nil
}

// strictObject reads a JSON object's members, refusing a key that comes
// twice or that only case folding makes one of mcpKeys: Go's decoder,
// for one, reads "Method" as "method" and keeps the last of two keys,
// others keep the first, so the gate and the server could decide on
// different values.
func strictObject(raw json.RawMessage) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	out := map[string]json.RawMessage{}
	folded := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, errors.New("not a JSON object")
		}
		k := tok.(string)
		f := foldKey(k)
		if folded[f] {
			return nil, fmt.Errorf("the key %q twice", clip(k, 64))
		}
		folded[f] = true
		for _, want := range mcpKeys {
			if k != want && f == want {
				return nil, fmt.Errorf("the key %q, which some readers take for %q", clip(k, 64), want)
			}
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errors.New("not a JSON object")
		}
		out[k] = v
	}
	return out, nil
}

// foldKey folds k as case-insensitive readers compare keys: upper then
// lower case, so "ſ" (long s) and "K" (Kelvin) meet "s" and "k" as
// they do under Unicode simple folding.
func foldKey(k string) string { return strings.ToLower(strings.ToUpper(k)) }

func jsonErr(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	}
	return "not a list of messages"
}

// filterAnswer removes from the answers in raw (one JSON-RPC message or
// a batch) the tools and resources s refuses, so the agent is not shown
// what it may not call. It reports whether anything changed; raw that is
// not JSON (or not answers) is returned as it is, for the caller to
// judge.
func (s *MCPServer) filterAnswer(raw []byte) ([]byte, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return raw, false
	}
	if raw[0] == '[' {
		var msgs []json.RawMessage
		if json.Unmarshal(raw, &msgs) != nil {
			return raw, false
		}
		changed := false
		for i, m := range msgs {
			if f, ok := s.filterMessage(m); ok {
				msgs[i], changed = f, true
			}
		}
		if !changed {
			return raw, false
		}
		b, err := json.Marshal(msgs)
		if err != nil {
			return raw, false
		}
		return b, true
	}
	return s.filterMessage(raw)
}

// filterMessage filters one answer's result: "tools" by each entry's
// name, "resources" by each entry's uri. An entry without the field is
// dropped: it could not have been called by a name the rules allow.
func (s *MCPServer) filterMessage(raw json.RawMessage) ([]byte, bool) {
	var msg map[string]json.RawMessage
	if json.Unmarshal(raw, &msg) != nil || msg["result"] == nil {
		return raw, false
	}
	var result map[string]json.RawMessage
	if json.Unmarshal(msg["result"], &result) != nil {
		return raw, false
	}
	changed := false
	for _, l := range []struct {
		key, field string
		rules      []string
	}{
		{"tools", "name", s.Tools}, {"resources", "uri", s.Resources},
	} {
		var entries []json.RawMessage
		if result[l.key] == nil || json.Unmarshal(result[l.key], &entries) != nil {
			continue
		}
		kept := entries[:0:0]
		for _, e := range entries {
			var fields map[string]json.RawMessage
			var v string
			if json.Unmarshal(e, &fields) == nil && json.Unmarshal(fields[l.field], &v) == nil {
				if ok, _ := mcpMatch(l.rules, v); ok {
					kept = append(kept, e)
				}
			}
		}
		if len(kept) == len(entries) {
			continue
		}
		b, err := json.Marshal(kept)
		if err != nil {
			continue
		}
		result[l.key], changed = b, true
	}
	if !changed {
		return raw, false
	}
	rb, err := json.Marshal(result)
	if err != nil {
		return raw, false
	}
	msg["result"] = rb
	out, err := json.Marshal(msg)
	if err != nil {
		return raw, false
	}
	return out, true
}
