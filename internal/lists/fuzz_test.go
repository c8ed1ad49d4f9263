package lists

import (
	"strings"
	"testing"

	"moat.dev/moat/internal/policy"
)

// FuzzParse: a list comes from a third party. Whatever it holds, Parse
// must not panic, every entry it gives must be a plain name rule the
// gate's parser accepts, and every line must be accounted for.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"0.0.0.0 a.example b.example # c\n", "||x.example^\n@@||y.example^\n", "*.z.example\r\n",
		"example.com##.ad\n", "||a^$third-party\n", "/re/\n", "\ufeff# bom\nx.example", "127.0.0.1 localhost\n::1 ip6-localhost\n",
		"||\n@@\n|\n^\n$\n", "0.0.0.0\t\tTAB.example\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p := Parse(data)
		for _, e := range append(append([]string(nil), p.Block...), p.Allow...) {
			r, err := policy.ParseEntry(e)
			if err != nil || r.Name == "" || r.Port != 0 || r.IsRequest() {
				t.Fatalf("entry %q: %v %+v", e, err, r)
			}
		}
		if want := strings.Count(string(data), "\n") + 1; len(data) > 0 && p.Lines != want && !(strings.HasSuffix(string(data), "\n") && p.Lines == want-1) {
			t.Fatalf("lines %d, want %d", p.Lines, want)
		}
		counted := p.Formats[FormatHosts] + p.Formats[FormatDomains] + p.Formats[FormatAdblock] + p.RejectedCount + p.UnsupportedCount
		if counted > p.Lines+p.RejectedCount {
			t.Fatalf("accounted %d of %d lines", counted, p.Lines)
		}
		policy.Compile(p.Rules(policy.LayerNamed, "policy fuzz"))
	})
}
