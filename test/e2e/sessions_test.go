package e2e

// End-to-end tests of the agents' kept conversations (internal/agentstate).
//
// TestSessionsKeptAcrossSandboxes: a plain command writes where the agents keep their
// conversations, in two sandboxes of one project; both are destroyed; a third sees both, not
// the credentials beside them, and a hook the guest planted never runs on the host.
//
// TestSessionsClaudeResumes: the real Claude
// Code, installed from its npm package through the gate, talks to the stand-in model API in
// two sandboxes of one project; both sandboxes are destroyed; a third sandbox of the project
// lists both conversations (moat sessions list) and resumes them: the request Claude Code
// sends with --resume ID and with --continue carries the earlier conversation's prompt, which
// only the kept transcript can have given it.
//
// Claude Code is installed once into the workspace (npm -g --prefix), which every sandbox of the
// project shares, and linked into each sandbox's /usr/local/bin: one install for three
// sandboxes. npm is given the guest's ca.pem (the sandbox CA and the [network] trust files):
// its own cafile setting, read from the host's npmrc, would replace Node's roots with the
// host's bundle, which lacks the sandbox CA.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/preset"
	"moat.dev/moat/test/inet"
)

// bodyLog records the bodies of the model requests the stand-in answers.
type bodyLog struct {
	mu     sync.Mutex
	bodies []string
}

func (l *bodyLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if strings.HasSuffix(r.URL.Path, "/v1/messages") {
			l.mu.Lock()
			l.bodies = append(l.bodies, string(b))
			l.mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		h.ServeHTTP(w, r)
	})
}

func (l *bodyLog) mark() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.bodies) }

// since is the bodies received after mark.
func (l *bodyLog) since(mark int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.bodies[mark:])
}

