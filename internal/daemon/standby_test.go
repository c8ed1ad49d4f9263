package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/state"
)

func TestStandbyEnvKey(t *testing.T) {
	// The keeper's environment as exec gave it against the list the CLI
	// would give: a variable twice has its last value, the pipes' and
	// the role's variables are not compared.
	started := []string{"PATH=/bin", "MOAT_RUNSC=/b/runsc", "MOAT_READY_FD=3", "MOAT_SECRETS_FD=4", "MOAT_STANDBY=1", "HOME=/root"}
	now := []string{"HOME=/root", "MOAT_RUNSC=/old", "PATH=/bin", "MOAT_RUNSC=/b/runsc"}
	if vs := changedVars(standbyEnvKey(started), standbyEnvKey(now)); len(vs) != 0 {
		t.Fatalf("alike environments differ in %v", vs)
	}
	now = append(now, "LANG=C", "PATH=/usr/bin")
	if vs := changedVars(standbyEnvKey(started), standbyEnvKey(now)); strings.Join(vs, ",") != "LANG,PATH" {
		t.Fatalf("changed: %v, want LANG,PATH", vs)
	}
	if vs := changedVars(standbyEnvKey(started), standbyEnvKey([]string{"PATH=/bin", "MOAT_RUNSC=/b/runsc"})); strings.Join(vs, ",") != "HOME" {
		t.Fatalf("a variable gone: %v, want HOME", vs)
	}
}

func TestStandbyStale(t *testing.T) {
	rec := &state.Record{Name: "s", State: state.StateSuspended, Config: []byte(`{"a":1}`), Placeholders: map[string]string{"K": "moat-ph-1"}}
	env := []string{"PATH=/bin", "HOME=/root"}
	values := map[string]string{"TOKEN": "canary-standby-1"}
	sb, err := newStandbyState(append(env, "MOAT_READY_FD=3"), values, rec)
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{"gh": "canary-command-1"}
	read := func(_ context.Context, name string) ([]byte, error) {
		v, ok := sources[name]
		if !ok {
			return nil, errors.New("no such source")
		}
		return []byte(v), nil
	}
	sb.readSecret("gh", []byte(sources["gh"]))
	same := standbyRequest{Op: "go", Env: env, Values: map[string]string{"TOKEN": "canary-standby-1"}}
	// What only says how the last run went is not compared.
	ran := *rec
	ran.State, ran.Started, ran.Stopped, ran.DaemonPID, ran.Desired = state.StateSuspended, time.Now(), time.Now(), 42, "running"
	if why := sb.stale(context.Background(), same, &ran, read); why != "" {
		t.Fatalf("an unchanged standby is stale: %s", why)
	}
	for _, c := range []struct {
		name   string
		req    standbyRequest
		rec    func(*state.Record)
		source string
		want   string
	}{
		{"environment", standbyRequest{Env: []string{"PATH=/usr/bin", "HOME=/root"}, Values: same.Values}, nil, "", "environment differs in PATH"},
		{"env secret", standbyRequest{Env: env, Values: map[string]string{"TOKEN": "canary-standby-2"}}, nil, "", "variable changed"},
		{"env secret gone", standbyRequest{Env: env}, nil, "", "variable changed"},
		{"rule", same, func(r *state.Record) { r.Rules = &state.RuntimeRules{Allow: []string{"example.com"}} }, "", "configuration, rules or forwards"},
		{"config", same, func(r *state.Record) { r.Config = []byte(`{"a":2}`) }, "", "configuration, rules or forwards"},
		{"command secret", same, nil, "canary-command-2", "secret gh reads differently"},
	} {
		r := *rec
		if c.rec != nil {
			c.rec(&r)
		}
		if c.source != "" {
			sources["gh"] = c.source
		}
		why := sb.stale(context.Background(), c.req, &r, read)
		sources["gh"] = "canary-command-1"
		if !strings.Contains(why, c.want) {
			t.Errorf("%s: stale says %q, want %q", c.name, why, c.want)
		}
		if strings.Contains(why, "canary") {
			t.Errorf("%s: the reason holds a secret's value: %q", c.name, why)
		}
	}
	delete(sources, "gh")
	if why := sb.stale(context.Background(), same, rec, read); !strings.Contains(why, "could not be read again") {
		t.Errorf("a source that fails now: %q", why)
	}
	// No value is kept as it was given.
	for _, b := range [][]byte{sb.values, sb.secrets["gh"]} {
		if strings.Contains(string(b), "canary") {
			t.Fatal("the standby keeps a secret's value")
		}
	}
}
