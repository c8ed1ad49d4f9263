package ticket

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// PR is a pull request as `gh pr list --json url,number,state` gives it.
// State is gh's: OPEN, CLOSED or MERGED.
type PR struct {
	URL    string `json:"url"`
	Number int    `json:"number"`
	State  string `json:"state"`
}

// listPRs is gh's pull requests from branch in the repository of h.dir;
// state "" is gh's default (open ones).
func listPRs(h host, branch, state string) ([]PR, error) {
	args := []string{"pr", "list", "--head", branch, "--json", "url,number,state"}
	if state != "" {
		args = append(args, "--state", state)
	}
	out, err := h.run("gh", args...)
	if err != nil {
		return nil, err
	}
	var prs []PR
	if err := json.Unmarshal([]byte(out), &prs); err != nil {
		return nil, fmt.Errorf("reading gh pr list's answer %q: %w", out, err)
	}
	return prs, nil
}

// PRResult is what moat pr did for one repository.
type PRResult struct {
	Repo    string
	Skipped string // why nothing was pushed, or ""
	PR      PR
	Created bool // opened now, not found open already
	Edited  bool // its description was rewritten to link the others
}

// PR pushes each of t's worktrees that has commits past its default
// branch, with the host's git and its credentials, and opens one pull
// request per repository through gh, unless gh already lists an open one
// from the branch. Then each description moat wrote is rewritten, where
// it changed, to link the ticket's other pull requests.
func (s Store) PR(t *Ticket, progress io.Writer) ([]PRResult, error) {
	var res []*PRResult
	for _, w := range t.Worktrees {
		r := &PRResult{Repo: w.Repo}
		res = append(res, r)
		if err := w.pushAndOpen(t, r, progress); err != nil {
			_ = s.Save(t)
			return flat(res), fmt.Errorf("%s: %w", w.Repo, err)
		}
		if err := s.Save(t); err != nil {
			return flat(res), err
		}
	}
	// Second pass: every URL is known now.
	for i, w := range t.Worktrees {
		r := res[i]
		if r.Skipped != "" || w.PRURL != r.PR.URL {
			continue // not a pull request moat opened
		}
		body := prBody(t, w, res)
		if body == w.PRBody {
			continue
		}
		h := hostFor(w.Main, progress)
		if _, err := h.run("gh", "pr", "edit", strconv.Itoa(r.PR.Number), "--body", body); err != nil {
			return flat(res), fmt.Errorf("%s: linking the pull requests: %w", w.Repo, err)
		}
		w.PRBody, r.Edited = body, true
		if err := s.Save(t); err != nil {
			return flat(res), err
		}
	}
	s.dropPRCache(t.Name)
	return flat(res), nil
}

func flat(rs []*PRResult) []PRResult {
	out := make([]PRResult, len(rs))
	for i, r := range rs {
		out[i] = *r
	}
	return out
}

func (w *Worktree) pushAndOpen(t *Ticket, r *PRResult, progress io.Writer) error {
	if w.Remote == "" {
		r.Skipped = "no remote to push to"
		return nil
	}
	h := hostFor(w.Main, progress)
	if err := fetch(h, w.Remote); err != nil {
		return err
	}
	ahead, _, err := w.AheadBehind()
	if err != nil {
		return err
	}
	if ahead == 0 {
		r.Skipped = "no commits past " + w.baseName()
		return nil
	}
	if d, err := w.Dirty(); err == nil && len(d) > 0 {
		fmt.Fprintf(progress, "moat: %s has %d uncommitted changes, which the pull request leaves out\n", w.Repo, len(d))
	}
	if err := w.push(h); err != nil {
		return err
	}
	open, err := listPRs(h, w.Branch, "")
	if err != nil {
		return err
	}
	if len(open) > 0 {
		r.PR = open[0]
		return nil
	}
	subject, err := h.git("log", "--reverse", "--format=%s", w.baseRef()+"..refs/heads/"+w.Branch)
	if err != nil {
		return err
	}
	title, _, _ := strings.Cut(subject, "\n")
	out, err := h.run("gh", "pr", "create", "--head", w.Branch, "--base", w.Base,
		"--title", t.Name+": "+title, "--body", prBody(t, w, nil))
	if err != nil {
		return fmt.Errorf("opening the pull request: %w", err)
	}
	url := lastLine(out)
	n, err := strconv.Atoi(url[strings.LastIndexByte(url, '/')+1:])
	if err != nil || !strings.Contains(url, "://") {
		return fmt.Errorf("gh pr create printed %q, not a pull request's URL", out)
	}
	r.PR, r.Created = PR{URL: url, Number: n, State: "OPEN"}, true
	w.PRURL, w.PRBody = url, prBody(t, w, nil)
	return nil
}

// ErrMoved is a remote branch with commits moat did not push.
var ErrMoved = errors.New("the remote branch has commits moat did not push")

