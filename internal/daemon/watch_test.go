package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/gate"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/state"
)

func TestSuggestAndRegistrable(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.7")
	for _, tt := range []struct {
		q            gate.Question
		suggest, dom string
	}{
		{gate.Question{Name: "api.example.com", Addr: ip, Port: 443}, "api.example.com", "example.com"},
		{gate.Question{Name: "example.com", Addr: ip, Port: 80}, "example.com", "example.com"},
		{gate.Question{Name: "git.example.co.uk", Addr: ip, Port: 22}, "git.example.co.uk:22", "example.co.uk"},
		{gate.Question{Name: "a.b.tracker.example.github.io", Addr: ip, Port: 443}, "a.b.tracker.example.github.io", "example.github.io"},
		{gate.Question{Name: "x.blockme.test", Addr: ip, Port: 443}, "x.blockme.test", "blockme.test"},
		{gate.Question{Name: "localhostish", Addr: ip, Port: 443}, "localhostish", "localhostish"},
		{gate.Question{Addr: ip, Port: 5432}, "203.0.113.7:5432", ""},
	} {
		if got := suggestEntry(tt.q); got != tt.suggest {
			t.Errorf("suggestEntry(%+v) = %q, want %q", tt.q, got, tt.suggest)
		}
		if tt.q.Name == "" {
			continue
		}
		if got := registrable(tt.q.Name); got != tt.dom {
			t.Errorf("registrable(%q) = %q, want %q", tt.q.Name, got, tt.dom)
		}
	}
}

// answerDaemon is a daemon with just what answering a hold touches: a
// record whose workspace and user config are temporary directories, the
// holds, and a gate whose policy an answer recompiles.
func answerDaemon(t *testing.T) (d *daemon, ws, userCfg string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "api")
	ws, userCfg = t.TempDir(), filepath.Join(t.TempDir(), "config.toml")
	if err := state.Create(dir, &state.Record{Name: "api", Workspace: ws}); err != nil {
		t.Fatal(err)
	}
	o := Options{Dir: dir, Log: slog.New(slog.DiscardHandler), Network: NetworkOptions{UserConfig: userCfg}}
	d = &daemon{o: o, log: o.Log, stopCh: make(chan struct{})}
	d.net = &network{o: o.Network, dir: dir, record: d.record, settled: make(chan struct{}), holds: gate.NewHolds(gate.HoldsOptions{Timeout: time.Minute})}
	d.net.gate = gate.New(gate.Options{Holds: d.net.holds})
	if err := d.net.recompile(); err != nil {
		t.Fatal(err)
	}
	_, detach := d.net.holds.Watch(nil)
	t.Cleanup(detach)
	return d, ws, userCfg
}

// hold asks q and waits (bounded) until it is pending; the outcome arrives
// on the channel once answered.
func holdFor(t *testing.T, d *daemon, q gate.Question) (string, <-chan gate.Outcome) {
	t.Helper()
	out := make(chan gate.Outcome, 1)
	go func() { out <- d.net.holds.Ask(context.Background(), q) }()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		for _, p := range d.net.holds.Pending() {
			if p.Q.Key() == q.Key() {
				return p.ID, out
			}
		}
	}
	t.Fatalf("%s was never held", q.Key())
	return "", nil
}

func postAnswer(d *daemon, id, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/holds/"+id, strings.NewReader(body))
	r.SetPathValue("id", id)
	w := httptest.NewRecorder()
	d.handleAnswer(w, r)
	return w
}

