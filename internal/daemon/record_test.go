package daemon

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/state"
)

// The gate process may change what a running sandbox learns, and nothing
// that decides what the next start exposes.
func TestEditOfRefusesKeeperFields(t *testing.T) {
	old := &state.Record{Name: "api", Workspace: "/src/api", Image: "host", Config: json.RawMessage(`{"a":1}`), State: state.StateStarting}
	for name, change := range map[string]func(*state.Record){
		"workspace":  func(r *state.Record) { r.Workspace = "/" },
		"image":      func(r *state.Record) { r.Image = "evil" },
		"config":     func(r *state.Record) { r.Config = json.RawMessage(`{"shares":[{"path":"/"}]}`) },
		"guest uid":  func(r *state.Record) { r.GuestUID = 0; r.GuestGID = 7 },
		"gate uid":   func(r *state.Record) { r.GateUID = 5 },
		"daemon pid": func(r *state.Record) { r.DaemonPID = 1 },
	} {
		next, _ := cloneRecord(old)
		change(next)
		if _, _, err := editOf(old, next); err == nil {
			t.Errorf("%s: the edit was allowed", name)
		}
	}
	next, _ := cloneRecord(old)
	next.State, next.SetUp, next.Presets = state.StateRunning, true, []string{"claude"}
	next.Rules = &state.RuntimeRules{Allow: []string{"api.example.com"}}
	e, changed, err := editOf(old, next)
	if err != nil || !changed || e.State != state.StateRunning || !e.SetUp || !e.RulesSet || e.Rules.Allow[0] != "api.example.com" || e.Presets[0] != "claude" {
		t.Fatalf("allowed edit: %+v changed=%v err=%v", e, changed, err)
	}
	if _, changed, err := editOf(old, old); err != nil || changed {
		t.Fatalf("no change: changed=%v err=%v", changed, err)
	}
}

// The keeper checks an edit against the sandbox's configuration before it
// writes it.
func TestApplyEditChecks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "api")
	if err := state.Create(dir, &state.Record{Name: "api"}); err != nil {
		t.Fatal(err)
	}
	d := &daemon{o: Options{Dir: dir, Log: slog.New(slog.DiscardHandler),
		Secrets: map[string]config.Secret{"TOKEN": {From: "env:TOKEN"}}}}
	hook := strings.Repeat("x", maxHookText+1)
	bad := map[string]recordEdit{
		"state stopped":       {State: state.StateStopped},
		"long hook":           {Hook: &hook},
		"unknown preset":      {Presets: []string{"no-such-preset"}},
		"unknown secret":      {Placeholders: map[string]string{"OTHER": "moat-ph-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}},
		"malformed ph":        {Placeholders: map[string]string{"TOKEN": "short"}},
		"bad rule":            {Rules: &state.RuntimeRules{Allow: []string{"http://not a rule"}}, RulesSet: true},
		"forward no port":     {Forwards: &state.RuntimeForwards{Ports: []state.Forward{{Host: 0, Guest: 80}}}, ForwardsSet: true},
		"forward public bind": {Forwards: &state.RuntimeForwards{Ports: []state.Forward{{Host: 8080, Guest: 80, Address: "not-an-address"}}}, ForwardsSet: true},
	}
	for name, e := range bad {
		if err := d.applyEdit(e); err == nil {
			t.Errorf("%s: applied", name)
		}
	}
	rec, _ := state.Load(dir)
	if rec.Rules != nil || rec.Forwards != nil || rec.Presets != nil || rec.Placeholders != nil {
		t.Fatalf("a refused edit was written: %+v", rec)
	}
	good := recordEdit{State: state.StateRunning, Rules: &state.RuntimeRules{Block: []string{"ads.example.com"}}, RulesSet: true}
	if err := d.applyEdit(good); err != nil {
		t.Fatal(err)
	}
	rec, _ = state.Load(dir)
	if rec.State != state.StateRunning || rec.Rules == nil || rec.Rules.Block[0] != "ads.example.com" {
		t.Fatalf("after a good edit: %+v", rec)
	}
}
