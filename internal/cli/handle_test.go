package cli

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
)

// daemonSide is what a test puts where a sandbox's daemon would be.
type daemonSide struct {
	lock   bool // a process holds the daemon lock, as a live daemon does
	socket string
	status int // what a serving socket answers every request with
}

const (
	noSocket  = ""
	stale     = "stale"   // the socket file is there, nobody listens on it
	listening = "serving" // a server answers on it
)

// fakeSandbox makes a sandbox's state directory with a record and, as d
// says, a daemon lock held and a control socket. It returns the handle
// and a count of the requests the socket's server answered.
func fakeSandbox(t *testing.T, d daemonSide) (sandbox, *atomic.Int32) {
	t.Helper()
	// Not t.TempDir: a unix socket's path must fit in 108 bytes, and a
	// subtest's name makes t.TempDir's long.
	dir, err := os.MkdirTemp("", "moat-handle-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := state.Update(dir, func(r *state.Record) error { r.Name = "h"; return nil }); err != nil {
		t.Fatal(err)
	}
	if d.lock {
		release, ok, err := state.TryLock(state.DaemonLock(dir))
		if err != nil || !ok {
			t.Fatalf("taking the daemon lock: ok %v, %v", ok, err)
		}
		t.Cleanup(release)
	}
	hits := new(atomic.Int32)
	s := sandboxAt(dir)
	switch d.socket {
	case stale:
		l, err := net.Listen("unix", s.socket())
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close()
	case listening:
		l, err := net.Listen("unix", s.socket())
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			w.WriteHeader(d.status)
			if d.status != http.StatusOK {
				json.NewEncoder(w).Encode(control.ErrorBody{Schema: control.Schema, Error: "refused by the test"})
				return
			}
			json.NewEncoder(w).Encode(control.Rules{Schema: control.Schema})
		})}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	if _, err := os.Stat(s.socket()); (err == nil) != (d.socket != noSocket) {
		t.Fatalf("the socket's stat says %v; want it there: %v", err, d.socket != noSocket)
	}
	return s, hits
}

// edited reports whether the record holds the test's edit.
func edited(t *testing.T, s sandbox) bool {
	t.Helper()
	r, err := state.Load(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(r.Presets, "edited")
}

// The situations a command meets, and the one sign that decides them: the
// daemon lock. The control socket says nothing by itself.
var daemonSides = []struct {
	name    string
	d       daemonSide
	alive   bool
	answers bool // the daemon answers the request
	code    int  // change's exit code: ExitOK, or the failing daemon's
}{
	{"no daemon", daemonSide{}, false, false, 0},
	{"stale socket", daemonSide{socket: stale}, false, false, 0},
	{"socket without lock", daemonSide{socket: listening, status: http.StatusOK}, false, false, 0},
	{"daemon answers", daemonSide{lock: true, socket: listening, status: http.StatusOK}, true, true, 0},
	{"daemon refuses", daemonSide{lock: true, socket: listening, status: http.StatusBadRequest}, true, false, ExitUsage},
	{"daemon fails", daemonSide{lock: true, socket: listening, status: http.StatusInternalServerError}, true, false, ExitError},
	{"lock without socket", daemonSide{lock: true}, true, false, ExitError},
}

// TestChange: a change goes to the daemon when one is alive, else into
// the record; a live daemon that fails is an error with the daemon's exit
// code, and the record is left as it is (the running gate would never see
// an edit made behind its back).
func TestChange(t *testing.T) {
	for _, tt := range daemonSides {
		t.Run(tt.name, func(t *testing.T) {
			s, hits := fakeSandbox(t, tt.d)
			if got := s.alive(); got != tt.alive {
				t.Fatalf("alive() = %v, want %v", got, tt.alive)
			}
			err := s.change(5*time.Second, func(ctx context.Context, c *control.Client) error {
				_, err := c.ChangeRules(ctx, control.RuleChange{Op: "allow", Entries: []string{"example.test"}})
				return err
			}, func(r *state.Record) error {
				r.Presets = append(r.Presets, "edited")
				return nil
			})
			got := ExitOK
			if err != nil {
				got = exitCode(err)
			}
			if got != tt.code {
				t.Errorf("change exits %d (%v), want %d", got, err, tt.code)
			}
			// A live daemon without its socket: say so, and where to look,
			// rather than the bare dial error.
			if tt.alive && tt.d.socket == noSocket && (err == nil || !strings.Contains(err.Error(), "runs but does not answer on") || !strings.Contains(err.Error(), "see: moat logs "+s.name)) {
				t.Errorf("change without a socket: %v; want the daemon named as not answering, and moat logs", err)
			}
			if got, want := edited(t, s), !tt.alive; got != want {
				t.Errorf("record edited: %v, want %v", got, want)
			}
			wantHits := int32(0)
			if tt.alive && tt.d.socket == listening {
				wantHits = 1
			}
			if got := hits.Load(); got != wantHits {
				t.Errorf("the socket answered %d requests, want %d", got, wantHits)
			}
		})
	}
}

// TestChangeNothingToDo: a nil side does nothing, and never falls back on
// the other one.
func TestChangeNothingToDo(t *testing.T) {
	edit := func(r *state.Record) error { r.Presets = append(r.Presets, "edited"); return nil }
	s, hits := fakeSandbox(t, daemonSide{lock: true, socket: listening, status: http.StatusOK})
	if err := s.change(5*time.Second, nil, edit); err != nil || edited(t, s) || hits.Load() != 0 {
		t.Errorf("alive, nil live: err %v, record edited %v, %d requests; want nothing done", err, edited(t, s), hits.Load())
	}
	s, _ = fakeSandbox(t, daemonSide{})
	called := false
	live := func(context.Context, *control.Client) error { called = true; return nil }
	if err := s.change(5*time.Second, live, nil); err != nil || edited(t, s) || called {
		t.Errorf("not alive, nil record: err %v, record edited %v, live called %v; want nothing done", err, edited(t, s), called)
	}
}

// TestAsk: a read is answered by the daemon only when one is alive and
// answers; otherwise the caller reads its second source, a failing daemon
// included.
func TestAsk(t *testing.T) {
	for _, tt := range daemonSides {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := fakeSandbox(t, tt.d)
			r, ok := ask(s, 5*time.Second, (*control.Client).Rules)
			if ok != tt.answers {
				t.Errorf("answered %v, want %v", ok, tt.answers)
			}
			if ok && r == nil {
				t.Error("answered with no rules")
			}
		})
	}
}
