package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func TestBuiltin(t *testing.T) {
	rules := Builtin()
	if len(rules) != len(builtin) || len(rules) == 0 {
		t.Fatalf("Builtin() has %d rules, want %d", len(rules), len(builtin))
	}
	seen := map[string]bool{}
	for i, r := range rules {
		if r.Action != Allow || r.Layer != LayerNamed || r.Source != "policy default" {
			t.Errorf("rule %d = %+v: want an allow in layer policy from \"policy default\"", i, r)
		}
		if r.Name == "" || r.Entry != r.Name {
			t.Errorf("rule %d = %+v: want a name written in normal form", i, r)
		}
		if seen[r.Name] {
			t.Errorf("%s is listed twice", r.Name)
		}
		seen[r.Name] = true
		if strings.TrimSpace(builtin[i].why) == "" {
			t.Errorf("%s has no reason", r.Name)
		}
	}
	p := Compile(rules)
	for _, name := range []string{"api.anthropic.com", "github.com", "pypi.org", "index.crates.io"} {
		if d := p.Name(name, 443); d.Verdict != Allow {
			t.Errorf("default policy denies %s", name)
		}
	}
	for _, name := range []string{"example.com", "anthropic.com", "x.github.com"} {
		if d := p.Name(name, 443); d.Verdict == Allow {
			t.Errorf("default policy allows %s by %q", name, d.Rule.Entry)
		}
	}
}

// discoveredDomains are the SHA-256 sums of the registrable domains of
// the Go module proxy and checksum database, Debian's mirrors and the
// npm registry. Those are discovered from the host's configuration,
// never built in, and their names appear nowhere in this tree: hence
// the sums.
var discoveredDomains = map[string]bool{
	"66394d5952c288e40ccaec7daa9aa49da941dfd405ca83f9feac5a590539dc59": true,
	"75adac515f0bd3db64beb3cdd657340ff9f5443675a8cea41731a4d5d57d0c45": true,
	"8743857e3ea00fd1c64bbc68b8af241954ad2c285e7a60340eec7ea5dcb200db": true,
	"3ca29e55be4befa48f875d24c27f9bed32fe06588819ed6264084b6670a1ebb0": true,
}

func TestBuiltinLeavesDiscoveredOut(t *testing.T) {
	for _, r := range Builtin() {
		for n := r.Name; ; {
			sum := sha256.Sum256([]byte(n))
			if discoveredDomains[hex.EncodeToString(sum[:])] {
				t.Errorf("%s is built in; it must be discovered (see Discover)", r.Name)
			}
			_, rest, ok := strings.Cut(n, ".")
			if !ok {
				break
			}
			n = rest
		}
	}
}
