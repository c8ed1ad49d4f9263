package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/net/publicsuffix"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/gate"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/session"
	"moat.dev/moat/internal/state"
)

// The interactive gate's daemon side: the /v1/watch event stream that
// attaches a watcher, and the answers that release holds. The gate holds
// connections (gate.Holds); here answers become runtime rules. The config
// files an "always" or "block" answer names are written by the watcher,
// never here (see internal/control's watch.go).

// HoldTimeoutEnv overrides how long a hold waits for an answer (a Go
// duration). A knob for tests, which cannot wait 30 s.
const HoldTimeoutEnv = "MOAT_HOLD_TIMEOUT"

// holdTimeout reads HoldTimeoutEnv; zero means the default.
func holdTimeout() time.Duration {
	d, err := time.ParseDuration(os.Getenv(HoldTimeoutEnv))
	if err != nil || d <= 0 {
		return 0
	}
	return d
}

// watchBuffer is how many events a slow watcher may fall behind before
// its stream is cut (it reconnects and is sent the pending holds again).
const watchBuffer = 512

// pingEvery keeps idle streams alive through proxies and shows a front
// end that the daemon is still there.
const pingEvery = 10 * time.Second

// watchHub fans the gate's audit records out to the attached watchers.
type watchHub struct {
	mu   sync.Mutex
	subs map[*watchSub]bool
}

type watchSub struct {
	ch   chan control.Event
	cut  chan struct{} // closed when the watcher fell too far behind
	once sync.Once
}

func (s *watchSub) send(ev control.Event) {
	select {
	case s.ch <- ev:
	default:
		s.once.Do(func() { close(s.cut) })
	}
}

func (h *watchHub) add(s *watchSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[*watchSub]bool{}
	}
	h.subs[s] = true
}

func (h *watchHub) remove(s *watchSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
}

func (h *watchHub) publish(ev control.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.send(ev)
	}
}

// tap is the audit log's tap: every decision goes to every watcher.
func (n *network) tap(r audit.Record) {
	if r.Phase == audit.PhaseEnd {
		// Watchers see decisions; a connection's end is not one.
		return
	}
	n.hub.publish(control.Event{Schema: control.Schema, Type: control.EventDecision,
		Sandbox: filepath.Base(n.dir), Time: r.Time, Record: &r})
}

func (d *daemon) name() string { return filepath.Base(d.o.Dir) }

// holdOf converts a gate hold to its wire form.
func (d *daemon) holdOf(p gate.Pending) *control.Hold {
	h := &control.Hold{ID: p.ID, Sandbox: d.name(), Name: p.Q.Name, Addr: p.Q.Addr.String(), Port: p.Q.Port,
		Proto: "tcp", Process: p.Process, Since: p.Since, Expires: p.Expires, Count: p.Count, Suggest: suggestEntry(p.Q)}
	if p.Q.Kind != "" {
		h.Kind, h.Proto, h.Addr, h.Suggest = p.Q.Kind, "ssh-agent", "", ""
		if p.Q.Kind == gate.KindMCPTool {
			h.Proto = "mcp"
		}
		return h
	}
	if p.Q.Name != "" {
		h.Domain = registrable(p.Q.Name)
	}
	return h
}

// suggestEntry is the rule an "always" or "run" answer adds: the name
// alone for web ports (80 and 443 go together), name:port otherwise; the
// address and port when there is no name.
func suggestEntry(q gate.Question) string {
	return policy.AllowEntry(q.Name, q.Addr, q.Port)
}

// registrable is the domain a "block" answer blocks: the name's
// registrable domain by the public suffix list (api.tracker.example.co.uk
// → example.co.uk), or the name itself when it has none (a bare suffix,
// a single label).
func registrable(name string) string {
	if d, err := publicsuffix.EffectiveTLDPlusOne(name); err == nil {
		return d
	}
	return name
}

