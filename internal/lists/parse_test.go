package lists

import (
	"fmt"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name        string
		list        string
		block       string // entries, space-separated
		allow       string
		rejected    string // "N:substring of reason" per rejected line, "|"-separated
		unsupported string // line numbers, space-separated
	}{
		{"hosts", "# StevenBlack style\n0.0.0.0 ads.example.com\n127.0.0.1 Track.Example.com pixel.example.com # inline\n:: v6.example.com\n", "ads.example.com track.example.com pixel.example.com v6.example.com", "", "", ""},
		{"hosts with a redirect", "10.0.0.1 intranet.example.com\n", "", "", "", "1"},
		{"hosts with a bad name among good", "0.0.0.0 ok.example.com bad_name!.example.com\n", "ok.example.com", "", "1:not allowed in a name", ""},
		{"domains", "example.net\n*.example.org\r\nMÜNCHEN.example\n\n", "example.net *.example.org xn--mnchen-3ya.example", "", "", ""},
		{"domains refuse addresses, ports and paths", "192.0.2.1\nexample.com:443\nexample.com/ads\n*foo.com\n", "", "", "1:an address|2:has a port|3:has a port|4:wildcard must be a whole first label", ""},
		{"adblock", "[Adblock Plus 2.0]\n! comment\n||ads.example.com^\n@@||ok.example.com^\n||x.example.com^|\n", "ads.example.com *.ads.example.com x.example.com *.x.example.com", "ok.example.com *.ok.example.com", "", ""},
		{"adblock unsupported", "||ads.example.com^$third-party\n||example.com/ads/*\nexample.com##.banner\n/ads[0-9]+/\n|https://example.com/\n||example.com\n||example.com^/path\n", "", "", "", "1 2 3 4 5 6 7"},
		{"adblock malformed", "||^\n@@||exa mple.com^\n||-x!.com^\n", "", "", "1:no name|2:white space|3:not allowed", ""},
		{"junk", "this is not a list\n0.0.0.0\n", "", "", "1:neither|2:an address", ""},
		{"duplicates once", "0.0.0.0 a.example\n:: a.example\na.example\n", "a.example", "", "", ""},
		{"mixed formats", "0.0.0.0 h.example\nd.example\n||a.example^\n", "h.example d.example a.example *.a.example", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Parse([]byte(tt.list))
			if got := strings.Join(p.Block, " "); got != tt.block {
				t.Errorf("block: got %q, want %q", got, tt.block)
			}
			if got := strings.Join(p.Allow, " "); got != tt.allow {
				t.Errorf("allow: got %q, want %q", got, tt.allow)
			}
			var want []string
			if tt.rejected != "" {
				want = strings.Split(tt.rejected, "|")
			}
			if len(p.Rejected) != len(want) || p.RejectedCount != len(want) {
				t.Fatalf("rejected: got %v (count %d), want %v", p.Rejected, p.RejectedCount, want)
			}
			for i, w := range want {
				n, sub, _ := strings.Cut(w, ":")
				if got := p.Rejected[i]; fmt.Sprint(got.Number) != n || !strings.Contains(got.Reason, sub) {
					t.Errorf("rejected[%d]: got %v, want line %s with %q", i, got, n, sub)
				}
			}
			var lines []string
			for _, u := range p.Unsupported {
				lines = append(lines, fmt.Sprint(u.Number))
			}
			if got := strings.Join(lines, " "); got != tt.unsupported {
				t.Errorf("unsupported lines: got %q, want %q", got, tt.unsupported)
			}
			// Never silently dropped: every line that is not blank or a
			// comment gave entries, or was counted.
			if p.UnsupportedCount != len(p.Unsupported) {
				t.Errorf("unsupported count %d, kept %d", p.UnsupportedCount, len(p.Unsupported))
			}
		})
	}
}

// TestParseAccountsForEveryLine checks, over every test list, that each
// line is blank, a comment, gave a rule, or was reported.
func TestParseAccountsForEveryLine(t *testing.T) {
	list := "# c\n\n0.0.0.0 a.example\nb.example\n||c.example^\n||d.example^$x\nnonsense here\n"
	p := Parse([]byte(list))
	got := p.Formats[FormatHosts] + p.Formats[FormatDomains] + p.Formats[FormatAdblock] + p.RejectedCount + p.UnsupportedCount
	if want := 5; got != want || p.Lines != 7 {
		t.Fatalf("accounted %d lines of %d, want %d: %+v", got, p.Lines, want, p)
	}
}

func TestParseKeepsAtMostMaxKept(t *testing.T) {
	p := Parse([]byte(strings.Repeat("not a name!\n", MaxKept+5)))
	if p.RejectedCount != MaxKept+5 || len(p.Rejected) != MaxKept {
		t.Fatalf("count %d kept %d", p.RejectedCount, len(p.Rejected))
	}
	if p.Rejected[MaxKept-1].Number != MaxKept {
		t.Fatalf("line numbers: %v", p.Rejected[MaxKept-1])
	}
}

func TestParseLongLine(t *testing.T) {
	p := Parse([]byte("a.example\n" + strings.Repeat("x", maxLine+1) + "\nb.example"))
	if p.RejectedCount != 1 || p.Rejected[0].Number != 2 || strings.Join(p.Block, " ") != "a.example b.example" {
		t.Fatalf("%+v", p)
	}
}
