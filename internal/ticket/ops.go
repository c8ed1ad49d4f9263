package ticket

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Open makes t's worktrees of the repositories named in names (paths
// maps each name to its main repository), creating the ticket when it is
// new. A repository the ticket already has is left as it is. progress
// receives git's progress and warnings.
func (s Store) Open(name string, names []string, paths map[string]string, progress io.Writer) (*Ticket, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	t, err := s.Load(name)
	if errors.Is(err, ErrNoTicket) {
		t, err = &Ticket{Schema: Schema, Name: name, Created: time.Now().UTC()}, nil
	}
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if t.Worktree(n) != nil {
			continue
		}
		w, err := s.newWorktree(t, n, paths[n], name, progress)
		if err != nil {
			return nil, err
		}
		t.Worktrees = append(t.Worktrees, w)
		if err := s.Save(t); err != nil {
			return nil, err
		}
	}
	if len(t.Worktrees) == 0 {
		return nil, fmt.Errorf("ticket %s has no repositories", name)
	}
	return t, s.Save(t)
}

// newWorktree makes the worktree of the repository at main for ticket t
// on branch, from the freshly fetched default branch.
func (s Store) newWorktree(t *Ticket, repoName, main, branch string, progress io.Writer) (*Worktree, error) {
	h := hostFor(main, progress)
	r, err := inspect(h)
	if err != nil {
		return nil, err
	}
	h.dir = r.top
	if err := fetch(h, r.remote); err != nil {
		// Offline, the branch starts from the default branch as last
		// fetched: work can begin; moat pr fetches again.
		fmt.Fprintf(progress, "moat: %v; starting %s from what was fetched before\n", err, repoName)
	}
	base, start, err := defaultBranch(h, r.remote)
	if err != nil {
		return nil, err
	}
	w := &Worktree{Repo: repoName, Main: r.top, Common: r.common, Path: filepath.Join(s.Workspace(t.Name), repoName),
		Branch: branch, Base: base, Remote: r.remote}
	if _, err := os.Lstat(w.Path); err == nil {
		return nil, fmt.Errorf("%s already exists but ticket %s has no record of it; move it away, then run the command again", w.Path, t.Name)
	}
	from := start
	if h.refExists("refs/heads/" + branch) {
		from = "refs/heads/" + branch
	}
	if w.Start, err = h.git("merge-base", from, start); err != nil {
		return nil, err
	}
	if err := addWorktree(h, w, start); err != nil {
		return nil, err
	}
	return w, nil
}

// Add gives ticket t a worktree of the repository at main: on branch t's
// name, or, when that branch was merged upstream, on the first of
// NAME-2, NAME-3, … that does not exist yet, from the fresh default
// branch. A repository whose worktree's branch was merged has that
// worktree replaced (refused while it has uncommitted changes). It
// returns the branch.
func (s Store) Add(t *Ticket, repoName, main string, progress io.Writer) (string, error) {
	h := hostFor(main, progress)
	r, err := inspect(h)
	if err != nil {
		return "", err
	}
	h.dir = r.top
	if err := fetch(h, r.remote); err != nil {
		return "", err
	}
	replace := false
	if old := t.Worktree(repoName); old != nil {
		merged, err := isMerged(h, old.Branch, old.Start, old.baseRef(), old.Remote)
		if err != nil {
			return "", err
		}
		if !merged {
			return "", fmt.Errorf("ticket %s already has %s on branch %s, not merged yet, at %s", t.Name, repoName, old.Branch, old.Path)
		}
		if d, err := old.Dirty(); err != nil {
			return "", err
		} else if len(d) > 0 {
			return "", fmt.Errorf("%s's branch %s was merged, but its worktree has uncommitted changes (%d files); commit or discard them, then run the command again", repoName, old.Branch, len(d))
		}
		if err := removeWorktree(h, old); err != nil {
			return "", err
		}
		t.Worktrees = without(t.Worktrees, old)
		if err := s.Save(t); err != nil {
			return "", err
		}
		replace = true
	}
	branch, err := nextBranch(h, t.Name, r.remote, replace)
	if err != nil {
		return "", err
	}
	w, err := s.newWorktree(t, repoName, main, branch, progress)
	if err != nil {
		return "", err
	}
	t.Worktrees = append(t.Worktrees, w)
	return branch, s.Save(t)
}

func without(ws []*Worktree, w *Worktree) []*Worktree {
	var out []*Worktree
	for _, x := range ws {
		if x != w {
			out = append(out, x)
		}
	}
	return out
}

// nextBranch is name, unless a branch called name was merged (known, or
// found by isMerged): then the first of name-2, name-3, … that exists
// neither here nor on the remote.
func nextBranch(h host, name, remote string, merged bool) (string, error) {
	if !merged && !h.refExists("refs/heads/"+name) {
		return name, nil
	}
	if !merged {
		_, start, err := defaultBranch(h, remote)
		if err != nil {
			return "", err
		}
		if merged, err = isMerged(h, name, "", start, remote); err != nil {
			return "", err
		}
		if !merged {
			return name, nil
		}
	}
	for i := 2; i < 100; i++ {
		b := name + "-" + strconv.Itoa(i)
		if !h.refExists("refs/heads/"+b) && (remote == "" || !h.refExists("refs/remotes/"+remote+"/"+b)) {
			return b, nil
		}
	}
	return "", fmt.Errorf("branches %s-2 to %s-99 all exist in %s; delete the merged ones", name, name, h.dir)
}