// handleWatch is GET /v1/watch: the stream that makes the caller a
// watcher for as long as it stays open.
func (d *daemon) handleWatch(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, control.ErrorBody{Schema: control.Schema, Error: "streaming unsupported"})
		return
	}
	sub := &watchSub{ch: make(chan control.Event, watchBuffer), cut: make(chan struct{})}
	d.net.hub.add(sub)
	defer d.net.hub.remove(sub)
	holds := d.net.holds
	pending, detach := holds.Watch(func(e gate.HoldEvent) {
		ev := control.Event{Schema: control.Schema, Type: string(e.Kind), Sandbox: d.name(), Time: time.Now().UTC(), Hold: d.holdOf(e.Pending)}
		if e.Kind == gate.HoldResolved {
			ev.Answer, ev.By = e.Outcome.Answer, string(e.Outcome.By)
		}
		sub.send(ev)
	})
	defer detach()
	d.log.Info("watcher attached", "watchers", holds.Watchers())
	defer func() { d.log.Info("watcher left", "watchers", holds.Watchers()) }()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	write := func(ev control.Event) bool {
		if ev.Time.IsZero() {
			ev.Time = time.Now().UTC()
		}
		if err := enc.Encode(ev); err != nil {
			return false
		}
		fl.Flush()
		return true
	}
	if !write(control.Event{Schema: control.Schema, Type: control.EventHello, Sandbox: d.name(), Timeout: holds.Timeout()}) {
		return
	}
	for _, p := range pending {
		if !write(control.Event{Schema: control.Schema, Type: control.EventHold, Sandbox: d.name(), Hold: d.holdOf(p)}) {
			return
		}
	}
	tick := time.NewTicker(pingEvery)
	defer tick.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if !write(ev) {
				return
			}
			tick.Reset(pingEvery)
		case <-tick.C:
			if !write(control.Event{Schema: control.Schema, Type: control.EventPing, Sandbox: d.name()}) {
				return
			}
		case <-sub.cut:
			return
		case <-r.Context().Done():
			return
		case <-d.stopCh:
			return
		}
	}
}

// errAnswer is a bad answer: the caller's mistake, 400.
type errAnswer struct{ msg string }

func (e errAnswer) Error() string { return e.msg }

// handleAnswer is POST /v1/holds/{id}.
func (d *daemon) handleAnswer(w http.ResponseWriter, r *http.Request) {
	var a control.Answer
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&a); err != nil {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: "reading the answer: " + err.Error()})
		return
	}
	switch a.Answer {
	case control.AnswerOnce, control.AnswerRun, control.AnswerAlways, control.AnswerHour, control.AnswerDeny, control.AnswerBlock:
	default:
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema,
			Error: fmt.Sprintf("unknown answer %q: use once, run, always, hour, deny or block", a.Answer)})
		return
	}
	if a.Scope == "" {
		a.Scope = control.ScopeProject
	}
	if a.Scope != control.ScopeProject && a.Scope != control.ScopeUser {
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema,
			Error: fmt.Sprintf("unknown scope %q: use project or user", a.Scope)})
		return
	}
	if err := checkWritten(a); err != nil {
		// Before Take: the hold stays pending, to be answered again.
		writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
		return
	}
	id := r.PathValue("id")
	p, ok := d.net.holds.Take(id)
	if !ok {
		writeJSON(w, http.StatusNotFound, control.ErrorBody{Schema: control.Schema,
			Error: "hold " + id + " is no longer pending (answered elsewhere, or timed out)"})
		return
	}
	res, err := d.applyAnswer(p, a)
	out := gate.Outcome{Answer: a.Answer, By: gate.ByWatcher}
	out.Allow = err == nil && a.Answer != control.AnswerDeny && a.Answer != control.AnswerBlock
	// The rule is in force before the held connections go on, so they
	// and the ones after them are decided alike.
	d.net.holds.Finish(id, out)
	if err != nil {
		// Fail closed: the held connections were refused.
		d.log.Warn("applying an answer", "hold", id, "answer", a.Answer, "err", err)
		code := http.StatusInternalServerError
		var bad errAnswer
		if errors.As(err, &bad) {
			code = http.StatusBadRequest
		}
		writeJSON(w, code, control.ErrorBody{Schema: control.Schema, Error: err.Error() + " (the held connections were refused)"})
		return
	}
	d.log.Info("hold answered", "hold", id, "dest", p.Q.Key(), "answer", a.Answer, "rule", res.Rule, "written_by_watcher", res.File)
	res.Schema = control.Schema
	writeJSON(w, http.StatusOK, res)
}

// checkWritten refuses an "always" or "block" answer whose caller did not
// write the rule into a file. Such a request comes from a front end that
// expects the daemon to write it, which it no longer does (it must not be
// able to change a person's configuration); applying the rule at runtime
// only would let that front end tell its user a file was written when
// none was. Refused before the hold is taken, the question stays open.
func checkWritten(a control.Answer) error {
	if a.Answer != control.AnswerAlways && a.Answer != control.AnswerBlock {
		return nil
	}
	if a.Written == "" {
		file := "the project's moat.toml"
		if a.Scope == control.ScopeUser {
			file = "the user's config.toml"
		}
		return errAnswer{fmt.Sprintf("%s answer without \"written\": the daemon no longer writes config files; "+
			"write the rule into %s yourself and send that path as \"written\" (moat network watch does both: "+
			"restart an older one), or answer run; the hold is still pending", a.Answer, file)}
	}
	if !filepath.IsAbs(a.Written) {
		return errAnswer{fmt.Sprintf("written %q: want the absolute path of the file the rule was written into", a.Written)}
	}
	return nil
}

