package gate

// MCP over HTTP: the requests of a declared server's URL, inside a TLS
// connection the gate terminates (mitm.go), decided by mcp.go's rules.
//
// Streamable HTTP carries client messages in POST bodies and answers as
// one JSON body or an SSE stream; a GET opens an SSE stream for the
// server's own messages; DELETE ends a session. A POST's body is read
// whole (bounded: mcpMaxRequest), decided, and either sent on as it was
// read or answered by the gate with JSON-RPC errors, so a refused call
// never reaches the server. Answers are filtered on their way back:
// listings lose what the rules refuse, an SSE stream event by event
// (each held until it is whole, so a stream cut mid-event passes nothing
// of that event), a JSON answer to a listing whole (bounded:
// mcpMaxAnswer).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/policy"
)

const (
	// mcpMaxRequest bounds one POST body: tool arguments carry file
	// contents, and 4 MiB is more than an agent writes in one call.
	mcpMaxRequest = 4 << 20
	// mcpMaxAnswer bounds a JSON answer held whole to filter a listing,
	// and one SSE event held whole to filter it.
	mcpMaxAnswer = 16 << 20
	// mcpRefused is the JSON-RPC error code of a call the gate refused
	// (in the range JSON-RPC leaves to implementations).
	mcpRefused = -32001
	// mcpMaxAuditArgs bounds the arguments an audit record carries.
	mcpMaxAuditArgs = 2 << 10
)

// mcpState is what the gate knows of one request to a declared server.
type mcpState struct {
	server *MCPServer
	calls  []mcpCall
	lists  bool // the request asks for a listing: its JSON answer is filtered
}

// mcpFor is the declared server whose URL r is on, or nil.
func (g *Gate) mcpFor(ic *interception, r *http.Request) *MCPServer {
	if len(g.o.MCP) == 0 {
		return nil
	}
	name, err := policy.NormalizeName(ic.name)
	if err != nil {
		return nil
	}
	for i := range g.o.MCP {
		s := &g.o.MCP[i]
		if !s.Local && s.Host == name && s.Port == ic.port && mcpPathUnder(r.URL.EscapedPath(), s.Path) {
			return s
		}
	}
	return nil
}

// mcpDeclared reports whether an MCP server is declared on name: its
// TLS is always terminated, whatever else allows the name.
func (g *Gate) mcpDeclared(name string) bool {
	n, err := policy.NormalizeName(name)
	if err != nil {
		return false
	}
	for _, s := range g.o.MCP {
		if !s.Local && s.Host == n {
			return true
		}
	}
	return false
}

