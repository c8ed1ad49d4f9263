package gateserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/secret"
)

// controlFixture is a service with one tenant whose TOKEN is pushed and
// whose KEY is read from a file, serving only its control socket.
type controlFixture struct {
	svc    *Service
	sock   string
	policy string
	dir    string
	client *http.Client
}

const controlPolicy = `[network]
allow = ["api.test", "files.test"]

[secrets.TOKEN]
from = "env:MOAT_CONTROL_TEST_UNSET"
hosts = ["api.test"]

[secrets.KEY]
from = "file:DIR/key"
hosts = ["files.test"]
`

func newControlFixture(t *testing.T, pushed string) *controlFixture {
	t.Helper()
	dir := t.TempDir()
	f := &controlFixture{dir: dir, sock: filepath.Join(dir, "control", "control.sock"), policy: filepath.Join(dir, "tenant.toml")}
	if err := os.WriteFile(filepath.Join(dir, "key"), []byte("file-key-value-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.writePolicy(t, controlPolicy)
	conf := fmt.Sprintf(`[service]
state_dir = %q
control = %q

[listen]
dns = ["127.0.0.1:53"]
https = ["127.0.0.1:443"]

[tenants.alpha]
sources = ["10.9.0.3"]
policy = [%q]
pushed = [%s]
`, filepath.Join(dir, "state"), f.sock, f.policy, pushed)
	path := filepath.Join(dir, "gate.toml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := listenControl(cfg.Control)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{Config: cfg, Listeners: &Listeners{Control: cl},
		Resolvers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")}, HostAddrs: []netip.Addr{}})
	if err != nil {
		cl.Close()
		t.Fatal(err)
	}
	f.svc = svc
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.Serve(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the service did not stop within 10 s")
		}
	})
	f.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", f.sock)
		}}}
	return f
}

func (f *controlFixture) writePolicy(t *testing.T, body string) {
	t.Helper()
	if err := os.WriteFile(f.policy, []byte(strings.ReplaceAll(body, "DIR", f.dir)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// call sends one request and returns the status and the decoded body.
func (f *controlFixture) call(t *testing.T, method, path, body string) (int, map[string]any, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://gate"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil || out["schema"] != float64(1) {
		t.Errorf("%s %s: answer %q is not a schema 1 object", method, path, raw)
	}
	return resp.StatusCode, out, string(raw)
}

// swapped is what the tenant's gate sends host for a request carrying
// the placeholder of name, or the refusal.
func (f *controlFixture) swapped(name, host string) (string, error) {
	c := f.svc.tenants.Load().byName["alpha"].creds
	h := http.Header{"Authorization": {"Bearer " + c.placeholders()[name]}}
	if !c.Bound(host) {
		return "", errors.New("not bound: would be spliced")
	}
	_, err := c.Request(host, h, &url.URL{Path: "/"})
	return strings.TrimPrefix(h.Get("Authorization"), "Bearer "), err
}

func TestControlPush(t *testing.T) {
	f := newControlFixture(t, `"TOKEN"`)
	phFile := filepath.Join(f.dir, "state", "placeholders", "alpha.env")
	before, _ := readPlaceholders(phFile)
	if !secret.ValidPlaceholder(before["TOKEN"]) || !secret.ValidPlaceholder(before["KEY"]) {
		t.Fatalf("placeholders before the push = %v; want TOKEN's made already, and KEY's", before)
	}
	// Before its value arrives, TOKEN's host is intercepted and refused.
	if got, err := f.swapped("TOKEN", "api.test"); err == nil || !strings.Contains(err.Error(), "TOKEN") {
		t.Errorf("a request to api.test before the push: sent %q, err %v; want it refused naming TOKEN", got, err)
	}
	if got, err := f.swapped("KEY", "files.test"); err != nil || got != "file-key-value-0123456789" {
		t.Errorf("KEY (a file) before the push: %q, %v", got, err)
	}
	code, out, _ := f.call(t, "GET", "/v1/tenants", "")
	if code != 200 || fmt.Sprint(out["tenants"]) != "[map[name:alpha pending:[TOKEN] pushed:[TOKEN]]]" {
		t.Errorf("GET /v1/tenants: %d %v", code, out)
	}

	const value = "pushed-token-value-0123456789"
	code, out, raw := f.call(t, "PUT", "/v1/tenants/alpha/secrets", `{"schema":1,"values":{"TOKEN":"`+value+`"}}`)
	if code != 200 || fmt.Sprint(out["pending"]) != "[]" || out["tenant"] != "alpha" || strings.Contains(raw, value) {
		t.Fatalf("push: %d %s", code, raw)
	}
	if got, err := f.swapped("TOKEN", "api.test"); err != nil || got != value {
		t.Errorf("api.test after the push: sent %q, %v; want the pushed value", got, err)
	}
	if got, err := f.swapped("TOKEN", "files.test"); err != nil || got == value {
		t.Errorf("files.test (not TOKEN's host) got %q, %v", got, err)
	}
	after, _ := readPlaceholders(phFile)
	if after["TOKEN"] != before["TOKEN"] {
		t.Errorf("the push changed TOKEN's placeholder from %s to %s", before["TOKEN"], after["TOKEN"])
	}
	// The value is nowhere on disk.
	filepath.Walk(f.dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(value)) {
				t.Errorf("%s holds the pushed value", p)
			}
		}
		return nil
	})

	// A reload, by the control API, keeps the pushed value and applies
	// the new rules.
	f.writePolicy(t, strings.Replace(controlPolicy, `"files.test"]`, `"files.test", "new.test"]`, 1))
	if code, out, _ := f.call(t, "POST", "/v1/reload", ""); code != 200 {
		t.Fatalf("reload: %d %v", code, out)
	}
	if got, err := f.swapped("TOKEN", "api.test"); err != nil || got != value {
		t.Errorf("api.test after a reload: sent %q, %v; want the pushed value still", got, err)
	}
	if d := f.svc.tenants.Load().byName["alpha"].gate.Policy().Name("new.test", 443); d.Verdict != policy.Allow {
		t.Errorf("the reload did not apply the new rule: new.test is %v", d)
	}
	// A policy that no longer defines a pushed secret is refused; the
	// old configuration stays.
	f.writePolicy(t, "[network]\nallow = [\"api.test\"]\n")
	if code, out, _ := f.call(t, "POST", "/v1/reload", ""); code != 409 || !strings.Contains(fmt.Sprint(out["error"]), "pushed names TOKEN") {
		t.Errorf("reload without TOKEN's table: %d %v; want 409 naming it", code, out)
	}
	if got, err := f.swapped("TOKEN", "api.test"); err != nil || got != value {
		t.Errorf("after a refused reload: sent %q, %v", got, err)
	}
}