// applyAnswer makes an answer's effects: a grant for this run, the
// runtime rule of an "always" or "block" answer whose caller wrote it
// into a file (kept in the record, so it holds at once and across
// down/up), or the hour-long opening.
func (d *daemon) applyAnswer(p gate.Pending, a control.Answer) (control.AnswerResult, error) {
	var res control.AnswerResult
	if p.Q.Kind == gate.KindSSHSign {
		switch a.Answer {
		case control.AnswerOnce, control.AnswerDeny:
			return res, nil
		case control.AnswerRun:
			d.signs.grant(p.Q.Name)
			return res, nil
		}
		return res, errAnswer{control.ErrSignAnswer.Error()}
	}
	if p.Q.Kind == gate.KindMCPTool {
		// A tool call: this call, yes or no. A lasting yes is a pattern
		// in the server's tools (docs/mcp.md).
		if a.Answer == control.AnswerOnce || a.Answer == control.AnswerDeny {
			return res, nil
		}
		return res, errAnswer{fmt.Sprintf("a tool call is answered once or deny, not %q; to allow the tool for good, add it to the server's tools and run moat up --reconfigure", a.Answer)}
	}
	entry := suggestEntry(p.Q)
	switch a.Answer {
	case control.AnswerOnce, control.AnswerDeny:
		return res, nil
	case control.AnswerHour:
		d.net.holds.OpenUntil(time.Now().Add(time.Hour))
		return res, nil
	case control.AnswerRun:
		res.Rule = entry
		return res, d.net.grant(entry)
	}
	// The same derivation the watcher used for the file it wrote.
	list, entries, err := d.holdOf(p).Rules(a.Answer)
	if err != nil {
		return res, errAnswer{err.Error()}
	}
	res.Rule, res.File = strings.Join(entries, ", "), a.Written
	err = d.updateRecord(func(rec *state.Record) error {
		return ApplyRuleChange(rec, list, entries)
	})
	if err != nil {
		return res, err
	}
	return res, d.net.recompile()
}

// grant adds an allow for the rest of this run: a runtime rule that is
// not written to the record, so `moat down` forgets it.
func (n *network) grant(entry string) error {
	if _, err := policy.ParseEntry(entry); err != nil {
		return err
	}
	n.mu.Lock()
	n.grants = append(n.grants, entry)
	n.mu.Unlock()
	return n.recompile()
}

// grantRules is the run's grants as runtime-layer rules.
func (n *network) grantRules() []policy.Rule {
	rs, err := policy.FromEntries(n.grants, policy.Allow, policy.LayerRuntime, "granted at the gate (this run)")
	if err != nil {
		return nil // grant checked every entry
	}
	return rs
}

// annotateHolds finds, for each new hold, the guest process whose
// connection is held, and adds it to the hold: the person answering sees
// who asks. It asks the guest (as root, to see every process) with moat's
// own binary; a lookup that fails or is slow leaves the hold as it is.
func (d *daemon) annotateHolds() {
	d.net.holds.Subscribe(func(e gate.HoldEvent) {
		if e.Kind != gate.HoldNew || !e.Pending.Q.Src.IsValid() || d.proxy == nil {
			return
		}
		p := e.Pending
		d.tasks.Go("finding a held connection's process", func() {
			ctx, cancel := context.WithTimeout(d.ctx, 3*time.Second)
			defer cancel()
			var out strings.Builder
			code, err := d.proxy.Exec(ctx, session.Options{
				Argv:   []string{"sudo", "-n", guestspec.Binary, "__sockowner", strconv.Itoa(int(p.Q.Src.Port()))},
				Stdout: &out,
			})
			if err != nil || code != 0 {
				d.log.Debug("finding a held connection's process", "hold", p.ID, "exit", code, "err", err)
				return
			}
			d.net.holds.Annotate(p.ID, strings.TrimSpace(out.String()))
		})
	})
}

// signGrants are the keys a watcher allowed to sign for the rest of this
// run ("run" to an ssh-agent signature question).
type signGrants struct {
	mu   sync.Mutex
	keys map[string]bool
}

func (g *signGrants) grant(label string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.keys == nil {
		g.keys = map[string]bool{}
	}
	g.keys[label] = true
}

func (g *signGrants) granted(label string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.keys[label]
}

// confirmSign asks the interactive gate's watcher whether the guest may
// sign with k ([ssh_agent] confirm = true). With no watcher attached, or
// no answer in time, the signature is refused.
func (d *daemon) confirmSign(k *agent.Key) bool {
	label := k.Comment
	if pub, err := ssh.ParsePublicKey(k.Blob); err == nil {
		label = strings.TrimSpace(k.Comment + " " + ssh.FingerprintSHA256(pub))
	}
	label = "sign with " + label
	if d.signs.granted(label) {
		return true
	}
	out := d.net.holds.Ask(context.Background(), gate.Question{Kind: gate.KindSSHSign, Name: label})
	if !out.Allow {
		d.log.Info("ssh-agent signature refused", "key", label, "by", out.By)
	}
	return out.Allow
}
