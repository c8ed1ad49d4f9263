package ticket

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/ticket/tickettest"
)

// fixture is a workspace of two repositories, api and web, each cloned
// from a local bare repository standing in for its remote, with gh
// replaced on PATH by tickettest's stand-in.
type fixture struct {
	ws    string // the workspace root, holding moat.toml
	store Store
	gh    *tickettest.GH
	repos *Repos
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	tickettest.GitEnv(t)
	root := t.TempDir()
	f := &fixture{ws: filepath.Join(root, "ws")}
	for _, n := range []string{"api", "web"} {
		tickettest.Remote(t, root, n)
	}
	if err := os.MkdirAll(f.ws, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(f.ws, "moat.toml"), "[workspace]\nrepos = [\"../api\", \"../web\"]\n")
	f.gh = tickettest.NewGH(t)
	t.Setenv("MOAT_HOME", filepath.Join(root, "home"))
	var err error
	if f.store, err = NewStore(filepath.Join(root, "home", "state")); err != nil {
		t.Fatal(err)
	}
	if f.repos, err = FindRepos(f.ws, filepath.Join(root, "home", "config", "config.toml")); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) open(t *testing.T, name string) *Ticket {
	t.Helper()
	tk, err := f.store.Open(name, f.repos.Order, f.repos.Paths, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return tickettest.Git(t, dir, args...)
}

// commit commits a change in dir as the agent would, inside the worktree.
func commit(t *testing.T, dir, file, msg string) {
	t.Helper()
	write(t, filepath.Join(dir, file), msg+"\n")
	git(t, dir, "add", file)
	git(t, dir, "commit", "-q", "-m", msg)
}

func TestOpen(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	if len(tk.Worktrees) != 2 {
		t.Fatalf("got %d worktrees, want 2", len(tk.Worktrees))
	}
	for _, w := range tk.Worktrees {
		if want := filepath.Join(f.store.Workspace("t1"), w.Repo); w.Path != want {
			t.Errorf("%s: worktree at %s, want %s", w.Repo, w.Path, want)
		}
		if got := git(t, w.Path, "branch", "--show-current"); got != "t1" {
			t.Errorf("%s: on branch %q, want t1", w.Repo, got)
		}
		if w.Base != "main" || w.Remote != "origin" {
			t.Errorf("%s: base %s/%s, want origin/main", w.Repo, w.Remote, w.Base)
		}
		if got := git(t, w.Path, "rev-parse", "--path-format=absolute", "--git-dir"); got != w.Admin {
			t.Errorf("%s: git dir %s, recorded %s", w.Repo, got, w.Admin)
		}
	}
	// Again: the same ticket, nothing made twice.
	again := f.open(t, "t1")
	if len(again.Worktrees) != 2 || again.Worktrees[0].Admin != tk.Worktrees[0].Admin {
		t.Errorf("opening again changed the ticket: %+v", again.Worktrees)
	}
}

func TestMounts(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	ms, err := tk.Mounts()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for i, m := range ms {
		got[m.Path] = m.RW
		// A read-only mount comes after the read-write one around it.
		for _, later := range ms[i+1:] {
			if m.RW == false && later.RW && strings.HasPrefix(m.Path, later.Path+"/") {
				t.Errorf("%s (read-only) is mounted before %s (read-write) covers it", m.Path, later.Path)
			}
		}
	}
	w := tk.Worktree("api")
	c := w.Common
	for p, rw := range map[string]bool{
		c + "/objects": true, c + "/refs": true, c + "/logs": true, w.Admin: true,
		c + "/config": false, c + "/hooks": false, c + "/info": false, c + "/objects/info": false,
		w.Admin + "/commondir": false, w.Admin + "/gitdir": false, w.Admin + "/config.worktree": false,
	} {
		if g, ok := got[p]; !ok || g != rw {
			t.Errorf("%s: mounted %v, read-write %v; want mounted, read-write %v", p, ok, g, rw)
		}
	}
	for p := range got {
		if !strings.HasPrefix(p, c+"/") && !strings.HasPrefix(p, tk.Worktree("web").Common+"/") {
			t.Errorf("%s is mounted: only parts of the main repositories' .git are", p)
		}
		if filepath.Base(p) == ".git" {
			t.Errorf("all of %s is mounted", p)
		}
	}
	if _, err := os.Stat(w.Admin + "/config.worktree"); err != nil {
		t.Errorf("config.worktree was not made before mounting it read-only: %v", err)
	}
}

func TestPR(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	commit(t, tk.Worktree("api").Path, "api.txt", "add the endpoint")
	commit(t, tk.Worktree("web").Path, "web.txt", "call the endpoint")

	res, err := f.store.PR(tk, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	urls := map[string]string{}
	for _, r := range res {
		if !r.Created || r.Skipped != "" || !r.Edited {
			t.Errorf("%s: %+v, want a pull request created and its description linked", r.Repo, r)
		}
		urls[r.Repo] = r.PR.URL
	}
	if got := f.gh.Calls(t, "pr create"); len(got) != 2 {
		t.Errorf("gh pr create ran %d times, want 2: %q", len(got), got)
	}
	// Each description links the other pull request.
	for repo, other := range map[string]string{"api": "web", "web": "api"} {
		body := f.gh.Body(t, repo, urls[repo])
		if !strings.Contains(body, urls[other]) || strings.Contains(body, urls[repo]) {
			t.Errorf("%s's description %q should link %s's pull request %s and not its own", repo, body, other, urls[other])
		}
	}
	// The branches were pushed by the host.
	for _, r := range []string{"api", "web"} {
		remote := filepath.Join(filepath.Dir(f.ws), r+".git")
		if got, want := git(t, remote, "rev-parse", "refs/heads/t1"), git(t, tk.Worktree(r).Path, "rev-parse", "HEAD"); got != want {
			t.Errorf("%s: the remote's t1 is %s, want %s", r, got, want)
		}
	}

	// Again: the same pull requests, nothing opened or edited.
	before := len(f.gh.Calls(t, ""))
	res, err = f.store.PR(tk, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Created || r.Edited || r.PR.URL != urls[r.Repo] {
			t.Errorf("again, %s: %+v, want the pull request %s reused as it is", r.Repo, r, urls[r.Repo])
		}
	}
	for _, c := range f.gh.Calls(t, "")[before:] {
		if !strings.HasPrefix(c, "pr list") {
			t.Errorf("again, moat ran gh %s; want only pr list", c)
		}
	}
}

func TestPRSkipsUnchanged(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	commit(t, tk.Worktree("web").Path, "web.txt", "only web")
	res, err := f.store.PR(tk, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]PRResult{}
	for _, r := range res {
		got[r.Repo] = r
	}
	if got["api"].Skipped == "" || got["api"].PR.URL != "" {
		t.Errorf("api has no commits: %+v, want it skipped", got["api"])
	}
	if !got["web"].Created || got["web"].Edited {
		t.Errorf("web: %+v, want created, and no edit (no other pull request to link)", got["web"])
	}
	if n := len(f.gh.Calls(t, "pr create")); n != 1 {
		t.Errorf("gh pr create ran %d times, want 1", n)
	}
	remote := filepath.Join(filepath.Dir(f.ws), "api.git")
	if _, err := tickettest.TryGit(remote, "rev-parse", "--verify", "refs/heads/t1"); err == nil {
		t.Error("api's branch was pushed without changes")
	}
}

func TestStatus(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	commit(t, tk.Worktree("api").Path, "api.txt", "one")
	if _, err := f.store.PR(tk, os.Stderr); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(tk.Worktree("web").Path, "wip.txt"), "wip\n")
	now := time.Now()
	st := f.store.Status(tk, now)
	byRepo := map[string]Status{}
	for _, s := range st {
		byRepo[s.Repo] = s
	}
	api, web := byRepo["api"], byRepo["web"]
	if api.Ahead != 1 || api.Behind != 0 || api.Dirty != 0 || api.PR == nil || api.PR.State != "OPEN" || api.Branch != "t1" {
		t.Errorf("api: %+v, want 1 ahead, clean, an open pull request", api)
	}
	if web.Ahead != 0 || web.Dirty != 1 || web.PR != nil || web.Err != "" {
		t.Errorf("web: %+v, want 0 ahead, 1 dirty file, no pull request", web)
	}
	lists := func() int { return len(f.gh.Calls(t, "pr list")) }
	n := lists()
	f.store.Status(tk, now.Add(PRCacheFor-time.Second))
	if lists() != n {
		t.Errorf("status within %v asked gh again", PRCacheFor)
	}
	f.store.Status(tk, now.Add(PRCacheFor+time.Second))
	if lists() == n {
		t.Errorf("status after %v did not ask gh again", PRCacheFor)
	}
}

func TestAddAfterMerge(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	api := tk.Worktree("api")
	commit(t, api.Path, "api.txt", "the change")
	if _, err := f.store.PR(tk, os.Stderr); err != nil {
		t.Fatal(err)
	}
	// Not merged yet: refused.
	if _, err := f.store.Add(tk, "api", f.repos.Paths["api"], os.Stderr); err == nil || !strings.Contains(err.Error(), "not merged") {
		t.Fatalf("adding api again before its merge: %v, want a refusal", err)
	}
	// Merged upstream (a merge commit, as a forge's button makes).
	tickettest.MergeUpstream(t, filepath.Join(filepath.Dir(f.ws), "api.git"), "t1")
	branch, err := f.store.Add(tk, "api", f.repos.Paths["api"], os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if branch != "t1-2" {
		t.Errorf("branch %q, want t1-2", branch)
	}
	w := tk.Worktree("api")
	if got := git(t, w.Path, "branch", "--show-current"); got != "t1-2" {
		t.Errorf("worktree on %q, want t1-2", got)
	}
	if got := git(t, w.Path, "log", "-1", "--format=%s"); !strings.Contains(got, "Merge") {
		t.Errorf("t1-2 starts at %q, want the fetched default branch with the merge", got)
	}
	loaded, err := f.store.Load("t1")
	if err != nil || loaded.Worktree("api").Branch != "t1-2" || len(loaded.Worktrees) != 2 {
		t.Errorf("the record: %+v, %v; want api on t1-2 and web kept", loaded, err)
	}
}

func TestAddAfterSquashMerge(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	commit(t, tk.Worktree("web").Path, "web.txt", "the change")
	res, err := f.store.PR(tk, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	// A squash leaves the branch out of main: only gh knows.
	f.gh.SetState(t, "web", res[1].PR.Number, "MERGED")
	branch, err := f.store.Add(tk, "web", f.repos.Paths["web"], os.Stderr)
	if err != nil || branch != "t1-2" {
		t.Errorf("got %q, %v; want t1-2", branch, err)
	}
}

func TestRebase(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	api := tk.Worktree("api")
	commit(t, api.Path, "api.txt", "mine")
	upstream := tickettest.PushUpstream(t, filepath.Join(filepath.Dir(f.ws), "api.git"), "other.txt", "theirs")
	if err := f.store.Rebase(tk, "api", os.Stderr); err != nil {
		t.Fatal(err)
	}
	if _, err := tickettest.TryGit(api.Path, "merge-base", "--is-ancestor", upstream, "HEAD"); err != nil {
		t.Errorf("after the rebase, t1 does not contain the default branch's new commit %s", upstream)
	}
	if got := git(t, api.Path, "log", "-1", "--format=%s"); got != "mine" {
		t.Errorf("tip %q, want the ticket's commit on top", got)
	}

	// A conflict is undone and reported.
	commit(t, api.Path, "same.txt", "mine")
	tickettest.PushUpstream(t, filepath.Join(filepath.Dir(f.ws), "api.git"), "same.txt", "theirs")
	head := git(t, api.Path, "rev-parse", "HEAD")
	err := f.store.Rebase(tk, "api", os.Stderr)
	if err == nil || !strings.Contains(err.Error(), "conflict") {
		t.Fatalf("rebase over a conflict: %v, want an error naming it", err)
	}
	if got := git(t, api.Path, "rev-parse", "HEAD"); got != head {
		t.Errorf("HEAD %s after the failed rebase, want %s", got, head)
	}
	if st := git(t, api.Path, "status", "--porcelain"); st != "" {
		t.Errorf("worktree left dirty: %q", st)
	}
}

func TestProblemsAndRemove(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	api, web := tk.Worktree("api"), tk.Worktree("web")
	if p := tk.Problems(); len(p) != 0 {
		t.Errorf("a fresh ticket has problems: %v", p)
	}
	commit(t, api.Path, "api.txt", "unpushed")
	write(t, filepath.Join(web.Path, "wip.txt"), "wip\n")
	var got []string
	for _, p := range tk.Problems() {
		got = append(got, p.String())
	}
	if len(got) != 2 || !strings.Contains(got[0], "api") || !strings.Contains(got[0], "1 unpushed") ||
		!strings.Contains(got[1], "web") || !strings.Contains(got[1], "1 uncommitted") {
		t.Errorf("problems %q, want api with 1 unpushed commit and web with 1 uncommitted change", got)
	}
	// Pushed, api is fine.
	if _, err := f.store.PR(tk, os.Stderr); err != nil {
		t.Fatal(err)
	}
	if p := tk.Problems(); len(p) != 1 || p[0].Repo != "web" {
		t.Errorf("after pushing api: %v, want only web", p)
	}

	mainHead := git(t, api.Main, "rev-parse", "HEAD")
	if err := f.store.Remove(tk, os.Stderr); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*Worktree{api, web} {
		if _, err := os.Stat(w.Path); !os.IsNotExist(err) {
			t.Errorf("%s still exists: %v", w.Path, err)
		}
		if _, err := os.Stat(w.Admin); !os.IsNotExist(err) {
			t.Errorf("%s still exists: %v", w.Admin, err)
		}
		if got := git(t, w.Main, "worktree", "list", "--porcelain"); strings.Count(got, "worktree ") != 1 {
			t.Errorf("%s: git worktree list: %q, want the main worktree only", w.Repo, got)
		}
		git(t, w.Main, "fsck", "--no-progress")
		if st := git(t, w.Main, "status", "--porcelain"); st != "" {
			t.Errorf("%s: main repository changed: %q", w.Repo, st)
		}
	}
	if got := git(t, api.Main, "rev-parse", "HEAD"); got != mainHead {
		t.Errorf("main repository's HEAD moved: %s, want %s", got, mainHead)
	}
	if got := git(t, api.Main, "log", "-1", "--format=%s", "t1"); got != "unpushed" {
		t.Errorf("the branch t1 lost its commit: %q", got)
	}
	if f.store.Exists("t1") {
		t.Error("the ticket's record survived")
	}
}

func TestFindRepos(t *testing.T) {
	root := t.TempDir()
	sub := filepath.Join(root, "ws", "deep")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	user := filepath.Join(root, "config.toml")
	if _, err := FindRepos(sub, user); err == nil || !strings.Contains(err.Error(), "[workspace]") {
		t.Errorf("no workspace anywhere: %v, want an error saying what to write", err)
	}
	write(t, user, "[workspace]\nrepos = [\"/src/a\"]\n")
	r, err := FindRepos(sub, user)
	if err != nil || !slices.Equal(r.Order, []string{"a"}) {
		t.Errorf("user config: %+v, %v", r, err)
	}
	// The nearest moat.toml with the section wins whole.
	write(t, filepath.Join(root, "ws", "moat.toml"), "[workspace]\nrepos = [\"../api\", \"../web\"]\n")
	write(t, filepath.Join(sub, "moat.toml"), "[sandbox]\ncpus = 2\n")
	r, err = FindRepos(sub, user)
	if err != nil || !slices.Equal(r.Order, []string{"api", "web"}) || r.Paths["api"] != filepath.Join(root, "api") {
		t.Errorf("moat.toml: %+v, %v", r, err)
	}
	if _, err := r.Select([]string{"api", "nope"}); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("--repos nope: %v", err)
	}
	write(t, filepath.Join(root, "ws", "moat.toml"), "[workspace]\nrepos = \"../api\"\n")
	if _, err := FindRepos(sub, user); err == nil || !strings.Contains(err.Error(), "moat.toml:2") {
		t.Errorf("bad moat.toml: %v, want file:line", err)
	}
}

func TestValidName(t *testing.T) {
	for _, n := range []string{"PROJ-1", "", "-x", "a/b", "a b"} {
		if ValidName(n) == nil {
			t.Errorf("%q accepted", n)
		}
	}
	if err := ValidName("proj-123"); err != nil {
		t.Error(err)
	}
}

func TestStatusWithoutGH(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(real, filepath.Join(bin, "git")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin) // git, and no gh
	for _, st := range f.store.Status(tk, time.Now()) {
		if st.PR != nil || !strings.Contains(st.PRError, "gh auth login") || st.Err != "" {
			t.Errorf("%s without gh: %+v; want the pull request unknown, saying how to get gh", st.Repo, st)
		}
	}
	if _, err := f.store.PR(tk, io.Discard); err != nil {
		t.Errorf("moat pr without gh and without commits: %v; want nothing to do", err)
	}
	commit(t, tk.Worktree("api").Path, "a.txt", "change")
	if _, err := f.store.PR(tk, io.Discard); !errors.Is(err, ErrNoGH) {
		t.Errorf("moat pr without gh: %v; want ErrNoGH", err)
	}
}

// TestHostIgnoresPlantedGitDir: the guest can rewrite a worktree's .git
// file to name a git directory of its own, whose config runs a command
// (core.fsmonitor, core.hooksPath). Nothing moat runs on the host may
// use it: status, pr, rebase and destroy go through the main repository
// or the admin directory recorded before any guest ran.
func TestHostIgnoresPlantedGitDir(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	api := tk.Worktree("api")
	commit(t, api.Path, "a.txt", "change")
	marker := filepath.Join(t.TempDir(), "pwned")
	evil := filepath.Join(t.TempDir(), "evil.git")
	git(t, filepath.Dir(evil), "init", "-q", "--bare", evil)
	hooks := filepath.Join(evil, "hooks")
	for _, h := range []string{"pre-push", "post-checkout", "pre-rebase", "post-rewrite", "reference-transaction"} {
		write(t, filepath.Join(hooks, h), "#!/bin/sh\ntouch "+marker+"\n")
		if err := os.Chmod(filepath.Join(hooks, h), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(evil, "config"), "[core]\n\tfsmonitor = touch "+marker+"\n\thooksPath = "+hooks+"\n\tbare = false\n")
	for _, w := range tk.Worktrees {
		write(t, filepath.Join(w.Path, ".git"), "gitdir: "+evil+"\n")
	}
	pwned := func(step string) {
		t.Helper()
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%s ran the guest's command", step)
		}
	}
	f.store.Status(tk, time.Now())
	pwned("status")
	tk.Problems()
	pwned("the destroy check")
	if _, err := f.store.PR(tk, io.Discard); err != nil {
		t.Fatal(err)
	}
	pwned("pr")
	_ = f.store.Rebase(tk, "", io.Discard)
	pwned("rebase")
	if err := f.store.Remove(tk, io.Discard); err != nil {
		t.Fatal(err)
	}
	pwned("destroy")
	if got := git(t, api.Main, "worktree", "list"); strings.Contains(got, "\n") {
		t.Errorf("worktrees left after destroy: %q", got)
	}
}

// TestPRKeepsOthersCommits: moat pr overwrites the remote branch after a
// rebase, but not commits someone else pushed to it.
func TestPRKeepsOthersCommits(t *testing.T) {
	f := newFixture(t)
	tk := f.open(t, "t1")
	api := tk.Worktree("api")
	bare := filepath.Join(filepath.Dir(f.ws), "api.git")
	commit(t, api.Path, "a.txt", "mine")
	if _, err := f.store.PR(tk, io.Discard); err != nil {
		t.Fatal(err)
	}
	// A rebase rewrites the branch: pushed over the old one.
	tickettest.PushUpstream(t, bare, "up.txt", "upstream")
	if err := f.store.Rebase(tk, "api", io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.PR(tk, io.Discard); err != nil {
		t.Fatalf("pr after a rebase: %v", err)
	}
	if got, want := git(t, bare, "rev-parse", "refs/heads/t1"), git(t, api.Path, "rev-parse", "HEAD"); got != want {
		t.Fatalf("the remote's t1 is %s after the rebase's push, want %s", got, want)
	}
	// Someone adds a commit to the pull request's branch.
	other := filepath.Join(t.TempDir(), "other")
	git(t, filepath.Dir(other), "clone", "-q", "-b", "t1", bare, other)
	commit(t, other, "theirs.txt", "suggestion")
	git(t, other, "push", "-q", "origin", "t1")
	theirs := git(t, other, "rev-parse", "HEAD")
	commit(t, api.Path, "b.txt", "more of mine")
	_, err := f.store.PR(tk, io.Discard)
	if !errors.Is(err, ErrMoved) || !strings.Contains(err.Error(), "git merge origin/t1") {
		t.Fatalf("pr over someone else's commit: %v; want ErrMoved saying how to bring it in", err)
	}
	if got := git(t, bare, "rev-parse", "refs/heads/t1"); got != theirs {
		t.Fatalf("their commit was overwritten: the remote's t1 is %s, want %s", got, theirs)
	}
	git(t, api.Path, "merge", "-q", "--no-edit", "origin/t1")
	if _, err := f.store.PR(tk, io.Discard); err != nil {
		t.Fatalf("pr after merging theirs: %v", err)
	}
	if _, err := tickettest.TryGit(bare, "merge-base", "--is-ancestor", theirs, "refs/heads/t1"); err != nil {
		t.Error("their commit is not in the pushed branch")
	}
}
