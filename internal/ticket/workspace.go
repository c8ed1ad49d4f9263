package ticket

import (
	"fmt"
	"path/filepath"
	"strings"

	"moat.dev/moat/internal/config"
)

// Repos is a workspace's repositories, by name.
type Repos struct {
	Source string            // the file that listed them
	Paths  map[string]string // name → the repository's directory
	Order  []string          // names, as the file lists them
}

// FindRepos reads the workspace's [workspace] repos: from the nearest
// moat.toml at or above dir that has the section, else from the user's
// config.toml. The nearest file wins whole; lists are not merged, because
// a workspace is one set of repositories.
func FindRepos(dir, userConfig string) (*Repos, error) {
	for d := dir; ; d = filepath.Dir(d) {
		f, err := config.LoadOptional(filepath.Join(d, "moat.toml"))
		if err != nil {
			return nil, err
		}
		if f != nil && len(f.Workspace) > 0 {
			return reposOf(f), nil
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	f, err := config.LoadOptional(userConfig)
	if err != nil {
		return nil, err
	}
	if f == nil || len(f.Workspace) == 0 {
		return nil, fmt.Errorf("no [workspace] lists the repositories of a ticket: in a moat.toml at or above %s, or in %s, write:\n\n"+
			"    [workspace]\n    repos = [\"../api\", \"../web\"]   # relative to the file", dir, userConfig)
	}
	return reposOf(f), nil
}

func reposOf(f *config.File) *Repos {
	r := &Repos{Source: f.Path, Paths: map[string]string{}}
	for _, p := range f.Workspace {
		n := filepath.Base(p)
		r.Paths[n] = p
		r.Order = append(r.Order, n)
	}
	return r
}

// Select is the repositories named in list (--repos a,b), or all of them.
func (r *Repos) Select(list []string) ([]string, error) {
	if len(list) == 0 {
		return r.Order, nil
	}
	var out []string
	for _, n := range list {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if _, ok := r.Paths[n]; !ok {
			return nil, fmt.Errorf("no repository %q in the workspace of %s; it lists: %s", n, r.Source, strings.Join(r.Order, ", "))
		}
		if !contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--repos names no repository; the workspace of %s lists: %s", r.Source, strings.Join(r.Order, ", "))
	}
	return out, nil
}
