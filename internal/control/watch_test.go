package control

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestHoldRules: the rule an answer writes, which the watcher writes into
// a file and the daemon applies live; both take it from here.
func TestHoldRules(t *testing.T) {
	web := Hold{Name: "api.example.com", Port: 443, Suggest: "api.example.com", Domain: "example.com"}
	for _, tt := range []struct {
		name    string
		h       Hold
		answer  string
		list    string
		entries []string
		err     error // nil: no error, or errors.Is
		errHas  string
	}{
		{"always", web, AnswerAlways, "allow", []string{"api.example.com"}, nil, ""},
		{"block", web, AnswerBlock, "block", []string{"example.com", "*.example.com"}, nil, ""},
		{"always by address", Hold{Addr: "203.0.113.7", Port: 5432, Suggest: "203.0.113.7:5432"}, AnswerAlways,
			"allow", []string{"203.0.113.7:5432"}, nil, ""},
		{"block by address", Hold{Addr: "203.0.113.7", Port: 5432, Suggest: "203.0.113.7:5432"}, AnswerBlock, "", nil, ErrBlockNoName, ""},
		{"once writes nothing", web, AnswerOnce, "", nil, nil, ""},
		{"run writes nothing", web, AnswerRun, "", nil, nil, ""},
		{"signature", Hold{Kind: "ssh-sign", Name: "sign with key"}, AnswerAlways, "", nil, ErrSignAnswer, ""},
		{"signature, once", Hold{Kind: "ssh-sign", Name: "sign with key"}, AnswerOnce, "", nil, nil, ""},
		{"a rule moat cannot read back", Hold{Name: "x", Suggest: "http://x/"}, AnswerAlways, "", nil, nil, "is not a rule moat can write"},
	} {
		list, entries, err := tt.h.Rules(tt.answer)
		switch {
		case tt.err != nil && !errors.Is(err, tt.err):
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.err)
		case tt.errHas != "" && (err == nil || !strings.Contains(err.Error(), tt.errHas)):
			t.Errorf("%s: err %v, want one with %q", tt.name, err, tt.errHas)
		case tt.err == nil && tt.errHas == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case list != tt.list || !slices.Equal(entries, tt.entries):
			t.Errorf("%s: %q %q, want %q %q", tt.name, list, entries, tt.list, tt.entries)
		}
	}
}

// TestAnswerJSONFrozen pins the answer's wire names: a front end written
// against schema 1 must keep working.
func TestAnswerJSONFrozen(t *testing.T) {
	b, err := json.Marshal(Answer{Schema: 1, Answer: AnswerAlways, Scope: ScopeUser, Written: "/h/config.toml"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"schema":1,"answer":"always","scope":"user","written":"/h/config.toml"}`
	if string(b) != want {
		t.Errorf("Answer JSON %s, want %s", b, want)
	}
	b, _ = json.Marshal(AnswerResult{Schema: 1, Rule: "x", File: "/f"})
	if want := `{"schema":1,"rule":"x","file":"/f"}`; string(b) != want {
		t.Errorf("AnswerResult JSON %s, want %s", b, want)
	}
}
