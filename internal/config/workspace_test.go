package config

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseWorkspace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "moat.toml")
	f, err := Parse(path, []byte("[workspace]\nrepos = [\"../api\", \"web\", \"/src/docs\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(filepath.Dir(dir), "api"), filepath.Join(dir, "web"), "/src/docs"}
	if !slices.Equal(f.Workspace, want) {
		t.Errorf("got %q, want %q", f.Workspace, want)
	}
}

func TestParseWorkspaceErrors(t *testing.T) {
	for _, tc := range []struct {
		doc, want string
	}{
		{"[workspace]\nrepos = [\"../a/api\", \"../b/api\"]\n", `moat.toml:2:22: workspace.repos[1]: "../b/api" and workspace.repos[0] both end in "api"`},
		{"[workspace]\nrepos = [\"\"]\n", "moat.toml:2:10: workspace.repos[0]: empty path"},
		{"[workspace]\nrepos = \"../api\"\n", "moat.toml:2"},
		{"[workspace]\nrepo = [\"../api\"]\n", "moat.toml:2"},
	} {
		_, err := Parse("moat.toml", []byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.doc, err, tc.want)
		}
	}
}
