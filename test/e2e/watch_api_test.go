package e2e

// End-to-end tests of the interactive gate through the real daemon and a
// real guest, with the test as the watcher over the documented control API (GET /v1/watch,
// POST /v1/holds/{id}). The TUI's own end-to-end test drives the same daemon through a pty.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/test/inet"
)

const (
	watchIP = "198.51.100.60"
	// holdTimeout is the sandbox's hold timeout (MOAT_HOLD_TIMEOUT): short, so the test of
	// an unanswered hold waits seconds, not the default 30.
	holdTimeout = 4 * time.Second
)

const watchToml = `[network]
use = ["none"]
allow = ["ok-watch.test"]
block = ["blocked-watch.test"]
`

// watcher is the test's watcher: it attaches over the control API and keeps every event.
type watcher struct {
	c      *control.Client
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	mu     sync.Mutex
	events []control.Event
}

func attachWatcher(t *testing.T, g *gateEnv) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{c: control.New(filepath.Join(g.state, "control.sock")), cancel: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- w.c.Watch(ctx, func(ev control.Event) error {
			w.mu.Lock()
			w.events = append(w.events, ev)
			w.mu.Unlock()
			return nil
		})
	}()
	w.waitFor(t, "hello", func(ev control.Event) bool { return ev.Type == control.EventHello })
	t.Cleanup(w.detach)
	return w
}

func (w *watcher) detach() {
	w.once.Do(func() {
		w.cancel()
		select {
		case <-w.done:
		case <-time.After(5 * time.Second):
		}
	})
}

// waitFor returns the first event that matches, waiting at most 30 s.
func (w *watcher) waitFor(t *testing.T, what string, match func(control.Event) bool) control.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		for _, ev := range w.events {
			if match(ev) {
				w.mu.Unlock()
				return ev
			}
		}
		w.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %s event within 30 s; events: %s", what, w.dump())
	return control.Event{}
}

func (w *watcher) count(match func(control.Event) bool) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, ev := range w.events {
		if match(ev) {
			n++
		}
	}
	return n
}

func (w *watcher) dump() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for _, ev := range w.events {
		if ev.Type == control.EventDecision || ev.Type == control.EventPing {
			continue
		}
		fmt.Fprintf(&b, "\n  %s", ev.Type)
		if ev.Hold != nil {
			fmt.Fprintf(&b, " %s %s:%d x%d", ev.Hold.ID, ev.Hold.Name, ev.Hold.Port, ev.Hold.Count)
		}
		if ev.Answer != "" || ev.By != "" {
			fmt.Fprintf(&b, " answer=%s by=%s", ev.Answer, ev.By)
		}
	}
	return b.String()
}

// heldFor waits for the hold of name:80 and returns it.
func (w *watcher) heldFor(t *testing.T, name string) *control.Hold {
	t.Helper()
	return w.waitFor(t, "hold of "+name, func(ev control.Event) bool {
		return ev.Type == control.EventHold && ev.Hold != nil && ev.Hold.Name == name && ev.Hold.Port == 80
	}).Hold
}

// guestRun is a `moat run` started in the background; wait returns its stdout.
type guestRun struct {
	cmd  *exec.Cmd
	out  strings.Builder
	err  strings.Builder
	done chan error
}

func startGuest(t *testing.T, g *gateEnv, script string) *guestRun {
	t.Helper()
	r := &guestRun{done: make(chan error, 1)}
	r.cmd = exec.Command(moatBin, "run", "--", "sh", "-c", script)
	r.cmd.Dir = g.dir
	r.cmd.Env = moatEnv(g.env)
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.err
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() { r.cmd.Process.Kill() })
	return r
}

func (r *guestRun) wait(t *testing.T) string {
	t.Helper()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("guest run: %v\nstdout: %s\nstderr: %s", err, r.out.String(), r.err.String())
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("guest run did not end within 90 s; stdout so far: %s", r.out.String())
	}
	return r.out.String()
}

// curlCode is a guest command printing the HTTP status of one plain-HTTP request.
func curlCode(name string) string {
	return fmt.Sprintf("curl -s -o /dev/null -w '%%{http_code}\\n' --max-time 60 http://%s/", name)
}

// answer answers a hold and fails the test if the daemon refuses the answer.
func answer(t *testing.T, w *watcher, h *control.Hold, a, scope string) *control.AnswerResult {
	t.Helper()
	return answerWritten(t, w, h, a, scope, "")
}