// TestSessionsClaudeResumes is the real agent's proof (skipped where npm or its registry is
// missing, as TestAgents is).
func TestSessionsClaudeResumes(t *testing.T) {
	reg := npmRegistry(t)
	const a, b, c = "sessions-e2e", "sessions-e2e-b", "sessions-e2e-c"
	dir := project(t, a)
	for _, n := range []string{b, c} {
		t.Cleanup(func() {
			moat(t, dir, nil, "destroy", "--yes", n)
		})
	}
	u, _ := url.Parse(reg)
	toml := fmt.Sprintf("[network]\nallow = [%q]\n", u.Hostname())
	// A host whose own Node trusts extra roots (an egress proxy that re-signs) has the
	// registry spliced through the gate with those roots: the guest needs them too.
	var trust []string
	if f := os.Getenv("NODE_EXTRA_CA_CERTS"); f != "" {
		trust = append(trust, fmt.Sprintf("%q", f))
		toml += fmt.Sprintf("trust = [%s]\n", strings.Join(trust, ", "))
	}
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	tools := filepath.Join(dir, ".tools")
	start := time.Now()
	r := moatWithin(t, dir, 15*time.Minute, "run", "--", "sudo", "-n", "npm", "install", "-g", "--prefix", tools, "--cafile", guestspec.Dir+"/ca.pem", "--no-fund", "--no-audit", "--registry", reg, claudePackage)
	if r.code != 0 {
		t.Fatalf("npm install --prefix %s %s through the gate: exit %d\nstdout: %s\nstderr: %s", tools, claudePackage, r.code, tail(r.stdout, 30), tail(r.stderr, 30))
	}
	t.Logf("npm install %s through the gate: %v", claudePackage, time.Since(start).Round(time.Second))
	if r := moat(t, dir, nil, "down"); r.code != 0 {
		t.Fatalf("moat down: exit %d\n%s", r.code, r.stderr)
	}

	n := inet.Start(t)
	p, _ := preset.Lookup("claude")
	answer := "standin-answer-" + randHex(t, 4)
	var log bodyLog
	n.HTTPS(t, standinIP, 443, p.Hosts, log.wrap(inet.ModelAPI(answer)))
	for _, h := range p.Hosts {
		n.SetA(h, standinIP)
	}
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, n.CA().PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	toml = fmt.Sprintf("[network]\nallow = [%q]\ntrust = [%s]\n", u.Hostname(), strings.Join(append(trust, fmt.Sprintf("%q", ca)), ", "))
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"MOAT_UPSTREAM_DNS=" + upstreamDNS, "ANTHROPIC_API_KEY=sk-ant-canary-" + randHex(t, 20)}
	if r := moat(t, dir, env, "up", "--reconfigure"); r.code != 0 {
		t.Fatalf("moat up --reconfigure with the test DNS: exit %d\n%s", r.code, r.stderr)
	}
	// link puts the workspace's claude on the sandbox's PATH (creating the sandbox).
	link := func(name string) {
		t.Helper()
		r := moat(t, dir, env, "run", "--name", name, "--", "sudo", "-n", "ln", "-sf", filepath.Join(tools, "bin", "claude"), "/usr/local/bin/claude")
		if r.code != 0 {
			t.Fatalf("linking claude in %s: exit %d\n%s", name, r.code, r.stderr)
		}
	}
	claude := func(name string, args ...string) []string {
		t.Helper()
		mark := log.mark()
		r := moat(t, dir, env, append([]string{"run", "--name", name, "claude", "--"}, args...)...)
		if r.code != 0 || !strings.Contains(r.stdout, answer) {
			t.Fatalf("moat run --name %s claude -- %v: exit %d, want the stand-in's answer\nstdout: %s\nstderr: %s", name, args, r.code, tail(r.stdout, 20), tail(r.stderr, 20))
		}
		return log.since(mark)
	}

	// Two sandboxes of the project, both running, each with its own conversation.
	promptA, promptB := "prompt-a-"+randHex(t, 6), "prompt-b-"+randHex(t, 6)
	link(a)
	link(b)
	claude(a, "-p", promptA)
	claude(b, "-p", promptB)
	for _, name := range []string{a, b} {
		if r := moat(t, dir, nil, "destroy", "--yes", name); r.code != 0 {
			t.Fatalf("moat destroy %s: exit %d\n%s", name, r.code, r.stderr)
		}
	}

	// Both kept, each with the sandbox that wrote it.
	r = moat(t, dir, nil, "sessions", "list", "--json")
	if r.code != 0 {
		t.Fatalf("moat sessions list --json: exit %d\n%s", r.code, r.stderr)
	}
	bySandbox := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var s struct{ Agent, ID, Sandbox string }
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("moat sessions list --json: %q: %v", line, err)
		}
		if s.Agent == "claude" {
			bySandbox[s.Sandbox] = s.ID
		}
	}
	if bySandbox[a] == "" || bySandbox[b] == "" {
		t.Fatalf("moat sessions list does not show a conversation of each sandbox %s and %s:\n%s\n%s", a, b, r.stdout, r.stderr)
	}
	if r := moat(t, dir, nil, "sessions", "list"); !strings.Contains(r.stdout, bySandbox[a]) {
		t.Errorf("moat sessions list (table) lacks %s:\n%s", bySandbox[a], r.stdout)
	}

	// A third sandbox resumes each: what it sends the model holds the earlier prompt.
	link(c)
	for _, tc := range []struct {
		args []string
		want []string // any of
	}{
		{[]string{"--resume", bySandbox[a], "-p", "again"}, []string{promptA}},
		{[]string{"--resume", bySandbox[b], "-p", "again"}, []string{promptB}},
		{[]string{"--continue", "-p", "again"}, []string{promptA, promptB}},
	} {
		bodies := claude(c, tc.args...)
		if !slices.ContainsFunc(bodies, func(body string) bool { return mentionsAny(body, tc.want...) }) {
			t.Errorf("claude %v in a new sandbox sent %d model requests, none with the earlier prompt %q: the kept conversation was not resumed", tc.args, len(bodies), tc.want)
		}
	}
}

