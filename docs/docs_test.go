// Package docs holds moat's documentation. Its test keeps the README short
// and every relative link in the README and the docs pointing at a file
// that exists, so that moving a page cannot leave a dead link behind.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxReadmeLines: the README is what a new user reads first, in a few
// minutes; details belong here, in docs/.
const maxReadmeLines = 300

func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > maxReadmeLines {
		t.Errorf("README.md has %d lines, more than %d: move details to docs/", n, maxReadmeLines)
	}
}

var link = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)

func TestRelativeLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../README.md")
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(p), target)); err != nil {
				t.Errorf("%s links to %s, which does not exist", p, target)
			}
		}
	}
}
