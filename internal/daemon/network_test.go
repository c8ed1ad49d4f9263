package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/state"
)

func TestRulesLayers(t *testing.T) {
	n := config.Network{
		Use: []string{"none"},
		Layers: []config.NetworkLayer{
			{Source: "/home/u/.config/moat/config.toml", Block: []string{"a.test"}},
			{Source: "/src/p/moat.toml", Allow: []string{"a.test", "b.test:22"}},
		},
	}
	rt := &state.RuntimeRules{Block: []string{"b.test:22"}}
	rules, err := Rules(RuleSources{Network: n, UserConfig: "/home/u/.config/moat/config.toml", Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rules {
		got = append(got, r.Layer.String()+" "+r.Action.String()+" "+r.Entry)
	}
	want := "user block a.test|project allow a.test|project allow b.test:22|runtime block b.test:22"
	if strings.Join(got, "|") != want {
		t.Fatalf("got  %s\nwant %s", strings.Join(got, "|"), want)
	}
	p := policy.Compile(rules)
	// The project's allow beats the user's block (highest layer with an
	// opinion); the runtime block beats the project's allow.
	if d := p.Name("a.test", 443); d.Verdict != policy.Allow {
		t.Errorf("a.test: %v", d.Verdict)
	}
	if d := p.Name("b.test", 22); d.Verdict != policy.Deny {
		t.Errorf("b.test:22: %v", d.Verdict)
	}
}

func TestRulesDefaultAndUnknownPolicy(t *testing.T) {
	disc := []policy.Rule{{Entry: "mirror.test.example", Action: policy.Allow, Layer: policy.LayerNamed, Name: "mirror.test.example", Source: "discovered: test"}}
	rules, err := Rules(RuleSources{Discovered: disc})
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != len(policy.Builtin())+1 {
		t.Fatalf("default: %d rules, want builtin + discovered", len(rules))
	}
	if rules, _ := Rules(RuleSources{Network: config.Network{Use: []string{"none"}}, Discovered: disc}); len(rules) != 0 {
		t.Fatalf("none: %d rules", len(rules))
	}
	if _, err := Rules(RuleSources{Network: config.Network{Use: []string{"nope"}}}); err == nil || !strings.Contains(err.Error(), `unknown policy "nope"`) {
		t.Fatalf("unknown policy: %v", err)
	}
	if _, err := Rules(RuleSources{Network: config.Network{Layers: []config.NetworkLayer{{Source: "moat.toml", Allow: []string{"http://x.test/"}}}}}); err == nil {
		t.Fatal("a bad entry compiled")
	}
}

func TestApplyRuleChange(t *testing.T) {
	rec := &state.Record{Name: "ws"}
	steps := []struct {
		op      string
		entries []string
		allow   string
		block   string
		wantErr string
	}{
		{"allow", []string{"a.test", "b.test"}, "a.test b.test", "", ""},
		{"block", []string{"a.test"}, "b.test", "a.test", ""},
		{"allow", []string{"A.TEST"}, "b.test A.TEST", "", ""},
		{"remove", []string{"b.test"}, "A.TEST", "", ""},
		{"remove", []string{"c.test"}, "A.TEST", "", "see: moat network list ws)"},
		{"allow", []string{"ok.test", "http://bad/"}, "A.TEST", "", "http://bad/"},
		{"grant", []string{"x.test"}, "A.TEST", "", "unknown rule operation"},
	}
	for _, s := range steps {
		err := ApplyRuleChange(rec, s.op, s.entries)
		rt := rec.Rules
		if (err == nil) != (s.wantErr == "") || (err != nil && !strings.Contains(err.Error(), s.wantErr)) {
			t.Fatalf("%s %v: err %v, want %q", s.op, s.entries, err, s.wantErr)
		}
		if strings.Join(rt.Allow, " ") != s.allow || strings.Join(rt.Block, " ") != s.block {
			t.Fatalf("%s %v: allow %v block %v, want %q %q", s.op, s.entries, rt.Allow, rt.Block, s.allow, s.block)
		}
	}
}

// TestSettling: a connection no rule decides waits for the host's tools
// (asking them if nobody has yet) and then is decided again; once they are
// done, nobody waits; and once one connection has waited discoveryWait in
// vain, the others do not wait for tools that hang.
func TestSettling(t *testing.T) {
	old := discoveryWait
	discoveryWait = 200 * time.Millisecond
	t.Cleanup(func() { discoveryWait = old })

	// Tools that answer: the first connection asks them and waits.
	n := &network{settled: make(chan struct{})}
	asked := 0
	n.discover = func() {
		asked++
		if asked == 1 {
			go func() { time.Sleep(20 * time.Millisecond); close(n.settled) }()
		}
	}
	hurried := 0
	n.hurry = func() { hurried++ }
	if !n.settling(context.Background()) || asked != 1 {
		t.Fatalf("tools answering: settling did not wait for them (asked %d times)", asked)
	}
	if hurried != 1 {
		t.Errorf("a connection that waited for the tools hurried them %d times, want 1", hurried)
	}
	start := time.Now()
	if n.settling(context.Background()) || time.Since(start) > 50*time.Millisecond {
		t.Fatal("after the tools answered: settling still waited")
	}
	if hurried != 1 {
		t.Errorf("after the tools answered: hurried %d times, want still 1", hurried)
	}

	// Tools that hang: the first connection waits discoveryWait, the next not at all.
	n = &network{settled: make(chan struct{}), discover: func() {}}
	start = time.Now()
	if n.settling(context.Background()) || time.Since(start) < discoveryWait {
		t.Fatalf("hanging tools: settling returned after %v, want false after %v", time.Since(start), discoveryWait)
	}
	start = time.Now()
	if n.settling(context.Background()) || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("hanging tools, second connection: waited %v, want no wait", time.Since(start))
	}

	// Not asking the host's tools at all: nothing to wait for.
	n = &network{settled: make(chan struct{})}
	if n.settling(context.Background()) {
		t.Fatal("without discovery settling reported a wait")
	}
	// A connection that goes away stops waiting.
	n = &network{settled: make(chan struct{}), discover: func() {}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n.settling(ctx) || n.late.Load() {
		t.Fatal("a cancelled wait counted as the tools being late")
	}
}
