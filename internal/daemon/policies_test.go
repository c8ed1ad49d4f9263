package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/lists"
	"moat.dev/moat/internal/policy"
)

// TestRulesNamedPolicies: the policies in use become named-layer rules,
// in use order, with source "policy NAME": inline entries and the list's.
// A user's allow still beats a list's block (a higher layer).
func TestRulesNamedPolicies(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "ads.txt")
	os.WriteFile(list, []byte("0.0.0.0 ads.corp.test\n||track.test^\nnot a line!\n"), 0o644)
	n := config.Network{
		Use: []string{"corp", "ads"},
		Policies: map[string]config.Policy{
			"corp": {Name: "corp", Allow: []string{"*.corp.test", "*.track.test", "user.test"}},
			"ads":  {Name: "ads", Source: list, Refresh: time.Hour},
		},
		Layers: []config.NetworkLayer{{Source: "/u/config.toml", Allow: []string{"ok.track.test"}}},
	}
	loaded := LoadLists(context.Background(), &lists.Cache{Dir: filepath.Join(dir, "cache")}, n, true)
	if w := loaded["ads"].Warnings; len(w) != 1 || !strings.Contains(w[0], "line 3") {
		t.Fatalf("warnings: %v", w)
	}
	rules, err := Rules(RuleSources{Network: n, UserConfig: "/u/config.toml", Loaded: loaded})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rules {
		got = append(got, r.Layer.String()+" "+r.Action.String()+" "+r.Entry+" ("+r.Source+")")
	}
	want := []string{
		"policy allow *.corp.test (policy corp)", "policy allow *.track.test (policy corp)", "policy allow user.test (policy corp)",
		"policy block ads.corp.test (policy ads)", "policy block track.test (policy ads)", "policy block *.track.test (policy ads)",
		"user allow ok.track.test (/u/config.toml)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	p := policy.Compile(rules)
	for _, c := range []struct {
		name string
		want policy.Verdict
	}{
		{"ads.corp.test", policy.Deny},  // the list's exact name beats the inline wildcard
		{"www.corp.test", policy.Allow}, // the inline allow
		{"a.track.test", policy.Deny},   // a tie in narrowness: block wins
		{"ok.track.test", policy.Allow}, // the user's layer wins over the list
	} {
		if d := p.Name(c.name, 443); d.Verdict != c.want {
			t.Errorf("%s: %v (%v), want %v", c.name, d.Verdict, d.Rule, c.want)
		}
	}

	// A list that could not be loaded is an empty layer, not an error.
	n.Policies["ads"] = config.Policy{Name: "ads", Source: filepath.Join(dir, "missing.txt"), Refresh: time.Hour}
	loaded = LoadLists(context.Background(), &lists.Cache{Dir: filepath.Join(dir, "cache")}, n, true)
	if rules, err := Rules(RuleSources{Network: n, UserConfig: "/u/config.toml", Loaded: loaded}); err != nil || len(rules) != 4 {
		t.Fatalf("missing list: %d rules, %v", len(rules), err)
	}
	if _, err := Rules(RuleSources{Network: config.Network{Use: []string{"ads"}}}); err == nil || !strings.Contains(err.Error(), "[policies.ads]") {
		t.Fatalf("undefined policy: %v", err)
	}
}
