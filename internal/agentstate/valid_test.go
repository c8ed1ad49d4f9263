package agentstate

import (
	"regexp"
	"strings"
	"testing"
)

// validSandbox accepts exactly what the pattern it replaces accepted.
func TestValidSandboxMatchesItsPattern(t *testing.T) {
	re := regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	cases := []string{"", "a", "0", "-", "-a", "a-", "api", "my-api-2", "A", "a_b", "a.b", "a b", "ä",
		strings.Repeat("a", 63), strings.Repeat("a", 64), "a" + strings.Repeat("-", 62), "a" + strings.Repeat("-", 63)}
	for _, c := range cases {
		if got, want := validSandbox(c), re.MatchString(c); got != want {
			t.Errorf("validSandbox(%q) = %v, the pattern says %v", c, got, want)
		}
	}
}
