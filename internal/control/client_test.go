package control

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeDaemon serves h on a control socket in a temp dir, as the daemon
// does (HTTP/1.1 over a unix socket), and returns a client for it.
func fakeDaemon(t *testing.T, h http.Handler) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "control.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return New(sock)
}

// answer writes v as the daemon writes its answers.
func answer(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// call is every request the client makes with a plain answer, so that
// each is checked for the same error contract.
type call struct {
	method, path string
	do           func(context.Context, *Client) error
}

var calls = []call{
	{"GET", "/v1/status", func(ctx context.Context, c *Client) error { _, err := c.Status(ctx); return err }},
	{"POST", "/v1/stop", func(ctx context.Context, c *Client) error { return c.Stop(ctx, "user") }},
	{"GET", "/v1/network/rules", func(ctx context.Context, c *Client) error { _, err := c.Rules(ctx); return err }},
	{"POST", "/v1/network/rules", func(ctx context.Context, c *Client) error {
		_, err := c.ChangeRules(ctx, RuleChange{Op: "allow", Entries: []string{"example.com"}})
		return err
	}},
	{"GET", "/v1/network/denials", func(ctx context.Context, c *Client) error { _, err := c.Denials(ctx); return err }},
	{"GET", "/v1/forwards", func(ctx context.Context, c *Client) error { _, err := c.Forwards(ctx); return err }},
	{"POST", "/v1/forwards", func(ctx context.Context, c *Client) error {
		_, err := c.ChangeForward(ctx, ForwardChange{Op: "add", Spec: "3000"})
		return err
	}},
	{"POST", "/v1/policies/reload", func(ctx context.Context, c *Client) error { _, err := c.ReloadPolicies(ctx); return err }},
	{"POST", "/v1/presets", func(ctx context.Context, c *Client) error {
		_, err := c.Preset(ctx, PresetRequest{Name: "claude"})
		return err
	}},
	{"POST", "/v1/secrets/refresh", func(ctx context.Context, c *Client) error {
		_, err := c.RefreshSecrets(ctx, SecretsRefreshRequest{})
		return err
	}},
	{"POST", "/v1/holds/h1", func(ctx context.Context, c *Client) error {
		_, err := c.AnswerHold(ctx, "h1", Answer{Answer: AnswerOnce})
		return err
	}},
}

// TestClientErrorKeepsStatus: every request the daemon refuses comes back
// as an *HTTPError with the daemon's status and message, which the CLI
// turns into its exit code (4xx: bad usage, 5xx: an error).
func TestClientErrorKeepsStatus(t *testing.T) {
	for _, status := range []int{400, 404, 409, 500, 503} {
		msg := "refused with " + http.StatusText(status)
		var got []string
		c := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = append(got, r.Method+" "+r.URL.Path)
			answer(w, status, ErrorBody{Schema: Schema, Error: msg})
		}))
		for _, cl := range calls {
			err := cl.do(context.Background(), c)
			var he *HTTPError
			if !errors.As(err, &he) {
				t.Errorf("%s %s answered %d: error %v (%T) is not an *HTTPError", cl.method, cl.path, status, err, err)
				continue
			}
			if he.Status != status || he.Msg != msg || !strings.Contains(he.What, cl.path) {
				t.Errorf("%s %s answered %d: got %+v", cl.method, cl.path, status, he)
			}
			if !strings.Contains(err.Error(), msg) {
				t.Errorf("%s %s: error %q does not carry the daemon's message", cl.method, cl.path, err)
			}
		}
		// Each call asked what its name says, and nothing else.
		var want []string
		for _, cl := range calls {
			want = append(want, cl.method+" "+cl.path)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("requests:\n got %q\nwant %q", got, want)
		}
	}
}

// TestClientErrorWithoutBody: a refusal whose body is not the daemon's
// JSON (the 404 of an older daemon that lacks the endpoint, from
// net/http's mux) keeps its status, and its text or the status's name
// as the message.
func TestClientErrorWithoutBody(t *testing.T) {
	for _, tt := range []struct {
		status int
		body   string
		want   string
	}{
		{http.StatusNotFound, "404 page not found\n", "daemon /v1/status: 404 page not found"},
		{http.StatusInternalServerError, "", "daemon /v1/status: Internal Server Error"},
		{http.StatusBadRequest, `{"schema":1}`, `daemon /v1/status: {"schema":1}`},
	} {
		c := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tt.status)
			io.WriteString(w, tt.body)
		}))
		_, err := c.Status(context.Background())
		var he *HTTPError
		if !errors.As(err, &he) || he.Status != tt.status {
			t.Errorf("%d %q: got %v (%T), want an *HTTPError with status %d", tt.status, tt.body, err, err, tt.status)
		} else if err.Error() != tt.want {
			t.Errorf("%d %q: error %q, want %q", tt.status, tt.body, err, tt.want)
		}
	}
}