// TestAnswerWritesNoFile: the daemon applies an "always" or "block" answer
// as a runtime rule and never writes a config file, which is the
// watcher's to write. The file the watcher names holds bytes no config
// parser accepts: a daemon that opened it to add the rule would fail.
func TestAnswerWritesNoFile(t *testing.T) {
	ip := netip.MustParseAddr("203.0.113.7")
	for _, tt := range []struct {
		name, answer, scope string
		q                   gate.Question
		list, rule          string
		entries             []string
	}{
		{"always, project", control.AnswerAlways, control.ScopeProject, gate.Question{Name: "api.example.com", Addr: ip, Port: 443},
			"allow", "api.example.com", []string{"api.example.com"}},
		{"always, user", control.AnswerAlways, control.ScopeUser, gate.Question{Name: "git.example.com", Addr: ip, Port: 22},
			"allow", "git.example.com:22", []string{"git.example.com:22"}},
		{"block, project", control.AnswerBlock, "", gate.Question{Name: "x.tracker.example", Addr: ip, Port: 443},
			"block", "tracker.example, *.tracker.example", []string{"tracker.example", "*.tracker.example"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, ws, userCfg := answerDaemon(t)
			written := filepath.Join(t.TempDir(), "moat.toml")
			junk := []byte("[network\nthis is not toml\n")
			if err := os.WriteFile(written, junk, 0o644); err != nil {
				t.Fatal(err)
			}
			id, out := holdFor(t, d, tt.q)

			// Without "written": refused, and the question stays open.
			w := postAnswer(d, id, fmt.Sprintf(`{"schema":1,"answer":%q,"scope":%q}`, tt.answer, tt.scope))
			if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `\"written\"`) {
				t.Fatalf("answer without written: %d %s, want 400 naming \"written\"", w.Code, w.Body)
			}
			if p := d.net.holds.Pending(); len(p) != 1 || p[0].ID != id {
				t.Fatalf("after a refused answer the hold is gone: %+v", p)
			}

			w = postAnswer(d, id, fmt.Sprintf(`{"schema":1,"answer":%q,"scope":%q,"written":%q}`, tt.answer, tt.scope, written))
			if w.Code != http.StatusOK {
				t.Fatalf("answer: %d %s", w.Code, w.Body)
			}
			var res control.AnswerResult
			if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
				t.Fatal(err)
			}
			if res.Rule != tt.rule || res.File != written {
				t.Errorf("result %+v, want rule %q, file %q", res, tt.rule, written)
			}
			if o := <-out; o.Allow != (tt.answer == control.AnswerAlways) || o.Answer != tt.answer {
				t.Errorf("held connection: %+v", o)
			}

			for _, f := range []string{filepath.Join(ws, "moat.toml"), userCfg} {
				if _, err := os.Stat(f); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the daemon wrote %s (%v)", f, err)
				}
			}
			if b, _ := os.ReadFile(written); !bytes.Equal(b, junk) {
				t.Errorf("the daemon changed the watcher's file:\n%s", b)
			}
			rec, err := state.Load(d.o.Dir)
			if err != nil {
				t.Fatal(err)
			}
			got := rec.Rules.Allow
			if tt.list == "block" {
				got = rec.Rules.Block
			}
			if !slices.Equal(got, tt.entries) {
				t.Errorf("runtime %s rules %q, want %q", tt.list, got, tt.entries)
			}
			var want policy.Action = policy.Allow
			if tt.list == "block" {
				want = policy.Block
			}
			if dec := d.net.gate.Policy().Name(tt.q.Name, tt.q.Port); dec.Rule == nil || dec.Rule.Action != want {
				t.Errorf("live decision for %s: %+v, want a rule that says %v", tt.q.Key(), dec, want)
			}
		})
	}
}

// TestAnswerWrittenChecked: "written" names an absolute path, and
// answers that write nothing need none.
func TestAnswerWrittenChecked(t *testing.T) {
	for _, tt := range []struct {
		a    control.Answer
		want bool
	}{
		{control.Answer{Answer: control.AnswerAlways, Scope: control.ScopeProject, Written: "/w/moat.toml"}, true},
		{control.Answer{Answer: control.AnswerAlways, Scope: control.ScopeProject}, false},
		{control.Answer{Answer: control.AnswerBlock, Scope: control.ScopeUser}, false},
		{control.Answer{Answer: control.AnswerAlways, Scope: control.ScopeProject, Written: "moat.toml"}, false},
		{control.Answer{Answer: control.AnswerRun}, true},
		{control.Answer{Answer: control.AnswerOnce}, true},
	} {
		if err := checkWritten(tt.a); (err == nil) != tt.want {
			t.Errorf("checkWritten(%+v) = %v, want ok %v", tt.a, err, tt.want)
		}
	}
}
