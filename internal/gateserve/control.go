package gateserve

// The control socket ([service] control): what a container's environment
// cannot carry. A Docker gate's env: secret would sit in `docker inspect`;
// instead the one who starts the service reads the value on its own host
// and pushes it here, and the service keeps it in memory only.
//
// Wire format (frozen: fields and paths are only added). HTTP/1.1 on a
// unix socket; bodies are JSON objects with "schema": 1. Only a process
// of the user who started the service (root) may connect: the socket is
// mode 0600 in a directory the service makes 0700, and each connection's
// peer credentials (SO_PEERCRED) are checked again; any other is closed
// unanswered and logged.
//
//	PUT  /v1/tenants/NAME/secrets  {"schema":1,"values":{"SECRET":"value",...}}
//	     200 {"schema":1,"tenant":NAME,"pending":[SECRET,...]}
//	     Each SECRET must be in tenants.NAME.pushed. The values join those
//	     pushed before (a value pushed again replaces the old one) and the
//	     service reloads as on SIGHUP, with them; all or nothing: a value
//	     that is refused (too short, a line break) or a reload that fails
//	     keeps the previous values and rules. pending is what is still
//	     missing.
//	POST /v1/reload                200 {"schema":1}: a reload, as SIGHUP.
//	GET  /v1/tenants               200 {"schema":1,"tenants":[{"name":N,
//	                               "pushed":[...],"pending":[...]}]}
//	errors                         4xx or 5xx {"schema":1,"error":"..."}:
//	                               400 a bad request, 404 no such tenant,
//	                               409 refused (the reload's or the
//	                               value's reason), 405 a wrong method.
//
// Until every pushed secret of a tenant has a value, requests to a host
// any missing one is bound to are intercepted and refused (rejected_by
// "secrets"): never sent with the placeholder, nor with another value.
// Values are never written, logged, audited or answered; error messages
// name secrets, never values.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/secret"
)

// ControlSchema is the control API's version.
const ControlSchema = 1

// maxControlBody bounds a request: a value is at most 64 KiB.
const maxControlBody = 1 << 20

// pushedFrom stands for a pushed secret's source in the set the gate
// resolves: read through the remote reader (pushedReader), never run.
const pushedFrom = "command:(pushed over the gate service's control socket)"

// ErrNotPushed is matched by a push of a secret that is not among the
// tenant's pushed names.
var ErrNotPushed = errors.New("not a pushed secret of the tenant")

// ErrNoTenant is matched by a push to a tenant the service does not have.
var ErrNoTenant = errors.New("no such tenant")

// listenControl binds the control socket: its directory made 0700 if it
// is missing, a stale socket of an earlier run removed, the socket 0600.
func listenControl(path string) (*controlListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("making the control socket's directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("service.control %s exists and is not a socket; remove it or name another path", path)
		}
		os.Remove(path)
	}
	// The socket is made with the umask's mode: closed to others from
	// the start, not chmod-ed after a window.
	old := unix.Umask(0o177)
	l, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on the control socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return &controlListener{Listener: l, uid: os.Getuid()}, nil
}

// controlListener accepts only connections from uid (the user who
// started the service), by the peer's credentials.
type controlListener struct {
	net.Listener
	uid int
	log *slog.Logger
}

func (l *controlListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && uid == l.uid {
			return c, nil
		}
		c.Close()
		if l.log != nil {
			l.log.Warn("gate service: refused a control connection from another user (fail closed)", "peer_uid", uid, "err", err)
		}
	}
}

// peerUID is the uid of the process at the other end of a unix socket.
func peerUID(c net.Conn) (int, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return -1, errors.New("not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) { cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return -1, err
	}
	if serr != nil {
		return -1, serr
	}
	return int(cred.Uid), nil
}

// serveControl answers the control API on l until ctx ends.
func (s *Service) serveControl(ctx context.Context, l *controlListener) {
	l.log = s.log
	srv := &http.Server{Handler: s.controlHandler(), ReadHeaderTimeout: 5 * time.Second,
		// Its errors are about connections (a client gone), never a body.
		ErrorLog: log.New(io.Discard, "", 0)}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	srv.Serve(l)
}

