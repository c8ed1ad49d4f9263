package audit

import "testing"

// TestLedgerShowsTheAuditsWhy checks that a denial the rule did not
// decide (the rule allowed the name, something else refused) shows the
// same reason in the ledger as in the audit, not the rule alone.
func TestLedgerShowsTheAuditsWhy(t *testing.T) {
	r := Record{Proto: "tcp", Dst: "10.0.0.1:80", Name: "api.example.com", Verdict: Deny,
		Rule: "api.example.com", Layer: "project", Reason: "secrets bound to this host are only sent over TLS"}
	l := NewLedger(10)
	l.Add(r)
	e := l.Entries()[0]
	if got, want := Why(e.Layer, e.Rule, e.Reason), Why(r.Layer, r.Rule, r.Reason); got != want {
		t.Errorf("the ledger's why is %q, the audit's %q", got, want)
	}
	if got, want := Why(r.Layer, r.Rule, r.Reason), "project api.example.com secrets bound to this host are only sent over TLS"; got != want {
		t.Errorf("Why = %q, want %q", got, want)
	}
	if got := Why("", "", "no rule allows it"); got != "no rule allows it" {
		t.Errorf("Why without a rule = %q", got)
	}
}
