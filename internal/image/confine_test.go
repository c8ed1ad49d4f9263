package image

import (
	"errors"
	"path"
	"strings"
	"testing"
)

func TestConfinePath(t *testing.T) {
	tests := []struct {
		name string
		want string // "!" means refused
	}{
		{"etc/passwd", "etc/passwd"},
		{"./etc/passwd", "etc/passwd"},
		{"/etc/passwd", "etc/passwd"},
		{"//etc//passwd/", "etc/passwd"},
		{"./", ""},
		{"/", ""},
		{"", ""},
		{"a/../b", "b"},
		{"a/b/../../c", "c"},
		{"a/./b/.", "a/b"},
		{"..", "!"},
		{"../x", "!"},
		{"/../x", "!"},
		{"/abs/../../x", "!"},
		{"a/../../x", "!"},
		{"a/b/../../../x", "!"},
		{"..a/b..", "..a/b.."},
		{"...", "..."},
		{".wh..wh..opq", ".wh..wh..opq"},
		{"a\x00b", "!"},
	}
	for _, tt := range tests {
		got, err := confinePath(tt.name)
		if tt.want == "!" {
			if !errors.Is(err, ErrUnsafeArchive) {
				t.Errorf("confinePath(%q) = %q, %v; want ErrUnsafeArchive", tt.name, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("confinePath(%q) = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

// FuzzConfinePath checks the invariants the extractor relies on: an accepted name is relative,
// clean, free of "." and ".." components, and joining it to a root never leaves the root.
func FuzzConfinePath(f *testing.F) {
	for _, s := range []string{"etc/passwd", "../x", "/abs/../../x", "a/../b", "./", "a//b/./c/..", "..a", "\x00", "/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := confinePath(name)
		if err != nil {
			if !errors.Is(err, ErrUnsafeArchive) {
				t.Fatalf("confinePath(%q) error %v does not wrap ErrUnsafeArchive", name, err)
			}
			return
		}
		if got == "" {
			return
		}
		if strings.HasPrefix(got, "/") || strings.ContainsRune(got, 0) {
			t.Fatalf("confinePath(%q) = %q: absolute or holds NUL", name, got)
		}
		if path.Clean(got) != got {
			t.Fatalf("confinePath(%q) = %q: not clean", name, got)
		}
		for _, c := range strings.Split(got, "/") {
			if c == "" || c == "." || c == ".." {
				t.Fatalf("confinePath(%q) = %q: component %q", name, got, c)
			}
		}
		const root = "/layer/root"
		if j := path.Join(root, got); !strings.HasPrefix(j, root+"/") {
			t.Fatalf("confinePath(%q) = %q joins to %q, outside %s", name, got, j, root)
		}
		// Idempotent: a confined path confines to itself.
		if again, err := confinePath(got); err != nil || again != got {
			t.Fatalf("confinePath(%q) = %q, %v; want it unchanged", got, again, err)
		}
	})
}
