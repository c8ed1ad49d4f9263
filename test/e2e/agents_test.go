package e2e

// End-to-end tests of the agent presets: the real Claude Code and Codex,
// installed from their npm packages through the gate as a user would, against a stand-in model
// API on the test internet (inet.ModelAPI) that serves the agents' real host names with the test
// CA, which the sandbox trusts ([network] trust).
//
// One sandbox carries every check: installing both packages costs minutes, a start a second.
// It is made with the host's own DNS (the registry must resolve), then stopped and started
// again with the gate's resolver pointed at the test DNS server, which names the stand-in for
// every host the presets allow; the installed packages stay in the writable layer.
//
// The API keys are random canaries that reach moat only through the environment of the
// commands that use a preset; the stand-in must receive them on every authenticated request,
// and the guest must never hold them.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/preset"
	"moat.dev/moat/test/inet"
)

const (
	claudePackage = "@anthropic-ai/claude-code"
	codexPackage  = "@openai/codex"
	standinIP     = "198.51.100.70"
	// agentRunBound bounds one agent run against the stand-in: a start of the agent (a few
	// seconds in gVisor) and a streamed answer.
	agentRunBound = 90 * time.Second
)

// telemetryPaths are the requests the stand-in must never see: the agents' event logs,
// metrics and feature-flag evaluation (the claude preset's blocks), and whatever else names
// itself telemetry.
var telemetryPaths = []string{"/api/event_logging/", "/api/claude_code/metrics", "/api/eval/", "telemetry", "/otel", "analytics"}

type agentsEnv struct {
	dir, name, state string
	reg              string
	n                *inet.Net
	api              *inet.Server
	answer           string
	anthropicKey     string
	openaiKey        string
	dnsEnv           []string // MOAT_UPSTREAM_DNS: the test DNS
}

