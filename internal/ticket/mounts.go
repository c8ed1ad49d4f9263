package ticket

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Mount is one host path the ticket's sandbox mounts at the same path in
// the guest, so that the absolute paths in a worktree's .git file and in
// its admin directory mean the same thing on both sides.
type Mount struct {
	Path string
	RW   bool
}

// Mounts are the parts of each main repository's .git that t's worktrees
// need, in mount order: a read-only mount comes after the read-write
// directory it covers. Everything read-write here is data git reads
// (objects, refs, reflogs, the worktree's HEAD and index); everything the
// host's git would run or obey is read-only:
//
//	read-write  .git/objects, .git/refs, .git/logs, .git/worktrees/ID
//	read-only   .git/config, .git/hooks, .git/info, .git/HEAD, .git/packed-refs,
//	            .git/objects/info (alternates), and in worktrees/ID:
//	            commondir, gitdir, config.worktree
//
// A read-only path that does not exist is made first (an empty
// config.worktree, objects/info), so that the guest cannot create it
// through the read-write directory around it. Where that fails the
// sandbox does not start: fail closed.
func (t *Ticket) Mounts() ([]Mount, error) {
	var out []Mount
	seen := map[string]bool{}
	add := func(p string, rw bool) {
		if !seen[p] {
			seen[p] = true
			out = append(out, Mount{Path: p, RW: rw})
		}
	}
	for _, w := range t.Worktrees {
		if err := w.prepare(); err != nil {
			return nil, err
		}
		c := w.Common
		for _, d := range []string{"objects", "refs", "logs"} {
			add(filepath.Join(c, d), true)
		}
		add(w.Admin, true)
		for _, p := range []string{"config", "HEAD", "hooks", "info", "packed-refs", "objects/info"} {
			if exists(filepath.Join(c, p)) {
				add(filepath.Join(c, p), false)
			}
		}
		for _, p := range []string{"commondir", "gitdir", "config.worktree"} {
			add(filepath.Join(w.Admin, p), false)
		}
	}
	return out, nil
}

// prepare makes what Mounts needs to exist, owned like the directory it
// is in.
func (w *Worktree) prepare() error {
	name := filepath.Base(filepath.Dir(w.Path))
	for _, d := range []string{w.Common, w.Admin} {
		st, err := os.Stat(d)
		if err != nil || !st.IsDir() {
			return fmt.Errorf("the worktree of %s in ticket %s lost %s; remove the ticket with: moat destroy %s --force", w.Repo, name, d, name)
		}
	}
	for _, d := range []string{filepath.Join(w.Common, "logs"), filepath.Join(w.Common, "objects", "info")} {
		if err := mkdirLike(d); err != nil {
			return err
		}
	}
	for _, f := range []string{"commondir", "gitdir"} {
		if !exists(filepath.Join(w.Admin, f)) {
			return fmt.Errorf("the worktree of %s in ticket %s lost %s; remove the ticket with: moat destroy %s --force", w.Repo, name, filepath.Join(w.Admin, f), name)
		}
	}
	p := filepath.Join(w.Admin, "config.worktree")
	if exists(p) {
		return nil
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("creating %s: %w", p, err)
	}
	f.Close()
	return chownLike(p)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func mkdirLike(d string) error {
	if err := os.Mkdir(d, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		return fmt.Errorf("creating %s: %w", d, err)
	}
	return chownLike(d)
}

// chownLike gives p the owner of its directory: moat makes these as root
// in the user's repository.
func chownLike(p string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Dir(p), &st); err != nil {
		return fmt.Errorf("reading %s: %w", filepath.Dir(p), err)
	}
	if os.Geteuid() != 0 {
		return nil
	}
	if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("giving %s its directory's owner: %w", p, err)
	}
	return nil
}