func TestControlBadRequests(t *testing.T) {
	f := newControlFixture(t, `"TOKEN"`)
	const short = "tiny"
	for _, tc := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"PUT", "/v1/tenants/alpha/secrets", `{"schema":2,"values":{"TOKEN":"pushed-token-value-0123"}}`, 400, "schema 2"},
		{"PUT", "/v1/tenants/alpha/secrets", `{"schema":1,"values":{"TOKEN":"pushed-token-value-0123"},"x":1}`, 400, "the body is not"},
		{"PUT", "/v1/tenants/alpha/secrets", `{"schema":1,"values":`, 400, "the body is not"},
		{"PUT", "/v1/tenants/alpha/secrets", `{"schema":1,"values":{}}`, 400, "values is empty"},
		{"PUT", "/v1/tenants/alpha/secrets", `{"schema":1,"values":{"KEY":"pushed-token-value-0123"}}`, 400, "KEY"},
		{"PUT", "/v1/tenants/beta/secrets", `{"schema":1,"values":{"TOKEN":"pushed-token-value-0123"}}`, 404, "beta"},
		{"PUT", "/v1/tenants/alpha/secrets", `{"schema":1,"values":{"TOKEN":"` + short + `"}}`, 409, "TOKEN"},
		{"PUT", "/v1/tenants/alpha/secrets", `{"schema":1,"values":{"TOKEN":"line\nbreak-0123456789"}}`, 409, "line break"},
		{"GET", "/v1/tenants/alpha/secrets", "", 405, ""},
		{"GET", "/v1/reload", "", 405, ""},
		{"POST", "/v1/nothing", "", 404, "not in the control API"},
		{"PUT", "/v1/tenants/alpha/secrets", `{"schema":1,"values":{"TOKEN":"` + strings.Repeat("x", 2<<20) + `"}}`, 400, "1 MiB"},
	} {
		req, _ := http.NewRequest(tc.method, "http://gate"+tc.path, strings.NewReader(tc.body))
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(raw), tc.want) {
			t.Errorf("%s %s %.60s: %d %s; want %d with %q", tc.method, tc.path, tc.body, resp.StatusCode, raw, tc.code, tc.want)
		}
		// An answer never repeats a value.
		if strings.Contains(string(raw), short) || strings.Contains(string(raw), "pushed-token-value") {
			t.Errorf("%s %s: the answer repeats the value: %s", tc.method, tc.path, raw)
		}
	}
	// Nothing was taken: TOKEN is still pending, its host refused.
	if _, err := f.swapped("TOKEN", "api.test"); err == nil {
		t.Errorf("after refused pushes, api.test is not refused")
	}
}

