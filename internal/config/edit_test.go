package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAddRules(t *testing.T) {
	tests := []struct {
		name, before, list string
		entries            []string
		after              string // "" means unchanged (nothing added)
		err                string
	}{
		{"no file", "", "allow", []string{"a.example"}, "[network]\nallow = [\"a.example\"]\n", ""},
		{"existing list", "# mine\n[network]\nallow = [\"a.example\"] # keep\n", "allow", []string{"b.example"},
			"# mine\n[network]\nallow = [\"a.example\", \"b.example\"] # keep\n", ""},
		{"list over lines", "[network]\nallow = [\n  \"a.example\",\n  'b.example',\n]\n", "allow", []string{"c.example:22"},
			"[network]\nallow = [\n  \"a.example\",\n  'b.example', \"c.example:22\",\n]\n", ""},
		{"empty list", "[network]\nblock = []\n", "block", []string{"x.example", "*.x.example"},
			"[network]\nblock = [\"x.example\", \"*.x.example\"]\n", ""},
		{"table without the list", "[sandbox]\ncpus = 2\n\n[network]\ninspect = true\n\n[env]\nA = \"b\"\n", "allow", []string{"a.example"},
			"[sandbox]\ncpus = 2\n\n[network]\nallow = [\"a.example\"]\ninspect = true\n\n[env]\nA = \"b\"\n", ""},
		{"no network table", "[sandbox]\ncpus = 2", "allow", []string{"a.example"},
			"[sandbox]\ncpus = 2\n\n[network]\nallow = [\"a.example\"]\n", ""},
		{"dotted keys", "network.inspect = true\n[sandbox]\ncpus = 2\n", "block", []string{"a.example"},
			"network.block = [\"a.example\"]\nnetwork.inspect = true\n[sandbox]\ncpus = 2\n", ""},
		{"already there", "[network]\nallow = [\"A.example\"]\n", "allow", []string{"a.example"}, "", ""},
		{"unicode before", "# é ü ✓\n[network]\nallow = [\"a.example\"]\n", "allow", []string{"b.example"},
			"# é ü ✓\n[network]\nallow = [\"a.example\", \"b.example\"]\n", ""},
		{"inline table", "network = { inspect = true }\n", "allow", []string{"a.example"}, "", "add it there by hand"},
		{"broken file", "[network\n", "allow", []string{"a.example"}, "", "fix the file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "moat.toml")
			if tt.before != "" {
				if err := os.WriteFile(path, []byte(tt.before), 0o640); err != nil {
					t.Fatal(err)
				}
			}
			added, err := AddRules(path, tt.list, tt.entries...)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one with %q", err, tt.err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			want := tt.after
			if want == "" {
				want = tt.before
				if len(added) != 0 {
					t.Errorf("added %q, want nothing", added)
				}
			}
			if string(got) != want {
				t.Errorf("file:\n%s\nwant:\n%s", got, want)
			}
			if tt.before != "" {
				if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
					t.Errorf("mode %v, want 0640", st.Mode().Perm())
				}
			}
		})
	}
}