// TestClientStatus: Status decodes every field the daemon sends, the
// nested objects included.
func TestClientStatus(t *testing.T) {
	want := Status{
		Schema: Schema, Name: "api", State: "running", PID: 4242,
		Started:  time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC),
		Sessions: 2, Image: "host", Workspace: "/src/api", Denials: 7,
		Warnings:  []string{"policy ads: list never fetched"},
		Resources: &Resources{CPUs: 2, MemoryUsageBytes: 1 << 30, MemoryPressure: -1, HostPressure: "calm", PidsMax: 4096},
		Activity:  &Activity{NetBytes: 1234, IdleFor: 3 * time.Minute, IdleTimeout: time.Hour, Busy: "a session"},
		Gate:      &GateStatus{Mode: "enforce", Watchers: 1, Holds: 2, AuditLost: 3},
		Disk:      &Disk{LimitBytes: 10 << 30, UsedBytes: 1 << 30, HostBytes: 1 << 29},
		Platform:  "systrap",
	}
	c := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/status" {
			answer(w, http.StatusNotFound, ErrorBody{Schema: Schema, Error: "no such endpoint"})
			return
		}
		answer(w, http.StatusOK, want)
	}))
	got, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("Status:\n got %+v\nwant %+v", *got, want)
	}
}

// TestClientRequestBodies: what the client sends is the schema the
// package doc specifies, with "schema": 1 filled in whatever the caller
// passed.
func TestClientRequestBodies(t *testing.T) {
	bodies := map[string]map[string]any{}
	c := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v map[string]any
		if err := json.NewDecoder(r.Body).Decode(&v); err != nil && !errors.Is(err, io.EOF) {
			t.Errorf("%s %s: body is not JSON: %v", r.Method, r.URL.Path, err)
		}
		bodies[r.URL.Path] = v
		answer(w, http.StatusOK, map[string]any{"schema": Schema})
	}))
	ctx := context.Background()
	if err := c.Stop(ctx, "idle"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ChangeRules(ctx, RuleChange{Op: "block", Entries: []string{"a.example", "*.b.example:443"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ChangeForward(ctx, ForwardChange{Op: "add", Reverse: true, Spec: "15432:5432"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Preset(ctx, PresetRequest{Name: "claude", Env: map[string]string{"K": "v"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AnswerHold(ctx, "h7", Answer{Answer: AnswerAlways, Scope: ScopeUser, Written: "/home/u/.config/moat/config.toml"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReloadPolicies(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]any{
		"/v1/stop":            {"schema": 1.0, "reason": "idle"},
		"/v1/network/rules":   {"schema": 1.0, "op": "block", "entries": []any{"a.example", "*.b.example:443"}},
		"/v1/forwards":        {"schema": 1.0, "op": "add", "reverse": true, "spec": "15432:5432"},
		"/v1/presets":         {"schema": 1.0, "name": "claude", "env": map[string]any{"K": "v"}},
		"/v1/holds/h7":        {"schema": 1.0, "answer": "always", "scope": "user", "written": "/home/u/.config/moat/config.toml"},
		"/v1/policies/reload": nil, // no body
	}
	if !reflect.DeepEqual(bodies, want) {
		t.Errorf("bodies:\n got %v\nwant %v", bodies, want)
	}
}

// TestClientNoDaemon: with no daemon there is no HTTP status to keep:
// the error is the dial's, which says which socket and why (the CLI
// checks the daemon's lock first and says the sandbox is not running).
func TestClientNoDaemon(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name  string
		setup func(sock string)
		is    error
	}{
		{"no socket", func(string) {}, fs.ErrNotExist},
		// A daemon killed with SIGKILL leaves its socket behind.
		{"stale socket", func(sock string) {
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			ln.(*net.UnixListener).SetUnlinkOnClose(false)
			ln.Close()
		}, syscall.ECONNREFUSED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".sock")
			tt.setup(sock)
			for _, cl := range calls {
				err := cl.do(context.Background(), New(sock))
				var he *HTTPError
				switch {
				case err == nil:
					t.Errorf("%s %s: no error without a daemon", cl.method, cl.path)
				case errors.As(err, &he):
					t.Errorf("%s %s: %v is an *HTTPError without a daemon to answer", cl.method, cl.path, err)
				case !errors.Is(err, tt.is):
					t.Errorf("%s %s: %v is not %v", cl.method, cl.path, err, tt.is)
				case !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "calling daemon "+cl.path):
					t.Errorf("%s %s: %q names neither the socket nor the request", cl.method, cl.path, err)
				}
			}
			if _, err := New(sock).DialSSH(context.Background()); !errors.Is(err, tt.is) {
				t.Errorf("DialSSH: %v is not %v", err, tt.is)
			}
		})
	}
}

// TestClientDeadline: a daemon that never answers holds a request only
// until the caller's deadline.
func TestClientDeadline(t *testing.T) {
	c := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Status(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Status returned after %v, long past its 100ms deadline", d)
	}
}

// TestDialSSH: the upgrade to the SSH stream, and the daemon's refusal
// of a session kept as an *HTTPError (IsStopping reads it).
func TestDialSSH(t *testing.T) {
	t.Run("upgrade", func(t *testing.T) {
		c := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/ssh" || r.Header.Get("Upgrade") != UpgradeProto {
				answer(w, http.StatusBadRequest, ErrorBody{Schema: Schema, Error: "not an upgrade"})
				return
			}
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			// The first bytes after the 101 ride in the same write, as
			// they may from a real daemon: the client must not lose them.
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + UpgradeProto + "\r\n\r\nSSH-2.0-fake\r\n")
			brw.Flush()
			line, _ := brw.ReadString('\n')
			brw.WriteString("echo " + line)
			brw.Flush()
		}))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := c.DialSSH(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, "SSH-2.0-client\r\n"); err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(conn)
		if want := "SSH-2.0-fake\r\necho SSH-2.0-client\r\n"; string(got) != want {
			t.Errorf("stream read %q, want %q", got, want)
		}
	})
	t.Run("stopping", func(t *testing.T) {
		c := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			answer(w, http.StatusServiceUnavailable, ErrorBody{Schema: Schema, Error: ErrStopping})
		}))
		_, err := c.DialSSH(context.Background())
		var he *HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusServiceUnavailable {
			t.Fatalf("got %v, want an *HTTPError with status 503", err)
		}
		if !IsStopping(err) {
			t.Errorf("IsStopping(%v) = false", err)
		}
	})
}