func TestSessionsKeptAcrossSandboxes(t *testing.T) {
	const a, b, c = "sessions-plain", "sessions-plain-b", "sessions-plain-c"
	dir := project(t, a)
	for _, n := range []string{b, c} {
		t.Cleanup(func() { moat(t, dir, nil, "destroy", "--yes", n) })
	}
	marker := filepath.Join(t.TempDir(), "hook-ran")
	sh := func(name, script string) string {
		t.Helper()
		r := moat(t, dir, nil, "run", "--name", name, "--", "sh", "-ec", script)
		if r.code != 0 {
			t.Fatalf("moat run --name %s: exit %d\nstdout: %s\nstderr: %s", name, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	// What each agent would write, a credential beside it, and a hook and a filter for the
	// host's git to run, if it read anything of the guest's as configuration.
	write := func(name, tag string) {
		sh(name, `mkdir -p ~/.claude/projects/-w ~/.codex/sessions/2026/12/05
echo '{"prompt":"`+tag+`"}' > ~/.claude/projects/-w/s`+tag+`.jsonl
echo '{"display":"history `+tag+`"}' >> ~/.claude/history.jsonl
echo '{"rollout":"`+tag+`"}' > ~/.codex/sessions/2026/12/05/rollout-`+tag+`.jsonl
echo credential-`+tag+` > ~/.claude/.credentials.json
mkdir -p ~/.claude/projects/.git/hooks
printf '#!/bin/sh\ntouch `+marker+`\n' > ~/.claude/projects/.git/hooks/post-commit
chmod +x ~/.claude/projects/.git/hooks/post-commit
echo '* filter=x merge=x' > ~/.claude/projects/.gitattributes`)
	}
	write(a, "A")
	write(b, "B")
	for _, name := range []string{a, b} {
		if r := moat(t, dir, nil, "destroy", "--yes", name); r.code != 0 {
			t.Fatalf("moat destroy %s: exit %d\n%s", name, r.code, r.stderr)
		}
	}
	r := moat(t, dir, nil, "sessions", "list", "--json")
	if r.code != 0 {
		t.Fatalf("moat sessions list --json: exit %d\n%s", r.code, r.stderr)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var s struct{ Agent, ID, Sandbox string }
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("moat sessions list --json: %q: %v", line, err)
		}
		got = append(got, s.Agent+" "+s.ID+" "+s.Sandbox)
	}
	slices.Sort(got)
	want := []string{"claude sA " + a, "claude sB " + b, "codex rollout-A " + a, "codex rollout-B " + b}
	if !slices.Equal(got, want) {
		t.Errorf("moat sessions list = %q, want %q", got, want)
	}
	out := sh(c, `cat ~/.claude/projects/-w/sA.jsonl ~/.claude/projects/-w/sB.jsonl ~/.claude/history.jsonl ~/.codex/sessions/2026/12/05/rollout-A.jsonl; ls -A ~/.claude ~/.claude/projects`)
	for _, w := range []string{`"prompt":"A"`, `"prompt":"B"`, "history A", "history B", `"rollout":"A"`} {
		if !strings.Contains(out, w) {
			t.Errorf("a new sandbox of the project lacks %s:\n%s", w, out)
		}
	}
	for _, w := range []string{".credentials.json", ".git", ".gitattributes"} {
		if strings.Contains(out, w) {
			t.Errorf("%s reached a new sandbox of the project:\n%s", w, out)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("a hook the guest wrote ran on the host")
	}
	if r := moat(t, dir, nil, "sessions", "show", "sA"); r.code != 0 || !strings.Contains(r.stdout, "sandbox:") || !strings.Contains(r.stdout, a) {
		t.Errorf("moat sessions show sA: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := moat(t, dir, nil, "sessions", "rm", "sA"); r.code != 2 {
		t.Errorf("moat sessions rm without --yes off a terminal: exit %d, want 2", r.code)
	}
	if r := moat(t, dir, nil, "sessions", "rm", "sA", "--yes"); r.code != 0 {
		t.Fatalf("moat sessions rm sA --yes: exit %d\n%s", r.code, r.stderr)
	}
	if r := moat(t, dir, nil, "sessions", "list"); strings.Contains(r.stdout, "sA") || !strings.Contains(r.stdout, "sB") {
		t.Errorf("after rm sA, moat sessions list:\n%s", r.stdout)
	}
}
