package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/ticket"
	"moat.dev/moat/internal/ticket/tickettest"
)

// ticketWorkspace is a workspace of two repositories (api, web) with
// local bare remotes, gh's stand-in on PATH, and ticket t1 opened in it
// as moat work does before it makes the sandbox (which these in-process
// tests cannot start; test/e2e/ticket_test.go does).
func ticketWorkspace(t *testing.T) (root string, gh *tickettest.GH, tk *ticket.Ticket) {
	t.Helper()
	isolate(t)
	needEnv(t)
	tickettest.GitEnv(t)
	root = t.TempDir()
	for _, n := range []string{"api", "web"} {
		tickettest.Remote(t, root, n)
	}
	ws := filepath.Join(root, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "moat.toml"), []byte("[workspace]\nrepos = [\"../api\", \"../web\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(ws)
	gh = tickettest.NewGH(t)
	dirs, err := state.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ticket.NewStore(dirs.State)
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{"api": filepath.Join(root, "api"), "web": filepath.Join(root, "web")}
	if tk, err = s.Open("t1", []string{"api", "web"}, paths, os.Stderr); err != nil {
		t.Fatal(err)
	}
	return root, gh, tk
}

func commitIn(t *testing.T, dir, file string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(file+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tickettest.Git(t, dir, "add", file)
	tickettest.Git(t, dir, "commit", "-q", "-m", "add "+file)
}

func TestTicketCommands(t *testing.T) {
	root, gh, tk := ticketWorkspace(t)
	api, web := tk.Worktree("api"), tk.Worktree("web")

	r := moat("worktree", "list", "--json")
	if r.code != 0 {
		t.Fatalf("worktree list: %+v", r)
	}
	var rows []worktreeJSON
	for _, l := range strings.Split(strings.TrimSpace(r.out), "\n") {
		var w worktreeJSON
		if err := json.Unmarshal([]byte(l), &w); err != nil {
			t.Fatalf("worktree list --json line %q: %v", l, err)
		}
		rows = append(rows, w)
	}
	if len(rows) != 2 || rows[0].Repo != "api" || rows[0].Branch != "t1" || rows[0].Path != api.Path || rows[0].Schema != 1 {
		t.Errorf("worktree list --json: %+v", rows)
	}

	commitIn(t, api.Path, "a.txt")
	commitIn(t, web.Path, "w.txt")
	if err := os.WriteFile(filepath.Join(web.Path, "wip.txt"), []byte("wip\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = moat("destroy", "t1", "--yes")
	if r.code != ExitError || !strings.Contains(r.errOut, "api") || !strings.Contains(r.errOut, "1 unpushed commits") ||
		!strings.Contains(r.errOut, "1 uncommitted changes") || !strings.Contains(r.errOut, "moat destroy t1 --force") {
		t.Errorf("destroy with unpushed and uncommitted work: exit %d, %q; want a refusal listing both", r.code, r.errOut)
	}

	r = moat("pr", "t1", "--json")
	if r.code != 0 {
		t.Fatalf("pr: %+v", r)
	}
	if n := strings.Count(r.out, `"created":true`); n != 2 {
		t.Errorf("pr --json: %s; want 2 created", r.out)
	}
	r = moat("pr", "t1")
	if r.code != 0 || strings.Contains(r.out, "opened") || strings.Count(r.out, "pushed to the open one") != 2 {
		t.Errorf("pr again: %+v; want both reused", r)
	}
	if n := len(gh.Calls(t, "pr create")); n != 2 {
		t.Errorf("gh pr create ran %d times, want 2", n)
	}

	// Rebase refuses the dirty web, rebases api.
	tickettest.PushUpstream(t, filepath.Join(root, "api.git"), "up.txt", "upstream")
	r = moat("worktree", "rebase", "t1")
	if r.code == 0 || !strings.Contains(r.errOut, "web has uncommitted changes") {
		t.Errorf("rebase with web dirty: %+v; want web refused", r)
	}
	if _, err := os.Stat(filepath.Join(api.Path, "up.txt")); err != nil {
		t.Errorf("api was not rebased onto the new default branch: %v", err)
	}
	if r := moat("worktree", "rebase", "t1", "nope"); r.code != ExitNotFound {
		t.Errorf("rebase of a repository the ticket lacks: %+v", r)
	}

	// Merged upstream: worktree add gives t1-2.
	tickettest.Git(t, api.Path, "push", "-q", "--force", "origin", "t1")
	tickettest.MergeUpstream(t, filepath.Join(root, "api.git"), "t1")
	r = moat("worktree", "add", "t1", "api")
	if r.code != 0 {
		t.Fatalf("worktree add after the merge: %+v", r)
	}
	if got := tickettest.Git(t, api.Path, "branch", "--show-current"); got != "t1-2" {
		t.Errorf("api's worktree is on %q, want t1-2", got)
	}

	r = moat("destroy", "t1", "--yes")
	if r.code != ExitError || !strings.Contains(r.errOut, "web") || strings.Contains(r.errOut, "api") {
		t.Errorf("destroy with web dirty: %+v; want a refusal naming web only", r)
	}
	apiHead := tickettest.Git(t, filepath.Join(root, "api"), "rev-parse", "HEAD")
	r = moat("destroy", "t1", "--force")
	if r.code != 0 {
		t.Fatalf("destroy --force: %+v", r)
	}
	for _, p := range []string{api.Path, web.Path} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived destroy --force: %v", p, err)
		}
	}
	main := filepath.Join(root, "api")
	if got := tickettest.Git(t, main, "rev-parse", "HEAD"); got != apiHead {
		t.Errorf("the main repository moved: %s, want %s", got, apiHead)
	}
	tickettest.Git(t, main, "fsck", "--no-progress")
	if got := tickettest.Git(t, main, "worktree", "list"); strings.Count(got, "\n") != 0 {
		t.Errorf("worktrees left: %q", got)
	}
	if r := moat("worktree", "list", "t1"); r.code != ExitNotFound {
		t.Errorf("worktree list of the destroyed ticket: %+v", r)
	}
}

func TestWorkRefusesBeforeStarting(t *testing.T) {
	isolate(t)
	needEnv(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"work", "T-1"}, ExitUsage, "lower-case"},
		{[]string{"work", "t1"}, ExitUsage, "[workspace]"},
		{[]string{"pr", "t1"}, ExitNotFound, "moat work t1"},
		{[]string{"worktree", "add", "t1", "api"}, ExitNotFound, "no such ticket"},
	} {
		r := moat(tc.args...)
		if r.code != tc.code || !strings.Contains(r.errOut, tc.want) {
			t.Errorf("moat %s: exit %d, %q; want %d and %q", strings.Join(tc.args, " "), r.code, r.errOut, tc.code, tc.want)
		}
	}
	if err := os.WriteFile("moat.toml", []byte("[workspace]\nrepos = [\"../api\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := moat("work", "t1", "--repos", "web"); r.code != ExitUsage || !strings.Contains(r.errOut, `no repository "web"`) {
		t.Errorf("--repos web: %+v", r)
	}
}
