package preset

import (
	"slices"
	"strings"
	"testing"

	"moat.dev/moat/internal/policy"
)

func TestLookup(t *testing.T) {
	for _, name := range Names() {
		p, err := Lookup(name)
		if err != nil || p.Name != name {
			t.Fatalf("Lookup(%q) = %v, %v", name, p, err)
		}
	}
	_, err := Lookup("make")
	if err == nil || !strings.Contains(err.Error(), "moat run -- make") {
		t.Fatalf("Lookup(make) error = %v, want one that shows moat run -- make", err)
	}
}

func TestArgv(t *testing.T) {
	claude, _ := Lookup("claude")
	shell, _ := Lookup("shell")
	tests := []struct {
		p     *Preset
		extra []string
		want  []string
	}{
		{claude, nil, []string{"claude", "--dangerously-skip-permissions"}},
		{claude, []string{"--version"}, []string{"claude", "--dangerously-skip-permissions", "--version"}},
		{shell, nil, nil},
		{shell, []string{"bash", "-c", "true"}, []string{"bash", "-c", "true"}},
	}
	for _, tt := range tests {
		if got := tt.p.Argv(tt.extra); !slices.Equal(got, tt.want) {
			t.Errorf("%s.Argv(%q) = %q, want %q", tt.p.Name, tt.extra, got, tt.want)
		}
	}
	// Argv must not share the preset's backing array.
	a := claude.Argv([]string{"x"})
	a[0] = "changed"
	if claude.Command[0] != "claude" {
		t.Fatal("Argv aliased the preset's command")
	}
}

// Every host and secret host a preset names must be a valid policy entry,
// and every secret's host must be one the preset allows: a secret bound
// to a host the sandbox cannot reach would never be used.
func TestPresetsAreValid(t *testing.T) {
	for _, name := range Names() {
		p, _ := Lookup(name)
		for _, h := range p.Hosts {
			if _, err := policy.ParseEntry(h); err != nil {
				t.Errorf("%s: host %q: %v", name, h, err)
			}
		}
		for _, s := range p.Secrets {
			for _, h := range s.Hosts {
				if !slices.Contains(p.Hosts, h) {
					t.Errorf("%s: secret %s bound to %q, which the preset does not allow", name, s.Env, h)
				}
			}
		}
		if len(p.Command) > 0 && p.MissingHint("sb") == "" {
			t.Errorf("%s: no install hint", name)
		}
	}
}

// Blocks are valid entries on hosts the preset allows (a block elsewhere
// would say nothing the default deny does not), and every alias carries a
// secret the preset has.
func TestBlocksAndAliases(t *testing.T) {
	for _, name := range Names() {
		p, _ := Lookup(name)
		for _, b := range p.Block {
			r, err := policy.ParseEntry(b)
			if err != nil {
				t.Errorf("%s: block %q: %v", name, b, err)
				continue
			}
			host := strings.Fields(b)[len(strings.Fields(b))-1]
			host, _, _ = strings.Cut(host, "/")
			if !slices.Contains(p.Hosts, host) {
				t.Errorf("%s: block %q is on %q, which the preset does not allow", name, b, host)
			}
			if len(r.Methods) == 0 {
				t.Errorf("%s: block %q names no method: it would take the whole host away", name, b)
			}
		}
		for alias, from := range p.Aliases {
			if !slices.ContainsFunc(p.Secrets, func(s Secret) bool { return s.Env == from }) {
				t.Errorf("%s: alias %s carries %s, which is not one of its secrets", name, alias, from)
			}
		}
		if len(p.Command) > 0 && (p.Package == "" || p.Checked == "") {
			t.Errorf("%s: no package or checked version", name)
		}
	}
}
