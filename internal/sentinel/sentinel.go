// Package sentinel watches the files in a workspace that the host runs
// without asking: git hooks and git's own configuration (core.hooksPath,
// core.fsmonitor, aliases and filters all run programs), editor task and
// settings files, direnv's .envrc, devcontainer definitions. The guest may
// write all of them (the workspace is shared read-write so the agent can
// work), and the next `git commit` or editor start on the host would run
// what it wrote, outside the sandbox (threat model 32).
//
// moat cannot forbid those writes without breaking ordinary work (an agent
// that installs a pre-commit hook is doing its job), so it records what
// these files were when the sandbox was created and flags every change in
// `moat status` until the user has looked and accepted it.
//
// Everything here is a pure function of the files; the baseline lives in
// the sandbox's state directory, outside the guest's reach.
package sentinel

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Watched are the workspace-relative paths watched: a path ending in "/"
// stands for every file below that directory.
var Watched = []string{
	".git/hooks/",
	".git/config",
	".git/info/attributes",
	".gitattributes",
	".gitmodules",
	".husky/",
	".pre-commit-config.yaml",
	".vscode/",
	".idea/",
	".devcontainer/",
	".envrc",
	".tool-versions",
}

// maxFiles and maxBytes bound one scan: a watched directory stuffed with
// files by the guest must not make `moat status` slow or the baseline big.
const (
	maxFiles = 2000
	maxBytes = 64 << 20
)

// Snapshot is what the watched files were: path → SHA-256, hex; a symlink
// is recorded as "link:" and its target, not followed.
type Snapshot map[string]string

// Take reads the watched files under root.
func Take(root string) (Snapshot, error) {
	s := Snapshot{}
	var files int
	var bytes int64
	add := func(rel string) error {
		p := filepath.Join(root, rel)
		st, err := os.Lstat(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if files++; files > maxFiles {
			return errTooMany
		}
		switch {
		case st.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			s[rel] = "link:" + t
		case st.Mode().IsRegular():
			if bytes += st.Size(); bytes > maxBytes {
				return errTooMany
			}
			h, err := hashFile(p)
			if err != nil {
				return err
			}
			// The executable bit matters: git runs only executable hooks.
			if st.Mode()&0o111 != 0 {
				h = "x:" + h
			}
			s[rel] = h
		}
		return nil
	}
	for _, w := range Watched {
		if !strings.HasSuffix(w, "/") {
			if err := add(w); err != nil {
				return nil, err
			}
			continue
		}
		dir := filepath.Join(root, w)
		if st, err := os.Lstat(dir); err != nil || !st.IsDir() {
			if err == nil {
				// The directory itself replaced by a file or a link.
				if err := add(strings.TrimSuffix(w, "/")); err != nil {
					return nil, err
				}
			}
			continue
		}
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				return nil
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			return add(rel)
		})
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

var errTooMany = errors.New("too many or too large watched files (more than 2000 files or 64 MiB under .git/hooks, .vscode, ...)")

func hashFile(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Change is one watched file that differs from the baseline.
type Change struct {
	Path string `json:"path"`
	What string `json:"what"` // added | changed | removed
}

// Diff lists what changed from old to cur, by path.
func Diff(old, cur Snapshot) []Change {
	var out []Change
	for p, h := range cur {
		o, ok := old[p]
		switch {
		case !ok:
			out = append(out, Change{p, "added"})
		case o != h:
			out = append(out, Change{p, "changed"})
		}
	}
	for p := range old {
		if _, ok := cur[p]; !ok {
			out = append(out, Change{p, "removed"})
		}
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// File is the baseline's name in the sandbox's state directory.
const File = "sentinel.json"

// Save writes the baseline with write (an atomic writer).
func Save(s Snapshot, write func([]byte) error) error {
	b, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return err
	}
	return write(b)
}

// Load reads a baseline; ok is false when there is none yet.
func Load(path string) (s Snapshot, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, false, err
	}
	return s, true, nil
}
