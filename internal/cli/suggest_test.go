package cli

import (
	"strings"
	"testing"

	"moat.dev/moat/internal/audit"
)

func TestSuggest(t *testing.T) {
	rec := func(proto, verdict, dst, name, reason string) audit.Record {
		return audit.Record{Proto: proto, Verdict: audit.Verdict(verdict), Dst: dst, Name: name, Reason: audit.Reason(reason)}
	}
	const none = "no rule allows it"
	recs := []audit.Record{
		rec("tcp", "would_deny", "198.18.0.4:443", "api.example.com", none),
		rec("tcp", "would_deny", "198.18.0.4:443", "api.example.com", none),
		rec("http", "would_deny", "198.18.0.4:443", "api.example.com", none),
		rec("tcp", "deny", "198.18.0.5:80", "cdn.example.com", none),
		rec("tcp", "deny", "198.18.0.6:22", "git.example.co.uk", "held for a watcher, no answer in 30s"),
		rec("tcp", "deny", "203.0.113.9:5432", "", none),
		rec("tcp", "deny", "198.18.0.7:443", "ads.example.net", "blocked by rule"),
		rec("tcp", "deny", "10.0.0.1:80", "", "private address (RFC 1918)"),
		rec("dns", "deny", "gateway:53", "api.example.com", "A: answered from the private pool, not sent upstream"),
		rec("tcp", "allow", "198.18.0.8:443", "ok.example.org", ""),
		{Proto: "http", Verdict: "deny", Dst: "198.18.0.9:443", Name: "github.com", Method: "POST", Path: "/o/r/issues", Reason: none},
		// A request under a name suggested whole needs no rule of its own.
		{Proto: "http", Verdict: "would_deny", Dst: "198.18.0.4:443", Name: "api.example.com", Method: "GET", Path: "/v1/x", Reason: none},
		// A carried connection counts once, by its start; an aggregate as its count.
		{Proto: "tcp", Verdict: "would_deny", Dst: "198.18.0.5:80", Name: "cdn.example.com", Reason: none, Phase: audit.PhaseStart, Flow: "f-1"},
		{Proto: "tcp", Verdict: "would_deny", Dst: "198.18.0.5:80", Name: "cdn.example.com", Reason: none, Phase: audit.PhaseEnd, Flow: "f-1"},
		{Proto: "tcp", Verdict: "deny", Dst: "203.0.113.9:5432", Reason: none, Count: 40},
	}
	recs[6].Rule, recs[6].Layer = "ads.example.net", "user"
	var b strings.Builder
	if err := suggest(recs).write(&b); err != nil {
		t.Fatal(err)
	}
	want := `[network]
allow = [
  # addresses: 41 refused
  "203.0.113.9:5432",
  # example.co.uk: 1 refused
  "git.example.co.uk:22",
  # example.com: 5 refused
  "api.example.com",
  "cdn.example.com",
  # github.com: 1 refused
  "POST github.com/o/r/issues",
]
# Not suggested:
#   10.0.0.1:80: private address (RFC 1918)
#   ads.example.net:443: blocked by user rule "ads.example.net"; remove that block to allow it
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}