func TestControlConfig(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"[service]\nstate_dir = \"/s\"\n[listen]\ndns = [\"10.0.0.1\"]\nhttps = [\"10.0.0.1\"]\n[tenants.a]\nsources = [\"10.0.1.0/24\"]\npolicy = [\"/p\"]\npushed = [\"T\"]\n",
			"gate.toml:9: tenants.a.pushed: needs service.control"},
		{"[service]\nstate_dir = \"/s\"\ncontrol = \"rel.sock\"\n[listen]\ndns = [\"10.0.0.1\"]\nhttps = [\"10.0.0.1\"]\n[tenants.a]\nsources = [\"10.0.1.0/24\"]\npolicy = [\"/p\"]\n",
			"gate.toml:3: service.control: \"rel.sock\": write an absolute path"},
		{"[service]\nstate_dir = \"/s\"\ncontrol = \"/c.sock\"\n[listen]\ndns = [\"10.0.0.1\"]\nhttps = [\"10.0.0.1\"]\n[tenants.a]\nsources = [\"10.0.1.0/24\"]\npolicy = [\"/p\"]\npushed = [\"T\", \"T\", \"a-b\"]\n",
			"\"T\" is named twice"},
	} {
		_, err := ParseConfig("gate.toml", []byte(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig: %v; want %q", err, tc.want)
		}
		if err != nil && strings.Contains(tc.body, "a-b") && !strings.Contains(err.Error(), "\"a-b\" is not a secret's name") {
			t.Errorf("a bad name is not reported: %v", err)
		}
	}
	cfg, err := ParseConfig("/gate.toml", []byte("[service]\nstate_dir = \"/s\"\ncontrol = \"/run/g/c.sock\"\n[listen]\ndns = [\"10.0.0.1\"]\nhttps = [\"10.0.0.1\"]\n[tenants.a]\nsources = [\"10.0.1.0/24\"]\npolicy = [\"/p\"]\npushed = [\"T\", \"A\"]\n"))
	if err != nil || cfg.Control != "/run/g/c.sock" || !slices.Equal(cfg.Tenants[0].Pushed, []string{"A", "T"}) {
		t.Errorf("ParseConfig: %+v, %v", cfg, err)
	}
}

// TestControlPermissions: the socket is its starter's alone, by its mode
// and again by the peer's credentials.
func TestControlPermissions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to connect as another user; CI runs it as root")
	}
	f := newControlFixture(t, `"TOKEN"`)
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{f.sock, 0o600}, {filepath.Dir(f.sock), 0o700}} {
		fi, err := os.Stat(p.path)
		if err != nil || fi.Mode().Perm() != p.mode {
			t.Errorf("%s: %v, %v; want mode %v", p.path, fi.Mode().Perm(), err, p.mode)
		}
	}
	// The directory is 0700, the socket 0600: uid 65534 cannot connect.
	if err := dialAs(65534, f.sock); !errors.Is(err, unix.EACCES) {
		t.Errorf("connecting as uid 65534: %v; want permission denied", err)
	}
	// With the modes opened, the peer check still refuses it: closed
	// without an answer.
	for _, d := range []string{filepath.Dir(f.dir), f.dir, filepath.Dir(f.sock)} {
		os.Chmod(d, 0o755)
	}
	os.Chmod(f.sock, 0o666)
	if err := dialAs(65534, f.sock); err == nil || errors.Is(err, unix.EACCES) {
		t.Errorf("as uid 65534 with the modes opened: %v; want the connection closed unanswered", err)
	}
	// Root, the starter, is answered.
	if code, _, _ := f.call(t, "GET", "/v1/tenants", ""); code != 200 {
		t.Errorf("GET as the starter: %d", code)
	}
	// A stale socket of an earlier run is replaced; a file that is not
	// a socket is left alone and refused.
	f.svc.l.Control.Close()
	other := filepath.Join(f.dir, "notasocket")
	os.WriteFile(other, []byte("x"), 0o600)
	if _, err := listenControl(other); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("listenControl over a regular file: %v", err)
	}
}

// dialAs connects to sock and sends a request with uid as the effective
// uid, on a thread of its own that is thrown away after.
func dialAs(uid int, sock string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			errc <- e
			return
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
			errc <- err
			return
		}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
		unix.Write(fd, []byte("GET /v1/tenants HTTP/1.1\r\nHost: gate\r\n\r\n"))
		buf := make([]byte, 512)
		n, err := unix.Read(fd, buf)
		switch {
		case err != nil:
			errc <- err
		case n == 0:
			errc <- io.EOF
		default:
			errc <- nil // answered
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-time.After(10 * time.Second):
		return errors.New("no answer nor close within 10 s")
	}
}