// TestWatch: the event stream is read line by line until the daemon
// closes it (an error: the watcher reconnects) or the caller's context
// ends (nil); a refused stream keeps the daemon's status.
func TestWatch(t *testing.T) {
	events := []Event{
		{Schema: Schema, Type: EventHello, Sandbox: "api", Timeout: 30 * time.Second},
		{Schema: Schema, Type: EventHold, Sandbox: "api", Hold: &Hold{ID: "h1", Name: "x.example", Port: 443, Count: 1, Suggest: "x.example"}},
	}
	c := fakeDaemon(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("t") {
		case "refused":
			answer(w, http.StatusConflict, ErrorBody{Schema: Schema, Error: "too many watchers"})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, ev := range events {
			enc.Encode(ev)
		}
		w.(http.Flusher).Flush()
		if r.URL.Query().Get("t") == "open" {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}
	}))
	with := func(query string) *Client {
		rc := *c
		rc.http = &http.Client{Transport: rewrite{c.http.Transport, func(r *http.Request) { r.URL.RawQuery = query }}}
		return &rc
	}

	t.Run("closed by the daemon", func(t *testing.T) {
		var got []Event
		err := c.Watch(context.Background(), func(ev Event) error { got = append(got, ev); return nil })
		if err == nil || !strings.Contains(err.Error(), "closed") {
			t.Errorf("Watch returned %v, want the daemon closing the stream", err)
		}
		if len(got) != len(events) || got[0].Type != EventHello || got[1].Hold == nil || got[1].Hold.ID != "h1" {
			t.Errorf("events: %+v", got)
		}
	})
	t.Run("stopped by fn", func(t *testing.T) {
		stop := errors.New("enough")
		n := 0
		err := c.Watch(context.Background(), func(Event) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Errorf("Watch returned %v after %d events, want fn's error after 1", err, n)
		}
	})
	t.Run("refused", func(t *testing.T) {
		err := with("t=refused").Watch(context.Background(), func(Event) error { return nil })
		if err == nil || !strings.Contains(err.Error(), "too many watchers") {
			t.Errorf("Watch returned %v, want the daemon's refusal", err)
		}
		var he *HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusConflict {
			t.Errorf("Watch returned %v (%T), want an *HTTPError with status 409", err, err)
		}
	})
	t.Run("ended by the caller", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		n := 0
		err := with("t=open").Watch(ctx, func(Event) error {
			if n++; n == len(events) {
				cancel()
			}
			return nil
		})
		if err != nil {
			t.Errorf("Watch returned %v after its context ended, want nil", err)
		}
	})
}

// rewrite changes each request before the transport sends it.
type rewrite struct {
	http.RoundTripper
	f func(*http.Request)
}

func (rw rewrite) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	rw.f(r)
	return rw.RoundTripper.RoundTrip(r)
}
