package e2e

// Report mode and learning to a file: a sandbox in report mode lets
// through what its policy denies and audits it as would_deny; `moat network suggest` turns
// the run into rules that, in enforce mode, let the same run pass.

import (
	"strings"
	"testing"

	"moat.dev/moat/test/inet"
)

const reportIP = "198.51.100.70"

const reportToml = `[network]
use = ["none"]
mode = "report"
allow = ["ok-report.test"]
block = ["blocked-report.test"]
`

// reportRun is the run to learn from: web and non-web ports, names the policy does not know
// and one it allows.
const reportRun = `for u in http://ok-report.test/ http://one-report.test/ http://two.sub-report.test/ http://three-report.test:8080/; do
  curl -s -o /dev/null -w '%{http_code}\n' --max-time 20 "$u"
done`

func TestReportModeAndSuggest(t *testing.T) {
	n := inet.Start(t)
	for _, name := range []string{"ok-report.test", "blocked-report.test", "one-report.test", "two.sub-report.test", "three-report.test", "never-report.test"} {
		n.SetA(name, reportIP)
	}
	n.HTTP(t, reportIP, 80, inet.Echo())
	n.HTTP(t, reportIP, 8080, inet.Echo())

	g := newGateEnv(t, n, "report-e2e", reportToml)
	g.up(t)
	t.Cleanup(func() { moat(t, g.dir, g.env, "destroy", "--yes", g.name) })

	out := g.sh(t, reportRun+"\n"+curlCode("blocked-report.test"))
	if got := strings.Fields(out); strings.Join(got, " ") != "200 200 200 200 200" {
		t.Fatalf("report mode let through %q, want five 200s", got)
	}
	wouldDeny := map[string]bool{}
	for _, r := range g.audit(t) {
		if r.Proto == "tcp" {
			wouldDeny[r.Name] = r.Verdict == "would_deny"
		}
	}
	for name, want := range map[string]bool{"ok-report.test": false, "blocked-report.test": true, "one-report.test": true,
		"two.sub-report.test": true, "three-report.test": true} {
		if got, ok := wouldDeny[name]; !ok || got != want {
			t.Errorf("%s: audited would_deny=%v (recorded: %v), want %v", name, got, ok, want)
		}
	}
	if st := mustMoatEnv(t, g.dir, g.env, "status", "--json"); !strings.Contains(st, `"gate":{"mode":"report"`) {
		t.Errorf("status does not say report mode: %s", st)
	}
	den := mustMoatEnv(t, g.dir, g.env, "network", "denials", g.name)
	for _, name := range []string{"one-report.test", "three-report.test", "blocked-report.test"} {
		if !strings.Contains(den, name) {
			t.Errorf("moat network denials does not show %s:\n%s", name, den)
		}
	}

	sug := mustMoatEnv(t, g.dir, g.env, "network", "suggest", g.name)
	t.Logf("suggested:\n%s", sug)
	for _, want := range []string{`"one-report.test",`, `"two.sub-report.test",`, `"three-report.test:8080",`,
		`blocked-report.test:80: blocked by project rule "blocked-report.test"`} {
		if !strings.Contains(sug, want) {
			t.Errorf("suggestion lacks %s", want)
		}
	}
	if strings.Contains(sug, `"ok-report.test"`) {
		t.Error("suggestion repeats an allowed name")
	}

	// The suggestion, pasted into an enforcing sandbox, lets the same run pass.
	// The project's own allow goes into the suggested list (a second allow key would not
	// parse); mode is left out, so the default, enforce, applies.
	toml := strings.Replace(sug, "allow = [\n", "allow = [\n  \"ok-report.test\",\n", 1)
	toml = strings.Replace(toml, "[network]\n", "[network]\nuse = [\"none\"]\n", 1)
	e := newGateEnv(t, n, "enforce-e2e", toml)
	e.up(t)
	t.Cleanup(func() { moat(t, e.dir, e.env, "destroy", "--yes", e.name) })
	out = e.sh(t, reportRun+"\n"+curlCode("never-report.test"))
	if got := strings.Fields(out); strings.Join(got, " ") != "200 200 200 200 403" {
		t.Fatalf("enforcing the suggestion: %q, want the run's four 200s and a 403 for a name it never used", got)
	}
}