// answerWritten answers as the API asks a front end to: for always and block it first
// writes the hold's rule into file itself (the daemon writes no file), then names the file.
func answerWritten(t *testing.T, w *watcher, h *control.Hold, a, scope, file string) *control.AnswerResult {
	t.Helper()
	if file != "" {
		list, entries, err := h.Rules(a)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := config.AddRules(file, list, entries...); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := w.c.AnswerHold(ctx, h.ID, control.Answer{Answer: a, Scope: scope, Written: file})
	if err != nil {
		t.Fatalf("answering %s with %s: %v", h.ID, a, err)
	}
	return res
}

func TestInteractiveGate(t *testing.T) {
	n := inet.Start(t)
	g := newGateEnv(t, n, "watch-e2e", watchToml)
	g.env = append(g.env, "MOAT_HOLD_TIMEOUT="+holdTimeout.String())
	names := []string{"ok-watch.test", "blocked-watch.test", "nowatch.test", "once-watch.test", "deny-watch.test",
		"late-watch.test", "many-watch.test", "always-watch.test", "old-watch.test", "x.blockme-watch.test", "y.blockme-watch.test"}
	for _, name := range names {
		n.SetA(name, watchIP)
	}
	g.serve("watch:80", n.HTTP(t, watchIP, 80, inet.Echo()), false)
	// The "block" answer below writes into the user's config file, which every sandbox of
	// this test run reads: put it back as it was.
	userCfg := filepath.Join(moatHome, "config", "config.toml")
	before, readErr := os.ReadFile(userCfg)
	t.Cleanup(func() {
		if readErr != nil {
			os.Remove(userCfg)
			return
		}
		os.WriteFile(userCfg, before, 0o644)
	})
	g.up(t)
	t.Cleanup(func() { moat(t, g.dir, g.env, "destroy", "--yes", g.name) })

	t.Run("no_watcher_refused_at_once", func(t *testing.T) {
		start := time.Now()
		out := g.sh(t, curlCode("nowatch.test"))
		if strings.TrimSpace(out) != "403" {
			t.Fatalf("without a watcher: %q, want 403", out)
		}
		if took := time.Since(start); took > holdTimeout {
			t.Errorf("refusal took %v: it waited like a hold", took)
		}
	})

	w := attachWatcher(t, g)

	t.Run("allow_once", func(t *testing.T) {
		r := startGuest(t, g, curlCode("once-watch.test")+"; "+curlCode("ok-watch.test"))
		h := w.heldFor(t, "once-watch.test")
		if h.Suggest != "once-watch.test" || h.Count != 1 {
			t.Errorf("hold %+v", h)
		}
		// The daemon asks the guest which process holds the connection.
		ev := w.waitFor(t, "the held connection's process", func(ev control.Event) bool {
			return ev.Hold != nil && ev.Hold.ID == h.ID && ev.Hold.Process != ""
		})
		if !strings.Contains(ev.Hold.Process, "curl") || !strings.Contains(ev.Hold.Process, "once-watch.test") {
			t.Errorf("process of the hold: %q, want the curl command", ev.Hold.Process)
		}
		answer(t, w, h, control.AnswerOnce, "")
		if out := strings.Fields(r.wait(t)); len(out) != 2 || out[0] != "200" || out[1] != "200" {
			t.Fatalf("after allow once: %q, want 200 200", out)
		}
	})

	t.Run("deny", func(t *testing.T) {
		r := startGuest(t, g, curlCode("deny-watch.test"))
		answer(t, w, w.heldFor(t, "deny-watch.test"), control.AnswerDeny, "")
		if out := strings.TrimSpace(r.wait(t)); out != "403" {
			t.Fatalf("after deny: %q, want 403", out)
		}
	})

	t.Run("unanswered_times_out", func(t *testing.T) {
		start := time.Now()
		r := startGuest(t, g, curlCode("late-watch.test"))
		h := w.heldFor(t, "late-watch.test")
		if d := h.Expires.Sub(h.Since); d != holdTimeout {
			t.Errorf("hold expires after %v, want %v", d, holdTimeout)
		}
		if out := strings.TrimSpace(r.wait(t)); out != "403" {
			t.Fatalf("unanswered: %q, want 403", out)
		}
		if took := time.Since(start); took < holdTimeout {
			t.Errorf("refused after %v, before the %v timeout", took, holdTimeout)
		}
		ev := w.waitFor(t, "resolution of late-watch.test", func(ev control.Event) bool {
			return ev.Type == control.EventResolved && ev.Hold != nil && ev.Hold.ID == h.ID
		})
		if ev.By != "timeout" {
			t.Errorf("resolved by %q, want timeout", ev.By)
		}
	})

	t.Run("parallel_one_prompt", func(t *testing.T) {
		const k = 20
		r := startGuest(t, g, fmt.Sprintf("for i in $(seq %d); do %s & done; wait", k, curlCode("many-watch.test")))
		h := w.heldFor(t, "many-watch.test")
		// Wait until every connection joined the hold, then let them all through at once.
		w.waitFor(t, "all connections joined", func(ev control.Event) bool {
			return ev.Hold != nil && ev.Hold.ID == h.ID && ev.Hold.Count == k
		})
		answer(t, w, h, control.AnswerOnce, "")
		out := strings.Fields(r.wait(t))
		if len(out) != k || strings.Count(strings.Join(out, " "), "200") != k {
			t.Fatalf("%d parallel connections after one answer: %q", k, out)
		}
		prompts := w.count(func(ev control.Event) bool {
			return ev.Type == control.EventHold && ev.Hold != nil && ev.Hold.Name == "many-watch.test"
		})
		if prompts != 1 {
			t.Errorf("%d prompts for %d parallel connections to one name, want 1:%s", prompts, k, w.dump())
		}
	})

	t.Run("always_without_written_refused", func(t *testing.T) {
		// A front end from before the daemon stopped writing files: refused, nothing
		// written, and the question stays open to be answered again.
		proj := filepath.Join(g.dir, "moat.toml")
		before, _ := os.ReadFile(proj)
		r := startGuest(t, g, curlCode("old-watch.test"))
		h := w.heldFor(t, "old-watch.test")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := w.c.AnswerHold(ctx, h.ID, control.Answer{Answer: control.AnswerAlways, Scope: control.ScopeProject})
		var he *control.HTTPError
		if !errors.As(err, &he) || he.Status != 400 || !strings.Contains(he.Msg, `"written"`) {
			t.Fatalf("always without written: %v, want a 400 that names \"written\"", err)
		}
		if after, _ := os.ReadFile(proj); string(after) != string(before) {
			t.Errorf("moat.toml changed by an answer that wrote nothing:\n%s", after)
		}
		answer(t, w, h, control.AnswerOnce, "")
		if out := strings.TrimSpace(r.wait(t)); out != "200" {
			t.Fatalf("answered once after the refusal: %q, want 200", out)
		}
	})

	t.Run("block_domain", func(t *testing.T) {
		r := startGuest(t, g, curlCode("x.blockme-watch.test"))
		res := answerWritten(t, w, w.heldFor(t, "x.blockme-watch.test"), control.AnswerBlock, control.ScopeUser, userCfg)
		if out := strings.TrimSpace(r.wait(t)); out != "403" {
			t.Fatalf("after block: %q, want 403", out)
		}
		b, _ := os.ReadFile(userCfg)
		if res.File != userCfg || !strings.Contains(string(b), `"blockme-watch.test", "*.blockme-watch.test"`) {
			t.Fatalf("answer wrote %+v; %s holds:\n%s", res, userCfg, b)
		}
		// Another subdomain is blocked now, by rule: refused at once, never held.
		before := w.count(func(ev control.Event) bool { return ev.Type == control.EventHold })
		if out := strings.TrimSpace(g.sh(t, curlCode("y.blockme-watch.test"))); out != "403" {
			t.Fatalf("sibling of a blocked domain: %q, want 403", out)
		}
		if after := w.count(func(ev control.Event) bool { return ev.Type == control.EventHold }); after != before {
			t.Errorf("a blocked domain was held:%s", w.dump())
		}
	})

	t.Run("always_survives_down_up", func(t *testing.T) {
		r := startGuest(t, g, curlCode("always-watch.test"))
		proj := filepath.Join(g.dir, "moat.toml")
		res := answerWritten(t, w, w.heldFor(t, "always-watch.test"), control.AnswerAlways, control.ScopeProject, proj)
		if out := strings.TrimSpace(r.wait(t)); out != "200" {
			t.Fatalf("after always: %q, want 200", out)
		}
		b, _ := os.ReadFile(proj)
		if res.File != proj || !strings.Contains(string(b), `allow = ["ok-watch.test", "always-watch.test"]`) {
			t.Fatalf("answer wrote %+v; moat.toml holds:\n%s", res, b)
		}
		w.detach()
		if r := moat(t, g.dir, g.env, "down"); r.code != 0 {
			t.Fatalf("moat down: %d %s", r.code, r.stderr)
		}
		g.up(t)
		// No watcher now: only a rule can let it through.
		if out := strings.TrimSpace(g.sh(t, curlCode("always-watch.test"))); out != "200" {
			t.Fatalf("after down/up: %q, want 200", out)
		}
	})
}
