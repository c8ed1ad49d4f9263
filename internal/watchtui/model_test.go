package watchtui

import (
	"strings"
	"sync"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
)

var t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

type answers struct {
	mu  sync.Mutex
	got []string
}

func (a *answers) fn(h control.Hold, ans control.Answer) (*control.AnswerResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, h.Sandbox+"/"+h.ID+"/"+ans.Answer+"/"+ans.Scope)
	return &control.AnswerResult{Rule: "x.example", File: "/w/moat.toml"}, nil
}

func hold(sb, id, name string, since time.Time) control.Event {
	return control.Event{Type: control.EventHold, Sandbox: sb, Hold: &control.Hold{ID: id, Sandbox: sb, Name: name, Port: 443,
		Since: since, Expires: since.Add(30 * time.Second), Count: 1, Suggest: name, Domain: "example"}}
}

// run feeds messages and runs the commands they return (answers).
func run(m Model, msgs ...tea.Msg) Model {
	for _, msg := range msgs {
		nm, cmd := m.Update(msg)
		m = nm.(Model)
		if cmd != nil {
			if out := cmd(); out != nil {
				if _, ok := out.(answeredMsg); ok {
					nm, _ = m.Update(out)
					m = nm.(Model)
				}
			}
		}
	}
	return m
}

func key(k string) tea.KeyPressMsg { return tea.KeyPressMsg{Code: []rune(k)[0], Text: k} }

func TestHoldsAndAnswers(t *testing.T) {
	now := t0.Add(5 * time.Second)
	tests := []struct {
		name     string
		msgs     []tea.Msg
		answers  []string
		screen   []string // must appear
		noScreen []string // must not
	}{
		{"oldest first, once", []tea.Msg{
			EventMsg{"api", hold("api", "h2", "b.example", t0.Add(time.Second))},
			EventMsg{"web", hold("web", "h1", "a.example", t0)},
			key("o"),
		}, []string{"web/h1/once/"}, []string{"> web", "a.example:443", "b.example:443", "wrote x.example to /w/moat.toml"}, nil},
		{"move and deny", []tea.Msg{
			EventMsg{"api", hold("api", "h1", "a.example", t0)},
			EventMsg{"api", hold("api", "h2", "b.example", t0.Add(time.Second))},
			key("j"), key("d"),
		}, []string{"api/h2/deny/"}, []string{"> api          b.example:443"}, nil},
		{"always asks for the file", []tea.Msg{
			EventMsg{"api", hold("api", "h1", "a.example", t0)},
			key("a"), key("u"),
		}, []string{"api/h1/always/user"}, nil, nil},
		{"block, project", []tea.Msg{
			EventMsg{"api", hold("api", "h1", "a.example", t0)},
			key("b"), key("p"),
		}, []string{"api/h1/block/project"}, nil, nil},
		{"scope cancelled", []tea.Msg{
			EventMsg{"api", hold("api", "h1", "a.example", t0)},
			key("a"), key("x"),
		}, nil, []string{"cancelled"}, nil},
		{"no hold, no answer", []tea.Msg{key("o")}, nil, []string{"no connection is waiting"}, nil},
		{"resolved leaves, logged", []tea.Msg{
			EventMsg{"api", hold("api", "h1", "a.example", t0)},
			EventMsg{"api", control.Event{Type: control.EventResolved, Hold: &control.Hold{ID: "h1", Name: "a.example", Port: 443}, By: "timeout", Time: t0}},
		}, nil, []string{"refused, no answer: a.example:443 (timeout)", "no connection is waiting"}, []string{"> api"}},
		{"joined hold counts and process", []tea.Msg{
			EventMsg{"api", hold("api", "h1", "a.example", t0)},
			EventMsg{"api", control.Event{Type: control.EventHoldMore, Hold: &control.Hold{ID: "h1", Sandbox: "api", Name: "a.example", Port: 443,
				Since: t0, Expires: t0.Add(30 * time.Second), Count: 3, Process: "pid 9 curl https://a.example/"}}},
		}, nil, []string{"5s      25s    3     pid 9 curl https://a.example/"}, nil},
		{"dropped stream marks stale, reconnect resends", []tea.Msg{
			EventMsg{"api", hold("api", "h1", "a.example", t0)},
			ConnMsg{Sandbox: "api", Connected: false},
		}, nil, []string{"(disconnected; may be gone)", "reconnecting to api"}, nil},
		{"reconnect forgets what is not sent again", []tea.Msg{
			EventMsg{"api", hold("api", "h1", "a.example", t0)},
			ConnMsg{Sandbox: "api", Connected: false},
			ConnMsg{Sandbox: "api", Connected: true},
			EventMsg{"api", hold("api", "h2", "c.example", t0)},
		}, nil, []string{"c.example:443"}, []string{"a.example:443"}},
		{"a stopped sandbox leaves", []tea.Msg{
			EventMsg{"api", hold("api", "h1", "a.example", t0)},
			ConnMsg{Sandbox: "api", Connected: false},
			GoneMsg{Sandbox: "api"},
		}, nil, []string{"0 sandbox(es) watched", "no connection is waiting"}, []string{"reconnecting"}},
		{"decisions logged", []tea.Msg{
			EventMsg{"api", control.Event{Type: control.EventDecision, Time: t0, Record: &audit.Record{Proto: "tcp", Dst: "198.18.0.4:443",
				Name: "z.example", Verdict: "deny", Reason: "no rule allows it"}}},
		}, nil, []string{"deny       tcp  z.example:443  no rule allows it"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a answers
			m := run(New(a.fn, func() time.Time { return now }), tt.msgs...)
			if strings.Join(a.got, ",") != strings.Join(tt.answers, ",") {
				t.Errorf("answers %q, want %q", a.got, tt.answers)
			}
			screen := m.View().Content
			for _, s := range tt.screen {
				if !strings.Contains(screen, s) {
					t.Errorf("screen lacks %q:\n%s", s, screen)
				}
			}
			for _, s := range tt.noScreen {
				if strings.Contains(screen, s) {
					t.Errorf("screen has %q:\n%s", s, screen)
				}
			}
		})
	}
}
