// Package control is the daemon's control API: HTTP/1.1 over the unix
// socket control.sock (mode 0600) in the sandbox's state directory.
//
// Specification. Every JSON object carries "schema": 1; fields are only ever
// added.
//
//	GET  /v1/status      200 Status
//	POST /v1/stop        202 {"schema":1}; body StopRequest (optional). The daemon stops
//	                     the guest and exits; clients wait for the daemon lock to be free.
//	GET  /v1/ssh         with "Connection: Upgrade", "Upgrade: moat-ssh": 101, after which
//	                     the client speaks SSH on the connection. The server is the daemon's
//	                     session proxy: it presents the guest agent's host key, accepts only
//	                     the sandbox's client key, and carries each channel to the agent
//	                     on the one SSH connection it keeps over its netstack (see
//	                     session.Proxy).
//
// Errors are JSON {"schema":1,"error":"..."} with a 4xx/5xx status.
package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"
)

// Schema is the version of every object here.
const Schema = 1

// UpgradeProto is the Upgrade token of /v1/ssh.
const UpgradeProto = "moat-ssh"

// Status is GET /v1/status.
type Status struct {
	Schema    int       `json:"schema"`
	Name      string    `json:"name"`
	State     string    `json:"state"`
	PID       int       `json:"pid"`
	Started   time.Time `json:"started"`
	Sessions  int       `json:"sessions"`
	Image     string    `json:"image"`
	Workspace string    `json:"workspace"`
	Denials   int64     `json:"denials"` // connections the gate denied since start
	// Warnings are what the user must hear about the sandbox's policy:
	// a named policy's list that was never fetched (its layer is empty),
	// a refresh that failed, lines of a list that were rejected.
	Warnings []string `json:"warnings,omitempty"`
	// Resources is nil when the sandbox runs without a cgroup.
	Resources *Resources `json:"resources,omitempty"`
	// Activity: traffic and idleness, as the idle stop sees them.
	Activity *Activity `json:"activity,omitempty"`
	// Gate: the network gate's mode and its interactive watchers.
	Gate *GateStatus `json:"gate,omitempty"`
	// Disk: the writable layer's use and limit; nil for a sandbox
	// without a limit (disk = "unlimited").
	Disk *Disk `json:"disk,omitempty"`
	// Platform: gVisor's platform the sandbox runs on ("kvm", "systrap").
	Platform string `json:"platform,omitempty"`
}

// Activity is what the idle stop measures.
type Activity struct {
	NetBytes    uint64        `json:"net_bytes"`             // both directions since start
	IdleFor     time.Duration `json:"idle_for_ns"`           // 0 when the last sample was busy
	IdleTimeout time.Duration `json:"idle_timeout_ns"`       // 0: idle stop off
	LastCPU     float64       `json:"last_cpu_cores"`        // the last sample's CPU use, in cores
	LastSample  time.Time     `json:"last_sample,omitzero"`  // zero before the first sample
	Busy        string        `json:"busy_reason,omitempty"` // why the last sample was not idle
}

// GateStatus is the gate's mode and interactive state.
type GateStatus struct {
	Mode     string `json:"mode"` // enforce | report
	Watchers int    `json:"watchers"`
	Holds    int    `json:"holds"` // connections' destinations waiting for an answer
	// AuditLost counts the audit records never written since the daemon
	// started (a full queue, a full disk); the audit log itself says so
	// too once it can be written. AuditFailing is why the audit log
	// cannot be written now, while the gate lets nothing through.
	AuditLost    int64  `json:"audit_lost"`
	AuditFailing string `json:"audit_failing,omitempty"`
}

// StopRequest is the body of POST /v1/stop.
type StopRequest struct {
	Schema int    `json:"schema"`
	Reason string `json:"reason"` // user | idle | host
}

// ErrorBody is the body of every error response.
type ErrorBody struct {
	Schema int    `json:"schema"`
	Error  string `json:"error"`
}

// Client talks to one daemon.
type Client struct {
	sock string
	http *http.Client
}

// New returns a client for the socket at path.
func New(sock string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}
	return &Client{sock: sock, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// Status asks the daemon for its status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	if err := c.do(ctx, http.MethodGet, "/v1/status", nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Stop asks the daemon to stop the sandbox.
func (c *Client) Stop(ctx context.Context, reason string) error {
	return c.do(ctx, http.MethodPost, "/v1/stop", StopRequest{Schema: Schema, Reason: reason}, nil)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://moat"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("calling daemon %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return errorOf("daemon "+path, resp)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// Socket is the control socket of the sandbox whose state directory is
// dir (0600, the daemon's); its name is on disk: frozen.
func Socket(dir string) string { return filepath.Join(dir, "control.sock") }

// At is the control client of the sandbox whose state directory is dir.
func At(dir string) *Client { return New(Socket(dir)) }

// HTTPError is the daemon's refusal of a control request: the status it
// answered with and its message. A 4xx status means the request was wrong
// (the CLI exits 2, bad usage); a 5xx, that the daemon failed (exit 1).
type HTTPError struct {
	What   string // "daemon /v1/network/rules"
	Status int
	Msg    string
}

func (e *HTTPError) Error() string { return e.What + ": " + e.Msg }

// errorOf reads an error response. A body that is not ErrorBody (the
// 404 of an older daemon without the endpoint, from net/http's mux) is
// kept as its text, so the user sees more than the request's path.
func errorOf(what string, resp *http.Response) *HTTPError {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	var e ErrorBody
	if json.Unmarshal(b, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(b))
	}
	if e.Error == "" {
		e.Error = http.StatusText(resp.StatusCode)
	}
	return &HTTPError{What: what, Status: resp.StatusCode, Msg: e.Error}
}

// DialSSH opens the byte stream to the guest agent.
func (c *Client) DialSSH(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.sock)
	if err != nil {
		return nil, fmt.Errorf("connecting to daemon: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	fmt.Fprintf(conn, "GET /v1/ssh HTTP/1.1\r\nHost: moat\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", UpgradeProto)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("reading daemon upgrade response: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		err := errorOf("daemon refused the session", resp)
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return &bufConn{Conn: conn, r: br}, nil
}

// Hijacked is the connection of a /v1/ssh request after the daemon has
// answered 101: conn, reading first what the server's reader r buffered
// past the request.
func Hijacked(conn net.Conn, r *bufio.Reader) net.Conn { return &bufConn{Conn: conn, r: r} }

// bufConn keeps bytes an HTTP reader buffered past the response (or the
// request).
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// CloseWrite half-closes, so a client can signal EOF.
func (b *bufConn) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("no half-close")
}
