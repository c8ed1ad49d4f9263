package config

import (
	"fmt"
	"path/filepath"
)

// workspace checks [workspace] repos: paths relative to the file, each a
// distinct directory with a distinct last element, because that element
// names the repository on the command line (moat work T --repos api) and
// its directory under the ticket's workspace.
func (c *checker) workspace(repos []string) []string {
	var out []string
	seen := map[string]int{} // base name → index
	for i, r := range repos {
		key := fmt.Sprintf("workspace.repos[%d]", i)
		if r == "" {
			c.fail(key, `empty path; write a repository's path, e.g. "../api"`)
			continue
		}
		p, ok := c.hostPath(key, r)
		if !ok {
			continue
		}
		base := filepath.Base(p)
		if base == "/" || base == "." {
			c.fail(key, "%q names no repository; write the path of a repository's directory", r)
			continue
		}
		if j, dup := seen[base]; dup {
			c.fail(key, "%q and workspace.repos[%d] both end in %q, which names the repository; rename one directory or list only one", r, j, base)
			continue
		}
		seen[base] = i
		out = append(out, p)
	}
	return out
}