// mcpPathUnder reports whether the request path p is the server's path
// or below it, read loosely (escapes decoded, case folded, dot segments
// and repeated or trailing slashes dropped) so that no spelling of the
// server's URL escapes its rules. A path that cannot be decoded is
// taken as under it: its body is decided, not let through unread.
func mcpPathUnder(p, prefix string) bool {
	if prefix == "/" {
		return true
	}
	for range 3 {
		d, err := url.PathUnescape(p)
		if err != nil {
			return true
		}
		if d == p {
			break
		}
		p = d
	}
	p = strings.ToLower(path.Clean("/" + p))
	prefix = strings.ToLower(prefix)
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

// mcpAdmit decides a request to a declared server. It answers a refused
// one itself, audits it and returns false; an admitted one is left for
// the proxy, its body replaced by the bytes that were decided.
func (g *Gate) mcpAdmit(w http.ResponseWriter, r *http.Request, rs *reqState, s *MCPServer) bool {
	st := &mcpState{server: s}
	rs.mcp = st
	if up := r.Header.Get("Upgrade"); up != "" {
		// After a 101 the proxy copies bytes both ways, unread: calls
		// inside a WebSocket would pass no rule. Streamable HTTP has no
		// upgrade.
		g.mcpRefuseBody(w, rs, http.StatusBadRequest, audit.ReasonMCPMethod,
			fmt.Sprintf("an upgrade to %q, inside which the gate could not read the calls; MCP's streamable HTTP has none", clip(up, 32)))
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodDelete:
		// Only a POST's body is read and decided: a server that took
		// messages from another method's would get them unread. A
		// declared body is refused; an undeclared one (HTTP/2 without
		// END_STREAM) is dropped, never sent.
		if r.ContentLength > 0 || len(r.TransferEncoding) > 0 {
			g.mcpRefuseBody(w, rs, http.StatusBadRequest, audit.ReasonMCPMalformed,
				fmt.Sprintf("a body on HTTP %s, which the gate does not read", r.Method))
			return false
		}
		r.Body, r.ContentLength = http.NoBody, 0
		r.Header.Del("Accept-Encoding") // a GET's stream is filtered
		return true                     // no message to decide
	case http.MethodPost:
	default:
		g.mcpRefuseBody(w, rs, http.StatusMethodNotAllowed, audit.ReasonMCPMethod,
			fmt.Sprintf("HTTP %s is not part of MCP's streamable HTTP", clip(r.Method, 32)))
		return false
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		g.mcpRefuseBody(w, rs, http.StatusUnsupportedMediaType, audit.ReasonMCPMalformed,
			fmt.Sprintf("a body in %q encoding, which the gate does not read", clip(ce, 32)))
		return false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, mcpMaxRequest+1))
	r.Body.Close()
	switch {
	case err != nil:
		g.mcpRefuseBody(w, rs, http.StatusBadRequest, audit.ReasonMCPMalformed, "the body could not be read")
		return false
	case len(body) > mcpMaxRequest:
		g.mcpRefuseBody(w, rs, http.StatusRequestEntityTooLarge, audit.ReasonMCPTooLarge,
			fmt.Sprintf("a message over %d MiB", mcpMaxRequest>>20))
		return false
	}
	d := decideMCP(s, body)
	if d.Malformed != "" {
		g.mcpRefuseBody(w, rs, http.StatusBadRequest, audit.ReasonMCPMalformed, d.Malformed)
		return false
	}
	g.mcpHold(r.Context(), s, d)
	st.calls, st.lists = d.Calls, d.ListsTools()
	// The answer is read to filter it: asked for as identity (one that
	// comes compressed anyway is decompressed, see mcpAnswer).
	r.Header.Del("Accept-Encoding")
	if !d.Allowed() && !g.report.Load() {
		// In report mode refused calls go on, audited would_deny.
		g.mcpRefuseCalls(w, rs, d)
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return true
}

// mcpHold asks a watcher about a call no pattern decides, as the gate
// asks about a destination no rule decides: one tools/call alone in its
// body (a batch is decided by its rules only), held until a watcher
// answers or the hold times out. A watcher's yes lets this call through
// and adds no pattern. With no watcher attached nothing waits.
func (g *Gate) mcpHold(ctx context.Context, s *MCPServer, d *mcpBody) {
	if g.o.Holds == nil || d.Batch || len(d.Calls) != 1 {
		return
	}
	c := &d.Calls[0]
	if c.Allow || c.Reason != audit.ReasonMCPNoRule || c.Method != "tools/call" || g.report.Load() {
		return
	}
	out := g.o.Holds.Ask(ctx, Question{Kind: KindMCPTool, Name: s.Name + " " + c.Tool})
	switch {
	case out.Allow:
		c.Allow, c.Granted, c.Reason = true, out.Answer, audit.WatcherAllowed(out.Answer)
	case out.By == ByWatcher:
		c.Reason = audit.ReasonWatcherDenied
	case out.By == ByTimeout:
		c.Reason = audit.HeldTimedOut(g.o.Holds.Timeout())
	case out.By == ByOverflow:
		c.Reason = audit.HeldOverflow(g.o.Holds.Max())
	case out.By == ByClosed:
		c.Reason = audit.ReasonWatcherLeft
	}
}

// mcpRefuseBody answers a body the gate could not decide on: one
// JSON-RPC error with a null id, and one audit record.
func (g *Gate) mcpRefuseBody(w http.ResponseWriter, rs *reqState, status int, reason audit.Reason, detail string) {
	s := rs.mcp.server
	msg := fmt.Sprintf("moat: the gate refused this message to MCP server %q: %s: %s; nothing of it was sent",
		s.Name, reason, detail)
	writeJSON(w, status, rpcError(json.RawMessage("null"), -32600, msg, nil))
	rec := g.mcpRecord(rs, mcpCall{Reason: reason})
	rec.Verdict = audit.Deny
	rec.Status = status
	g.auditMCP(rec)
}

// mcpRefuseCalls answers a body with refused calls: an error for each
// request in it (a notification gets none), the whole batch refused.
func (g *Gate) mcpRefuseCalls(w http.ResponseWriter, rs *reqState, d *mcpBody) {
	s := rs.mcp.server
	var out []json.RawMessage
	for _, c := range d.Calls {
		if c.ID != nil {
			out = append(out, rpcError(c.ID, mcpRefused, s.refusal(c), map[string]string{
				"refused_by": "moat", "server": s.Name, "rule": c.Rule, "reason": string(c.Reason)}))
		}
		if c.Decided || !c.Allow {
			rec := g.mcpRecord(rs, c)
			rec.Verdict, rec.Status = audit.Deny, http.StatusOK
			g.auditMCP(rec)
		}
	}
	switch {
	case len(out) == 0:
		w.WriteHeader(http.StatusAccepted)
	case d.Batch:
		b, _ := json.Marshal(out)
		writeJSON(w, http.StatusOK, b)
	default:
		writeJSON(w, http.StatusOK, out[0])
	}
}

// refusal is the message a refused call's error carries: what, which
// rule, and what allows it.
func (s *MCPServer) refusal(c mcpCall) string {
	what, list := fmt.Sprintf("%s %q", c.Method, c.Tool), "tools"
	switch {
	case c.URI != "":
		what, list = fmt.Sprintf("%s %q", c.Method, c.URI), "resources"
	case c.Tool == "":
		what = c.Method
	}
	where := fmt.Sprintf("[mcp.%s] %s in %s", s.Name, list, s.Source)
	name := c.Tool + c.URI
	fix := fmt.Sprintf("to allow it, add %q to %s, then: moat up --reconfigure", name, where)
	var why string
	switch c.Reason {
	case audit.ReasonMCPBlocked:
		why = fmt.Sprintf("the pattern %q of %s refuses it", c.Rule, where)
		fix = fmt.Sprintf("to allow it, remove or narrow %q in %s, then: moat up --reconfigure", c.Rule, where)
	case audit.ReasonMCPMethod:
		what = fmt.Sprintf("the method %q", c.Method)
		why = "the gate lets through only the MCP methods it decides or knows to be harmless"
		fix = "no setting allows it"
	case audit.ReasonMCPBatch:
		why = "another call in the same batch was refused, and a batch goes whole or not at all"
		fix = "send the calls one by one"
	case audit.ReasonMCPNoRule:
		why = "no pattern of " + where + " allows it"
	default:
		why = "no pattern of " + where + " allows it, and " + string(c.Reason)
		fix += " (or answer the hold in moat network watch)"
	}
	return fmt.Sprintf("moat: the gate refused %s on MCP server %q: %s; it was not sent. %s.",
		what, s.Name, why, strings.ToUpper(fix[:1])+fix[1:])
}

// mcpAudit writes the records of a carried request's calls, once its
// answer is over.
func (g *Gate) mcpAudit(rs *reqState, start time.Time) {
	st := rs.mcp
	for _, c := range st.calls {
		if !c.Decided {
			continue
		}
		rec := g.mcpRecord(rs, c)
		rec.Verdict, rec.Status = audit.Allow, rs.rec.Status
		if !c.Allow {
			rec.Verdict = audit.WouldDeny
		}
		rec.DurationMS = g.o.Now().Sub(start).Milliseconds()
		g.auditMCP(rec)
	}
}

// auditMCP writes a call's record. Refusals are counted but stay out of
// the denials ledger: it lists destinations to allow, and the
// destination is allowed; the agent got the refusal's reason and rule.
func (g *Gate) auditMCP(rec audit.Record) {
	if rec.Verdict == audit.Allow {
		g.audit(rec)
		return
	}
	g.denied.Add(1)
	rec.Sandbox = g.o.Sandbox
	if g.o.Audit != nil {
		g.o.Audit.Write(rec)
	}
}

// mcpRecord is a call's audit record, without its verdict.
func (g *Gate) mcpRecord(rs *reqState, c mcpCall) audit.Record {
	s := rs.mcp.server
	rec := audit.Record{Time: g.o.Now().UTC(), Proto: "mcp", Dst: rs.rec.Dst, Name: rs.rec.Name, NameFrom: rs.rec.NameFrom,
		Method: rs.rec.Method, Path: rs.rec.Path, Rule: c.Rule, Reason: c.Reason,
		MCPServer: s.Name, MCPMethod: clip(c.Method, 64), MCPTool: clip(c.Tool, 256)}
	if c.URI != "" {
		rec.MCPURI = auditPath(c.URI, g.o.Credentials)
	}
	if rec.Rule != "" {
		rec.Layer = "mcp." + s.Name
	}
	if c.Granted != "" {
		rec.Rule, rec.Layer = c.Granted, "interactive"
	}
	if s.AuditArguments && len(c.Args) > 0 {
		a := string(c.Args)
		if g.o.Credentials != nil {
			a = g.o.Credentials.ScrubString(a)
		}
		rec.MCPArguments = clip(a, mcpMaxAuditArgs)
	}
	return rec
}

func rpcError(id json.RawMessage, code int, msg string, data any) json.RawMessage {
	e := map[string]any{"code": code, "message": msg}
	if data != nil {
		e["data"] = data
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": e})
	return b
}

func writeJSON(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// mcpAnswer filters a declared server's answer on its way to the guest.
func (g *Gate) mcpAnswer(resp *http.Response, st *mcpState) error {
	if !hasBody(resp) {
		return nil
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct == "text/event-stream" || st.lists && ct == "application/json" {
		// Compressed anyway: read through gzip or deflate, or dropped.
		body, err := decompressed(resp)
		if err != nil {
			return err
		}
		resp.Body = body
	}
	switch {
	case ct == "text/event-stream":
		resp.Body = &sseFilter{src: resp.Body, r: newBufReader(resp.Body), s: st.server}
	case !st.lists:
		return nil
	case ct == "application/json":
		resp.Body = &jsonFilter{src: resp.Body, s: st.server}
	default:
		return fmt.Errorf("the MCP server answered a listing as %q, which the gate cannot filter; it was dropped", clip(ct, 64))
	}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	return nil
}

// errMCPAnswerTooLarge ends an answer the gate would have to hold whole
// beyond its bound.
var errMCPAnswerTooLarge = fmt.Errorf("an MCP answer or event over %d MiB; the gate cut it", mcpMaxAnswer>>20)

// jsonFilter holds a JSON answer whole at its first Read, filters it,
// then gives it out.
type jsonFilter struct {
	src  io.ReadCloser
	s    *MCPServer
	out  *bytes.Reader
	done bool
}

func (f *jsonFilter) Read(p []byte) (int, error) {
	if !f.done {
		f.done = true
		b, err := io.ReadAll(io.LimitReader(f.src, mcpMaxAnswer+1))
		if err != nil {
			return 0, err
		}
		if len(b) > mcpMaxAnswer {
			return 0, errMCPAnswerTooLarge
		}
		b, _ = f.s.filterAnswer(b)
		f.out = bytes.NewReader(b)
	}
	return f.out.Read(p)
}

func (f *jsonFilter) Close() error { return f.src.Close() }

// sseFilter passes an SSE stream on event by event, each held until its
// blank line and filtered. The part of an event the stream ended in is
// dropped, and the guest sees the stream end with an error, as it would
// have without the gate.
type sseFilter struct {
	src io.ReadCloser
	r   *bufio.Reader
	s   *MCPServer
	out []byte // what is ready for the guest
	err error  // what to return once out is given
}

func (f *sseFilter) Read(p []byte) (int, error) {
	for len(f.out) == 0 && f.err == nil {
		f.out, f.err = f.next()
	}
	if len(f.out) > 0 {
		n := copy(p, f.out)
		f.out = f.out[n:]
		return n, nil
	}
	return 0, f.err
}

func (f *sseFilter) Close() error { return f.src.Close() }

// next reads one whole event (its lines and the blank line that ends
// it) and returns it filtered.
func (f *sseFilter) next() ([]byte, error) {
	var ev []byte
	for {
		line, err := f.r.ReadSlice('\n')
		if len(ev)+len(line) > mcpMaxAnswer {
			return nil, errMCPAnswerTooLarge
		}
		ev = append(ev, line...)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(ev) == 0:
			return nil, io.EOF
		case err == io.EOF:
			// Cut in the middle of an event: none of it goes on.
			return nil, io.ErrUnexpectedEOF
		case err != nil:
			return nil, err
		}
		if l := bytes.TrimRight(line, "\r\n"); len(l) == 0 {
			return f.filterEvent(ev), nil
		}
	}
}

// filterEvent rewrites an event whose data is an answer the rules
// filter; any other event goes on as it came.
func (f *sseFilter) filterEvent(ev []byte) []byte {
	var data [][]byte
	lines := bytes.SplitAfter(ev, []byte("\n"))
	for _, l := range lines {
		if v, ok := bytes.CutPrefix(bytes.TrimRight(l, "\r\n"), []byte("data:")); ok {
			data = append(data, bytes.TrimPrefix(v, []byte(" ")))
		}
	}
	if len(data) == 0 {
		return ev
	}
	filtered, changed := f.s.filterAnswer(bytes.Join(data, []byte("\n")))
	if !changed {
		return ev
	}
	var out []byte
	wrote := false
	for _, l := range lines {
		if bytes.HasPrefix(l, []byte("data:")) {
			if !wrote {
				out = append(append(append(out, "data: "...), filtered...), '\n')
				wrote = true
			}
			continue
		}
		out = append(out, l...)
	}
	return out
}

func newBufReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, 64<<10) }
