package cli

import (
	"regexp"
	"strings"
	"testing"
)

// tagOK accepts exactly what the pattern it replaces accepted.
func TestTagOKMatchesItsPattern(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	cases := []string{"", "a", "Z", "9", ".", ".a", "_a", "-a", "a.", "v1.2_rc-3", "a b", "a/b", "ä", "a\n",
		strings.Repeat("a", 64), strings.Repeat("a", 65), "a" + strings.Repeat(".", 63), "a" + strings.Repeat(".", 64)}
	for _, c := range cases {
		if got, want := tagOK(c), re.MatchString(c); got != want {
			t.Errorf("tagOK(%q) = %v, the pattern says %v", c, got, want)
		}
	}
}