// isMerged reports whether branch was merged upstream: its tip moved past
// start and is now part of the default branch (a merge or a
// fast-forward), or gh knows a merged pull request from it (a squash or a
// rebase, which leave the tip out of the default branch). With start
// unknown (""), only a branch that was pushed counts as moved: a branch
// that never left its start is trivially part of the default branch.
func isMerged(h host, branch, start, baseRef, remote string) (bool, error) {
	tip, err := h.git("rev-parse", "--verify", "--quiet", "refs/heads/"+branch)
	if err != nil {
		return false, nil
	}
	moved := tip != start
	if start == "" {
		moved = remote != "" && h.refExists("refs/remotes/"+remote+"/"+branch)
	}
	if moved {
		_, err := h.git("merge-base", "--is-ancestor", tip, baseRef)
		switch {
		case err == nil:
			return true, nil
		case !exitedWith(err, 1):
			return false, err
		}
	}
	if remote == "" {
		return false, nil
	}
	prs, err := listPRs(h, branch, "merged")
	if err != nil {
		// Without gh, a squash merge goes unseen; a merge was already
		// checked above.
		fmt.Fprintf(progressOf(h), "moat: not asking gh whether %s was merged: %v\n", branch, err)
		return false, nil
	}
	return len(prs) > 0, nil
}

func progressOf(h host) io.Writer {
	if h.progress == nil {
		return io.Discard
	}
	return h.progress
}

// Rebase fetches each of t's worktrees' remotes (or only repo's) and
// rebases the ticket's branch onto the fresh default branch, on the host.
// A worktree with uncommitted changes is refused; a conflict aborts the
// rebase, leaving the worktree as it was, and is reported.
func (s Store) Rebase(t *Ticket, repo string, progress io.Writer) error {
	ws := t.Worktrees
	if repo != "" {
		w := t.Worktree(repo)
		if w == nil {
			return fmt.Errorf("ticket %s has no repository %q; see: moat worktree list", t.Name, repo)
		}
		ws = []*Worktree{w}
	}
	var errs []error
	for _, w := range ws {
		if err := w.rebase(progress); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(progress, "moat: rebased %s (%s) onto %s\n", w.Repo, w.Branch, w.baseName())
	}
	return errors.Join(errs...)
}

func (w *Worktree) baseName() string {
	if w.Remote != "" {
		return w.Remote + "/" + w.Base
	}
	return w.Base
}

func (w *Worktree) rebase(progress io.Writer) error {
	h := hostFor(w.Main, progress)
	if err := fetch(h, w.Remote); err != nil {
		return err
	}
	d, err := w.Dirty()
	if err != nil {
		return err
	}
	if len(d) > 0 {
		return fmt.Errorf("%s has uncommitted changes (%d files); commit them in the sandbox, then rebase", w.Repo, len(d))
	}
	if _, err := w.gitWT(hostFor(w.Main, nil), "rebase", "--quiet", w.baseRef()); err != nil {
		_, _ = w.gitWT(hostFor(w.Main, nil), "rebase", "--abort")
		return fmt.Errorf("rebasing %s onto %s stopped at a conflict and was undone; resolve it in the sandbox: git rebase %s (%v)", w.Repo, w.baseName(), w.baseName(), err)
	}
	return nil
}

// Problem is a worktree that destroying the ticket would lose work from.
type Problem struct {
	Repo     string
	Path     string
	Dirty    []string // git status --porcelain lines
	Unpushed int      // commits the remote does not have
	Err      error    // git could not tell
}

func (p Problem) String() string {
	s := p.Repo + " (" + p.Path + "):"
	if p.Err != nil {
		return s + " " + p.Err.Error()
	}
	if len(p.Dirty) > 0 {
		s += fmt.Sprintf(" %d uncommitted changes", len(p.Dirty))
	}
	if p.Unpushed > 0 {
		if len(p.Dirty) > 0 {
			s += ","
		}
		s += fmt.Sprintf(" %d unpushed commits", p.Unpushed)
	}
	return s
}

// Problems lists t's worktrees with uncommitted changes or commits their
// remote does not have. A worktree git cannot read counts as a problem:
// fail closed.
func (t *Ticket) Problems() []Problem {
	var out []Problem
	for _, w := range t.Worktrees {
		p := Problem{Repo: w.Repo, Path: w.Path}
		if _, err := os.Stat(w.Path); err != nil {
			continue // gone already: nothing of it to lose here
		}
		if p.Dirty, p.Err = w.Dirty(); p.Err == nil {
			p.Unpushed, p.Err = w.Unpushed()
		}
		if p.Err != nil || len(p.Dirty) > 0 || p.Unpushed > 0 {
			out = append(out, p)
		}
	}
	return out
}

// Remove removes t's worktrees (git worktree remove, then prune), its
// workspace and its record. The branches and their commits stay in the
// main repositories.
func (s Store) Remove(t *Ticket, progress io.Writer) error {
	for _, w := range t.Worktrees {
		if err := removeWorktree(hostFor(w.Main, progress), w); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(s.Workspace(t.Name)); err != nil {
		return fmt.Errorf("removing %s: %w", s.Workspace(t.Name), err)
	}
	if err := os.RemoveAll(s.dir(t.Name)); err != nil {
		return fmt.Errorf("removing ticket %s's state: %w", t.Name, err)
	}
	return nil
}