func (s *Service) controlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/tenants/{tenant}/secrets", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Schema int               `json:"schema"`
			Values map[string]string `json:"values"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxControlBody))
		dec.DisallowUnknownFields()
		// The decoder's error may quote the body, which holds values:
		// not repeated.
		if err := dec.Decode(&req); err != nil {
			controlError(w, http.StatusBadRequest, `the body is not {"schema":1,"values":{"NAME":"value"}} (at most 1 MiB)`)
			return
		}
		if req.Schema != ControlSchema {
			controlError(w, http.StatusBadRequest, fmt.Sprintf("schema %d: this service speaks schema %d", req.Schema, ControlSchema))
			return
		}
		if len(req.Values) == 0 {
			controlError(w, http.StatusBadRequest, "values is empty: give at least one secret's value")
			return
		}
		tenant := r.PathValue("tenant")
		pending, err := s.Push(tenant, req.Values)
		switch {
		case errors.Is(err, ErrNoTenant):
			controlError(w, http.StatusNotFound, err.Error())
		case errors.Is(err, ErrNotPushed):
			controlError(w, http.StatusBadRequest, err.Error())
		case err != nil:
			controlError(w, http.StatusConflict, err.Error())
		default:
			s.log.Info("gate service: secret values pushed over the control socket", "tenant", tenant, "secrets", slices.Sorted(maps.Keys(req.Values)), "pending", pending)
			controlReply(w, map[string]any{"schema": ControlSchema, "tenant": tenant, "pending": nonNil(pending)})
		}
	})
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Reload(); err != nil {
			s.log.Error("gate service: reload refused; the previous configuration stays in force", "err", err, "from", "control socket")
			controlError(w, http.StatusConflict, err.Error())
			return
		}
		s.log.Info("gate service reloaded", "config", s.cfg.Path, "from", "control socket")
		controlReply(w, map[string]any{"schema": ControlSchema})
	})
	mux.HandleFunc("GET /v1/tenants", func(w http.ResponseWriter, r *http.Request) {
		type tenantStatus struct {
			Name    string   `json:"name"`
			Pushed  []string `json:"pushed"`
			Pending []string `json:"pending"`
		}
		var out []tenantStatus
		tt := s.tenants.Load()
		for _, name := range slices.Sorted(maps.Keys(tt.byName)) {
			t := tt.byName[name]
			out = append(out, tenantStatus{name, nonNil(t.cfg.Pushed), nonNil(t.creds.pending.Load().Names())})
		}
		controlReply(w, map[string]any{"schema": ControlSchema, "tenants": nonNil(out)})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if m := controlMethod(r.URL.Path); m != "" {
			w.Header().Set("Allow", m)
			controlError(w, http.StatusMethodNotAllowed, r.URL.Path+" takes "+m)
			return
		}
		controlError(w, http.StatusNotFound, r.Method+" "+r.URL.Path+" is not in the control API; see internal/gateserve/control.go")
	})
	return mux
}

// controlMethod is the method path takes in the control API, or "" for
// a path that is not in it.
func controlMethod(path string) string {
	switch parts := strings.Split(path, "/"); {
	case path == "/v1/reload":
		return "POST"
	case path == "/v1/tenants":
		return "GET"
	case len(parts) == 5 && parts[1] == "v1" && parts[2] == "tenants" && parts[3] != "" && parts[4] == "secrets":
		return "PUT"
	}
	return ""
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func controlReply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func controlError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"schema": ControlSchema, "error": msg})
}

// Push adds values for tenant's pushed secrets and reloads with them,
// all or nothing. It returns the tenant's pushed secrets still without a
// value.
func (s *Service) Push(tenant string, values map[string]string) ([]string, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	t := s.tenants.Load().byName[tenant]
	if t == nil {
		return nil, fmt.Errorf("tenant %q: %w; the service has %s", tenant, ErrNoTenant, strings.Join(slices.Sorted(maps.Keys(s.tenants.Load().byName)), ", "))
	}
	for _, name := range slices.Sorted(maps.Keys(values)) {
		if !slices.Contains(t.cfg.Pushed, name) {
			return nil, fmt.Errorf("secret %s: %w %s (tenants.%s.pushed is %q); add it there", name, ErrNotPushed, tenant, tenant, t.cfg.Pushed)
		}
	}
	next := maps.Clone(s.pushed)
	if next == nil {
		next = map[string]map[string][]byte{}
	}
	vals := maps.Clone(next[tenant])
	if vals == nil {
		vals = map[string][]byte{}
	}
	for k, v := range values {
		vals[k] = []byte(v)
	}
	next[tenant] = vals
	if err := s.reload(next); err != nil {
		return nil, err
	}
	s.pushed = next
	return s.tenants.Load().byName[tenant].creds.pending.Load().Names(), nil
}

// resolveTenant reads a tenant's secrets: those of tc.Pushed from values
// (the pushes so far), the others from their sources as resolveSecrets
// does. A pushed secret without a value yet is in pending, not in set:
// its placeholder is made and kept all the same, so that clients started
// before its value arrives hold the one that will work.
func resolveTenant(tc Tenant, r *rules, placeholders map[string]string, values map[string][]byte) (set, pending *secret.Set, err error) {
	if len(tc.Pushed) == 0 {
		set, err := resolveSecrets(r, placeholders)
		return set, nil, err
	}
	ready, waiting := map[string]config.Secret{}, map[string]config.Secret{}
	for name, c := range r.secrets {
		if !slices.Contains(tc.Pushed, name) {
			ready[name] = c
		}
	}
	for _, name := range tc.Pushed {
		c, ok := r.secrets[name]
		if !ok {
			return nil, nil, fmt.Errorf("tenant %s: tenants.%s.pushed names %s, which no [secrets.%s] of its policy files defines; add it there, or remove it from pushed", tc.Name, tc.Name, name, name)
		}
		c.From = pushedFrom
		if _, ok := values[name]; ok {
			ready[name] = c
		} else {
			waiting[name] = c
		}
	}
	// A waiting secret's set is only asked which hosts are bound and
	// what the placeholders are; its value is random, never sent (the
	// requests it is bound to are refused) and never known to anyone.
	stand, err := randomValue()
	if err != nil {
		return nil, nil, err
	}
	read := func(ctx context.Context, name string) ([]byte, error) {
		if slices.Contains(tc.Pushed, name) {
			if v, ok := values[name]; ok {
				return bytes.Clone(v), nil
			}
			return []byte(stand), nil
		}
		return secret.ReadOne(ctx, name, r.secrets[name])
	}
	ctx, cancel := context.WithTimeout(context.Background(), secretsTimeout)
	defer cancel()
	if set, err = secret.ResolveRemote(ctx, ready, os.LookupEnv, placeholders, read); err != nil {
		return nil, nil, err
	}
	if len(waiting) > 0 {
		if pending, err = secret.ResolveRemote(ctx, waiting, os.LookupEnv, placeholders, read); err != nil {
			return nil, nil, err
		}
	}
	return set, pending, nil
}

func randomValue() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// store publishes a tenant's secrets. A secret leaving pending has its
// value in set first; one entering it is refused first: in between a
// request finds it in both, and is refused.
func (c *credentials) store(set, pending *secret.Set) {
	if pending != nil {
		c.pending.Store(pending)
		c.cur.Store(set)
		return
	}
	c.cur.Store(set)
	c.pending.Store(nil)
}

// placeholders are every secret's placeholder, pending ones included.
func (c *credentials) placeholders() map[string]string {
	out := c.cur.Load().Placeholders()
	maps.Copy(out, c.pending.Load().Placeholders())
	return out
}

// pendingError refuses a request to a host a pushed secret without a
// value is bound to.
func pendingError(p *secret.Set) error {
	return fmt.Errorf("secrets %s are pushed to the gate over its control socket and have not arrived; requests to their hosts are refused until they do (fail closed)", strings.Join(p.Names(), ", "))
}