// push pushes w's branch with the main repository's git, config and
// credentials, never through the worktree's .git file, which the guest
// can rewrite. It overwrites the remote branch (a rebase rewrites it)
// only when the remote still has what moat pushed last, or less: commits
// someone else added there (a suggestion accepted on the pull request)
// are refused rather than lost. The lease makes the same check atomic
// with the push.
func (w *Worktree) push(h host) error {
	ref := "refs/heads/" + w.Branch
	remoteRef := "refs/remotes/" + w.Remote + "/" + w.Branch
	seen := ""
	if h.refExists(remoteRef) {
		var err error
		if seen, err = h.git("rev-parse", remoteRef); err != nil {
			return err
		}
	}
	if seen != "" && seen != w.Pushed {
		if _, err := h.git("merge-base", "--is-ancestor", seen, ref); err != nil {
			if !exitedWith(err, 1) {
				return err
			}
			return fmt.Errorf("%w: %s/%s is at %.12s; bring it in, in the sandbox: git merge %s/%s (moat pr fetched it), then run moat pr again",
				ErrMoved, w.Remote, w.Branch, seen, w.Remote, w.Branch)
		}
	}
	if _, err := h.git("push", "--quiet", "--force-with-lease="+ref+":"+seen, w.Remote, ref+":"+ref); err != nil {
		return fmt.Errorf("pushing %s: %w", w.Branch, err)
	}
	tip, err := h.git("rev-parse", ref)
	if err != nil {
		return err
	}
	w.Pushed = tip
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// prBody is the description of w's pull request: the ticket, and the
// ticket's other pull requests among res.
func prBody(t *Ticket, w *Worktree, res []*PRResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Ticket %s.\n", t.Name)
	var others []string
	for _, r := range res {
		if r.Repo != w.Repo && r.Skipped == "" && r.PR.URL != "" {
			others = append(others, fmt.Sprintf("- %s: %s", r.Repo, r.PR.URL))
		}
	}
	if len(others) > 0 {
		b.WriteString("\nThe ticket's other pull requests:\n" + strings.Join(others, "\n") + "\n")
	}
	return b.String()
}

// Status is one repository of a ticket, as moat status shows it.
type Status struct {
	Repo   string `json:"repo"`
	Path   string `json:"path"`
	Branch string `json:"branch"`
	Base   string `json:"base"` // e.g. origin/main
	Ahead  int    `json:"ahead"`
	Behind int    `json:"behind"`
	Dirty  int    `json:"dirty"` // files with uncommitted changes
	PR     *PR    `json:"pr,omitempty"`
	// PRError says why the pull request's state is unknown.
	PRError string `json:"pr_error,omitempty"`
	Err     string `json:"error,omitempty"`
}

// PRCacheFor is how long moat status keeps gh's answers: a person
// running status in a loop asks gh once a minute, not every time.
const PRCacheFor = 60 * time.Second

type prCache struct {
	Fetched time.Time         `json:"fetched"`
	PRs     map[string]*PR    `json:"prs"` // by repo; nil: none
	Errs    map[string]string `json:"errs,omitempty"`
}

// Status is the state of each of t's worktrees: branch, commits ahead of
// and behind the default branch as last fetched, uncommitted files, and
// the branch's latest pull request as gh reports it (cached PRCacheFor).
func (s Store) Status(t *Ticket, now time.Time) []Status {
	cache := s.prs(t, now)
	var out []Status
	for _, w := range t.Worktrees {
		st := Status{Repo: w.Repo, Path: w.Path, Branch: w.Branch, Base: w.baseName()}
		var err error
		if st.Ahead, st.Behind, err = w.AheadBehind(); err == nil {
			var d []string
			d, err = w.Dirty()
			st.Dirty = len(d)
		}
		if err != nil {
			st.Err = err.Error()
		}
		st.PR, st.PRError = cache.PRs[w.Repo], cache.Errs[w.Repo]
		out = append(out, st)
	}
	return out
}

func (s Store) cachePath(name string) string { return filepath.Join(s.dir(name), "prs.json") }

func (s Store) dropPRCache(name string) { _ = os.Remove(s.cachePath(name)) }

// prs is gh's latest pull request of each worktree's branch, from the
// cache while it is younger than PRCacheFor.
func (s Store) prs(t *Ticket, now time.Time) prCache {
	var c prCache
	if b, err := os.ReadFile(s.cachePath(t.Name)); err == nil && json.Unmarshal(b, &c) == nil &&
		now.Sub(c.Fetched) < PRCacheFor && now.Sub(c.Fetched) >= 0 {
		return c
	}
	c = prCache{Fetched: now, PRs: map[string]*PR{}, Errs: map[string]string{}}
	for _, w := range t.Worktrees {
		if w.Remote == "" {
			continue
		}
		prs, err := listPRs(hostFor(w.Main, nil), w.Branch, "all")
		var ce *cmdError
		switch {
		case errors.As(err, &ce):
			c.Errs[w.Repo] = "gh: " + ce.msg
		case err != nil:
			c.Errs[w.Repo] = err.Error()
		case len(prs) > 0:
			c.PRs[w.Repo] = &prs[0]
		}
	}
	if b, err := json.Marshal(c); err == nil {
		tmp := s.cachePath(t.Name) + ".tmp"
		if os.WriteFile(tmp, b, 0o600) == nil {
			_ = os.Rename(tmp, s.cachePath(t.Name))
		}
	}
	return c
}