// npmRegistry is the host's npm registry, or a skip saying why the test cannot run here.
func npmRegistry(t *testing.T) string {
	t.Helper()
	if os.Getenv("MOAT_TEST_NPM") == "0" {
		t.Skip("skipped: MOAT_TEST_NPM=0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "npm", "config", "get", "registry").Output()
	if err != nil {
		t.Skipf("skipped: no npm on the host to read the registry from (npm config get registry: %v); this test runs where npm is installed and its registry answers", err)
	}
	reg := strings.TrimSpace(string(out))
	u, err := url.Parse(reg)
	if err != nil || u.Hostname() == "" || u.Scheme != "https" {
		t.Fatalf("the host's npm registry %q is not an https URL", reg)
	}
	if err := answers(reg); err != nil {
		t.Skipf("skipped: the host cannot reach its npm registry (HEAD %s: %v); this test runs where it answers", reg, err)
	}
	return reg
}

func newAgentsEnv(t *testing.T) *agentsEnv {
	t.Helper()
	reg := npmRegistry(t)
	a := &agentsEnv{
		name: "agents-e2e", reg: reg,
		anthropicKey: "sk-ant-canary-" + randHex(t, 20),
		openaiKey:    "sk-canary-" + randHex(t, 20),
		dnsEnv:       []string{"MOAT_UPSTREAM_DNS=" + upstreamDNS},
	}
	a.answer = "standin-answer-" + randHex(t, 4)
	a.dir = project(t, a.name)
	a.state = filepath.Join(moatHome, "state", "sandboxes", a.name)
	u, _ := url.Parse(reg)
	toml := fmt.Sprintf("[network]\nallow = [%q]\n", u.Hostname())
	if err := os.WriteFile(filepath.Join(a.dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	// The install first, with the host's DNS, before the test internet (whose lock other
	// tests wait for) exists.
	start := time.Now()
	r := moatWithin(t, a.dir, 15*time.Minute, "run", "--", "sudo", "-n", "npm", "install", "-g", "--no-fund", "--no-audit", "--registry", reg, claudePackage, codexPackage)
	if r.code != 0 {
		t.Fatalf("npm install -g %s %s through the gate: exit %d\nstdout: %s\nstderr: %s", claudePackage, codexPackage, r.code, tail(r.stdout, 30), tail(r.stderr, 30))
	}
	t.Logf("npm install -g %s %s through the gate: %v", claudePackage, codexPackage, time.Since(start).Round(time.Second))
	if r := moat(t, a.dir, nil, "down"); r.code != 0 {
		t.Fatalf("moat down: exit %d\n%s", r.code, r.stderr)
	}

	n := inet.Start(t)
	a.n = n
	var names []string
	for _, name := range []string{"claude", "codex"} {
		p, _ := preset.Lookup(name)
		names = append(names, p.Hosts...)
	}
	a.api = n.HTTPS(t, standinIP, 443, names, inet.ModelAPI(a.answer))
	for _, h := range names {
		n.SetA(h, standinIP)
	}
	ca := filepath.Join(a.dir, "ca.pem")
	if err := os.WriteFile(ca, n.CA().PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	toml += fmt.Sprintf("trust = [%q]\n", ca)
	if err := os.WriteFile(filepath.Join(a.dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	// Again with the test CA trusted and the test DNS: the agents' hosts are the stand-in
	// from here on; the installed packages stay in the writable layer.
	if r := moat(t, a.dir, a.dnsEnv, "up", "--reconfigure"); r.code != 0 {
		t.Fatalf("moat up --reconfigure with the test DNS: exit %d\n%s", r.code, r.stderr)
	}
	return a
}

// env is a command's environment: the test DNS and both canary keys.
func (a *agentsEnv) env() []string {
	return append(slices.Clone(a.dnsEnv), "ANTHROPIC_API_KEY="+a.anthropicKey, "OPENAI_API_KEY="+a.openaiKey)
}

// run runs moat with the keys exported, bounded.
func (a *agentsEnv) run(t *testing.T, args ...string) result {
	t.Helper()
	start := time.Now()
	r := moat(t, a.dir, a.env(), args...)
	if took := time.Since(start); took > agentRunBound {
		t.Errorf("moat %v took %v (bound %v)", args, took.Round(time.Millisecond), agentRunBound)
	}
	return r
}

// checkRequests checks the stand-in's requests since mark: every one that carries a
// credential carries the real key, no telemetry arrived, and at least one request was
// authenticated. It returns the requests.
func (a *agentsEnv) checkRequests(t *testing.T, mark int) []inet.Req {
	t.Helper()
	reqs := a.api.Requests()[mark:]
	authed := 0
	logRequests(t, reqs)
	for _, r := range reqs {
		for _, p := range telemetryPaths {
			if strings.Contains(strings.ToLower(r.Path), p) {
				t.Errorf("telemetry reached the API: %s %s%s", r.Method, r.Host, r.Path)
			}
		}
		key := r.Header.Get("X-Api-Key")
		if auth := r.Header.Get("Authorization"); auth != "" {
			key = strings.TrimPrefix(auth, "Bearer ")
		}
		if key == "" {
			continue
		}
		// The keys are bound to the API hosts only: there the gate must have put the real
		// key on every request; anywhere else (Codex sends its key to chatgpt.com too) the
		// request keeps the placeholder.
		switch r.Host {
		case "api.anthropic.com", "api.openai.com":
			authed++
			if key != a.anthropicKey && key != a.openaiKey {
				t.Errorf("%s %s%s carried a credential that is not the real key: %s", r.Method, r.Host, r.Path, redactKey(key))
			}
		default:
			if key == a.anthropicKey || key == a.openaiKey {
				t.Errorf("%s %s%s carried a real key to a host it is not bound to", r.Method, r.Host, r.Path)
			}
		}
	}
	if authed == 0 {
		t.Errorf("no authenticated request reached the stand-in (%d requests)", len(reqs))
	}
	return reqs
}

// logRequests logs what the stand-in got, a line per kind of request with how many came.
func logRequests(t *testing.T, reqs []inet.Req) {
	t.Helper()
	var got []string
	for _, r := range reqs {
		got = append(got, fmt.Sprintf("%s %s%s (%s)", r.Method, r.Host, r.Path, strings.Join(mapsKeys(r.Header), ",")))
	}
	kinds, count := tally(got)
	for _, k := range kinds {
		t.Logf("stand-in got %d×: %s", count[k], k)
	}
}

func mapsKeys(h map[string][]string) []string {
	out := make([]string, 0, len(h))
	for k := range h {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// redactKey shows a credential's shape, not its value.
func redactKey(k string) string {
	if len(k) > 12 {
		return k[:12] + "…"
	}
	return k
}

// checkDenials fails the test for every destination the gate refused since since: a preset
// must allow every host its agent needs, and with the agent's non-essential traffic off it
// has no reason to try any other.
func (a *agentsEnv) checkDenials(t *testing.T, since time.Time) {
	t.Helper()
	time.Sleep(500 * time.Millisecond) // a connection's record is written when it ends
	// One error per refused destination, however often the agent retried it.
	var refused []string
	for _, r := range readAudit(t, a.state) {
		if r.Verdict == "deny" && r.Time.After(since) {
			refused = append(refused, fmt.Sprintf("%s (%s, rule %q, reason %q)", r.Name, r.Dst, r.Rule, r.Reason))
		}
	}
	kinds, count := tally(refused)
	for _, k := range kinds {
		t.Errorf("the gate refused %s %d time(s): a host the agent needed is missing from its preset, or its non-essential traffic is not off", k, count[k])
	}
}

// tally is each distinct key, in the order first seen, and how often it came.
func tally(keys []string) ([]string, map[string]int) {
	var kinds []string
	count := map[string]int{}
	for _, k := range keys {
		if count[k] == 0 {
			kinds = append(kinds, k)
		}
		count[k]++
	}
	return kinds, count
}

func TestAgents(t *testing.T) {
	a := newAgentsEnv(t)
	for _, st := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"claude_print", a.testClaudePrint},
		{"claude_interactive_first_run", a.testClaudeInteractive},
		{"claude_outside_the_preset", a.testClaudeOutside},
		{"codex_exec", a.testCodexExec},
		{"telemetry_blocked_and_overridable", a.testTelemetryBlocks},
		{"seeded_settings_hold_placeholders_only", a.testSeeded},
		// Last: after every other check has had its chance to leave a value somewhere.
		{"guest_never_holds_the_keys", a.testNowhere},
	} {
		t.Run(st.name, st.f)
	}
}

func (a *agentsEnv) testClaudePrint(t *testing.T) {
	mark, since := len(a.api.Requests()), time.Now()
	r := a.run(t, "run", "claude", "--", "-p", "hi")
	if r.code != 0 || !strings.Contains(r.stdout, a.answer) {
		t.Fatalf("moat run claude -- -p hi: exit %d, want the stand-in's answer %q\nstdout: %s\nstderr: %s", r.code, a.answer, tail(r.stdout, 20), tail(r.stderr, 20))
	}
	a.checkRequests(t, mark)
	a.checkDenials(t, since)
}

func (a *agentsEnv) testClaudeOutside(t *testing.T) {
	// Not through the preset: the session still gets its quiet variables, as the record says
	// the sandbox has used it.
	mark, since := len(a.api.Requests()), time.Now()
	r := a.run(t, "run", "--", "claude", "-p", "hi")
	if r.code != 0 || !strings.Contains(r.stdout, a.answer) {
		t.Fatalf("moat run -- claude -p hi: exit %d\nstdout: %s\nstderr: %s", r.code, tail(r.stdout, 20), tail(r.stderr, 20))
	}
	a.checkRequests(t, mark)
	a.checkDenials(t, since)
	out := a.run(t, "run", "--", "sh", "-c", "echo NONESSENTIAL=$CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC TELEMETRY=$DISABLE_TELEMETRY")
	if !strings.Contains(out.stdout, "NONESSENTIAL=1 TELEMETRY=1") {
		t.Errorf("a session outside the preset lacks the preset's variables: %q", out.stdout)
	}
}

func (a *agentsEnv) testClaudeInteractive(t *testing.T) {
	// The prompt's footer ("bypass permissions on"): no question came first.
	a.interactive(t, "claude", "bypass")
}

// interactive runs `moat run PRESET` on a terminal: it must reach the agent's prompt, shown by
// ready, with no keypress, and answer what is typed there.
func (a *agentsEnv) interactive(t *testing.T, name, ready string) {
	mark, since := len(a.api.Requests()), time.Now()
	cmd := exec.Command(moatBin, "run", name)
	cmd.Dir, cmd.Env = a.dir, moatEnv(append(a.env(), "TERM=xterm-256color"))
	f, out := startPTY(t, cmd, 40, 120)
	defer f.Close()
	defer cmd.Process.Kill()
	out.WaitFor(t, ready, 60*time.Second)
	// The footer is drawn a little before the prompt takes input.
	time.Sleep(time.Second)
	f.Write([]byte("hi"))
	time.Sleep(time.Second)
	f.Write([]byte("\r"))
	out.WaitFor(t, a.answer, 60*time.Second)
	f.Write([]byte{3})
	time.Sleep(300 * time.Millisecond)
	f.Write([]byte{3})
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		// Quitting is not what this checks; the deferred kill ends the client, and with it
		// the guest session.
		t.Logf("%s did not exit within 10 s of two Ctrl-C; killing the client", name)
	}
	a.checkRequests(t, mark)
	a.checkDenials(t, since)
}

func (a *agentsEnv) testCodexExec(t *testing.T) {
	mark, since := len(a.api.Requests()), time.Now()
	r := a.run(t, "run", "codex", "--", "exec", "hi")
	if r.code != 0 || !strings.Contains(r.stdout, a.answer) {
		t.Fatalf("moat run codex -- exec hi: exit %d, want the stand-in's answer %q\nstdout: %s\nstderr: %s", r.code, a.answer, tail(r.stdout, 20), tail(r.stderr, 30))
	}
	reqs := a.checkRequests(t, mark)
	if !slices.ContainsFunc(reqs, func(r inet.Req) bool {
		return r.Path == "/v1/responses" && r.Header.Get("Authorization") == "Bearer "+a.openaiKey
	}) {
		t.Errorf("no /v1/responses request carried the real OpenAI key")
	}
	a.checkDenials(t, since)
}

// The preset's blocks: a telemetry POST on the API host is refused by the gate (the stand-in
// never sees it), shows as the preset layer in moat network list, and a user's allow of the
// same request lets it through.
func (a *agentsEnv) testTelemetryBlocks(t *testing.T) {
	list := a.run(t, "network", "list", a.name)
	if !strings.Contains(list.stdout, "POST api.anthropic.com/api/event_logging/*") || !strings.Contains(list.stdout, "preset") {
		t.Errorf("moat network list does not show the preset's telemetry block:\n%s", list.stdout)
	}
	post := `curl -s -o /dev/null -w 'STATUS=%{http_code}\n' --max-time 20 -X POST -H "x-api-key: $ANTHROPIC_API_KEY" -d '{}' https://api.anthropic.com/api/event_logging/v2/batch`
	mark := len(a.api.Requests())
	r := a.run(t, "run", "--", "sh", "-c", post)
	if got := fields(r.stdout)["STATUS"]; got != "403" {
		t.Errorf("POST to the event log: status %q, want the gate's 403\n%s", got, r.stderr)
	}
	for _, q := range a.api.Requests()[mark:] {
		if strings.Contains(q.Path, "event_logging") {
			t.Errorf("the blocked request reached the API: %s %s", q.Method, q.Path)
		}
	}
	entry := "POST api.anthropic.com/api/event_logging/*"
	if r := a.run(t, "network", "allow", a.name, entry); r.code != 0 {
		t.Fatalf("moat network allow %q: exit %d\n%s", entry, r.code, r.stderr)
	}
	defer a.run(t, "network", "remove", a.name, entry)
	r = a.run(t, "run", "--", "sh", "-c", post)
	if got := fields(r.stdout)["STATUS"]; got != "200" {
		t.Errorf("POST to the event log after the user's allow: status %q, want the stand-in's 200\n%s", got, r.stderr)
	}
}

// The seeded files hold the placeholders, never the keys, and what the agent wrote is kept.
func (a *agentsEnv) testSeeded(t *testing.T) {
	r := a.run(t, "run", "--", "sh", "-c", `cat ~/.claude.json; echo; echo ----; cat ~/.claude/settings.json; echo ----; cat ~/.codex/config.toml; echo ----; cat ~/.codex/auth.json`)
	parts := strings.Split(r.stdout, "----")
	if len(parts) != 4 {
		t.Fatalf("reading the seeded files: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	var cj map[string]any
	if err := json.Unmarshal([]byte(parts[0]), &cj); err != nil {
		t.Fatalf("~/.claude.json: %v\n%s", err, parts[0])
	}
	if cj["hasCompletedOnboarding"] != true || cj["bypassPermissionsModeAccepted"] != true {
		t.Errorf("~/.claude.json lacks the onboarding answers: %s", parts[0])
	}
	if _, ok := cj["userID"]; !ok {
		t.Logf("~/.claude.json has no userID: Claude Code's own keys may not have been written (merge kept nothing?)")
	}
	resp, _ := cj["customApiKeyResponses"].(map[string]any)
	approved, _ := resp["approved"].([]any)
	if len(approved) == 0 {
		t.Errorf("no key approved in ~/.claude.json: %s", parts[0])
	}
	for _, p := range parts {
		if strings.Contains(p, a.anthropicKey) || strings.Contains(p, a.openaiKey) {
			t.Errorf("a seeded file holds a real key")
		}
	}
	if !strings.Contains(parts[3], "moat-ph-") {
		t.Errorf("~/.codex/auth.json does not hold the placeholder: %s", parts[3])
	}
	if !strings.Contains(parts[2], "trusted") {
		t.Errorf("~/.codex/config.toml does not trust the workspace: %s", parts[2])
	}
}

// In the guest, as root: no file and no process holds half of either key.
func (a *agentsEnv) testNowhere(t *testing.T) {
	pat := filepath.Join(a.dir, "halves.pat")
	halves := a.anthropicKey[:len(a.anthropicKey)/2] + "\n" + a.openaiKey[:len(a.openaiKey)/2] + "\n"
	if err := os.WriteFile(pat, []byte(halves), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(pat)
	r := a.run(t, "run", "--", "sh", "-c", fmt.Sprintf(`
sudo -n timeout 60 grep -r -l -a -F -f %[1]s --exclude=halves.pat /etc /home /tmp /root /var /run /usr/local/lib /usr/lib/node_modules 2>/dev/null | sed 's/^/FILE /'
sudo -n grep -l -a -F -f %[1]s /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | sed 's/^/PROC /'
echo done`, shQuote(pat)))
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(l, "FILE ") || strings.HasPrefix(l, "PROC ") {
			t.Errorf("LEAK: half of a key is in the guest: %s", l)
		}
	}
	if !strings.Contains(r.stdout, "done") {
		t.Errorf("the guest's search did not finish:\n%s\n%s", r.stdout, r.stderr)
	}
}
