package config

import (
	"errors"
	"strings"
	"testing"
)

func TestValidName(t *testing.T) {
	good := []string{"a", "0", "api", "my-api-2", "a-", strings.Repeat("a", 39), "9lives"}
	for _, n := range good {
		if err := ValidName(n); err != nil {
			t.Errorf("ValidName(%q) = %v, want nil", n, err)
		}
	}
	bad := []struct{ name, want string }{
		{"", `sandbox name is empty; use lower-case letters, digits and "-", e.g. "api"`},
		{"API", `sandbox name "API" contains 'A'; use lower-case letters, digits and "-", e.g. "api"`},
		{"my_api", `sandbox name "my_api" contains '_'; use lower-case letters, digits and "-", e.g. "my-api"`},
		{"-api", `sandbox name "-api" starts with "-"; start with a letter or digit, e.g. "api"`},
		{"a b", `contains ' '`},
		{"a.b", `contains '.'`},
		{"café", `contains 'é'`},
		{strings.Repeat("a", 40), `is 40 characters long; the limit is 39, e.g. "` + strings.Repeat("a", 39) + `"`},
		{"___", `contains '_'`},
	}
	for _, tt := range bad {
		err := ValidName(tt.name)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ValidName(%q) = %v, want error containing %q", tt.name, err, tt.want)
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidName(%q): errors.Is(ErrInvalid) = false", tt.name)
		}
		if strings.Contains(err.Error(), `e.g. ""`) {
			t.Errorf("ValidName(%q) suggests an empty name: %v", tt.name, err)
		}
	}
}

func TestExpandEnv(t *testing.T) {
	vars := map[string]string{"HOME": "/home/u", "EMPTY": "", "A": "1"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	tests := []struct {
		in, want, wantErr string
	}{
		{"literal", "literal", ""},
		{"", "", ""},
		{"${HOME}/x", "/home/u/x", ""},
		{"${A}${A}", "11", ""},
		{"${UNSET}", "", ""},
		{"${UNSET:-dev}", "dev", ""},
		{"${EMPTY:-dev}", "dev", ""},
		{"${A:-dev}", "1", ""},
		{"${A:-}", "1", ""},
		{"${A:?need A}", "1", ""},
		{"pa$word", "pa$word", ""},
		{"$HOME", "$HOME", ""},
		{"cost $", "cost $", ""},
		{"$${HOME}", "${HOME}", ""},
		{"$$$$", "$$", ""},
		{"${UNSET:?set UNSET on the host}", "", "UNSET: set UNSET on the host"},
		{"${EMPTY:?}", "", "EMPTY: EMPTY is not set"},
		{"${HOME", "", `"${HOME" has an unclosed ${`},
		{"${}", "", `"" is not a variable name`},
		{"${1A}", "", `"1A" is not a variable name`},
		{"${A-x}", "", `"A-x" is not a variable name`},
		{"${A:=x}", "", `unknown operator ":="`},
		{"${A:}", "", `unknown operator ":"`},
	}
	for _, tt := range tests {
		got, err := ExpandEnv(tt.in, lookup)
		switch {
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("ExpandEnv(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ExpandEnv(%q) = %q, %v; want error containing %q", tt.in, got, err, tt.wantErr)
		}
	}
}
