package gate

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/peek"
	"moat.dev/moat/internal/policy"
)

// Refusals an agent can read. A bare reset looks like an outage, and an
// agent that takes a policy block for an outage retries, or works around
// it; a page that names what was refused and the command that would allow
// it ends that. Plain HTTP always gets the page; HTTPS gets it when the
// gate can terminate TLS (it has the sandbox's CA, which the guest trusts),
// else a TLS access_denied alert.

// accessDenied is a TLS fatal alert record, access_denied (49). Alerts
// sent before the handshake completes are in the clear, so the gate can
// send one without terminating TLS, and the client says "alert access
// denied" instead of a bare reset that looks like an outage.
var accessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49}

func refuseTLS(c net.Conn) {
	c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	c.Write(accessDenied)
	c.Close()
}

// refusal is the page for one refused connection or request.
type refusal struct {
	status int    // the HTTP status: 403 unless something more exact fits
	host   string // what was refused, for the X-Moat-Denied header
	body   string // text for people and agents: what, why, how to allow it
}

// refusalFor builds the page for a denial whose audit record is rec: host
// and port are what the guest asked for, request says the request was
// refused rather than the host. Every refusal, over plain HTTP or inside
// TLS, goes through here, so an agent meets one wording.
func (g *Gate) refusalFor(host string, port uint16, rec audit.Record, request bool) refusal {
	r := refusal{status: http.StatusForbidden, host: host}
	what := host
	if request && rec.Method != "" {
		what = fmt.Sprintf("%s with %s %s", host, rec.Method, rec.Path)
	}
	r.body = fmt.Sprintf("moat: the sandbox %q may not reach %s (port %d): %s.\n",
		g.o.Sandbox, what, port, reasonText(rec))
	switch {
	case rec.Reason == "" || rec.Reason == audit.ReasonBlocked || rec.Reason.Is(audit.ReasonNoRule):
		entry := allowEntry(host, port)
		if request && rec.Method != "" {
			entry = requestEntry(host, port, rec.Method, rec.Path)
		}
		switch {
		case entry == "":
		case g.o.RulesAt != "":
			r.body += fmt.Sprintf("To allow it, add to the [network] allow list in %s:\n\n    %q\n", g.o.RulesAt, entry)
		default:
			if strings.Contains(entry, " ") {
				entry = "'" + entry + "'"
			}
			r.body += fmt.Sprintf("To allow it, run on the host:\n\n    moat network allow %s %s\n", g.o.Sandbox, entry)
		}
	case rec.Reason.Is(audit.ReasonBadHead):
		r.status = http.StatusBadRequest
	case rec.Reason.Is(audit.ReasonFronting):
		// RFC 9110 §15.5.20: the client may retry on a new connection,
		// which is what a client that reused a connection across hosts
		// by mistake needs to do.
		r.status = http.StatusMisdirectedRequest
	}
	return r
}

// writeRaw answers on a plain connection the gate has not handed to an
// HTTP server (the plain-HTTP path reads only the head), then closes it.
func (r refusal) writeRaw(c net.Conn, now time.Time) {
	defer c.Close()
	c.SetWriteDeadline(now.Add(5 * time.Second))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Moat-Denied: %s\r\n\r\n%s",
		r.status, http.StatusText(r.status), len(r.body), r.host, r.body)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// serve answers one request inside a terminated TLS connection.
func (r refusal) serve(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(r.body)))
	h.Set("X-Moat-Denied", r.host)
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(r.status)
	w.Write([]byte(r.body))
}

// refuseHTTP answers a denied plain-HTTP request with the readable page.
func (g *Gate) refuseHTTP(c net.Conn, req peek.Request, dst netip.AddrPort, t *tcpTrace) {
	host := req.Host
	if host == "" {
		host = dst.Addr().String()
	}
	g.refusalFor(host, dst.Port(), t.rec, t.request).writeRaw(c, g.o.Now())
}

func reasonText(r audit.Record) string {
	switch {
	case r.Reason == "" || r.Reason == audit.ReasonNoRule:
		return string(audit.ReasonNoRule)
	case r.Reason == audit.ReasonBlocked:
		return "blocked by " + r.Layer + " rule " + strconv.Quote(r.Rule)
	}
	return string(r.Reason)
}

// requestEntry is the allow entry for one request: a request rule for
// its method and exact path. "" when the path cannot be written as a rule
// (it does not normalize, or the audit cut it).
func requestEntry(host string, port uint16, method, path string) string {
	p, err := policy.NormalizePath(path)
	if err != nil || strings.ContainsAny(p, "*?\"'") || strings.HasSuffix(path, "…") {
		return ""
	}
	return fmt.Sprintf("%s %s%s", method, allowEntry(host, port), p)
}
