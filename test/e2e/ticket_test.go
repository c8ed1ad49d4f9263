package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"moat.dev/moat/internal/ticket/tickettest"
)

// TestTicket is ticket mode as a user runs it, through sudo: two
// repositories with local bare remotes, owned by the user (uid 1234);
// moat work opens both in one sandbox; the agent commits, diffs and
// rebases in both, and cannot write the main repositories' hooks or
// config; moat pr pushes with the host's git and opens two linked pull
// requests through gh (a stand-in that records its calls), and reuses
// them when run again; moat destroy refuses while a worktree is dirty,
// and with --force removes the worktrees and leaves the main
// repositories as they were.
func TestTicket(t *testing.T) {
	const uid = "1234"
	base, err := os.MkdirTemp("", "moat-e2e-ticket-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	// The user's git (moat runs it as uid 1234) must reach everything it
	// touches: this test's own MOAT_HOME, HOME and gh stand-in, open to it.
	open := func(p string) string {
		t.Helper()
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	open(base)
	home := open(filepath.Join(base, "moat-home"))
	tickettest.GitEnv(t)
	// This test's own git, as root, reads the user's repositories.
	if out, err := exec.Command("git", "config", "--global", "--add", "safe.directory", "*").CombinedOutput(); err != nil {
		t.Fatalf("git config: %v: %s", err, out)
	}
	userHome := open(filepath.Join(base, "user"))
	if err := os.WriteFile(filepath.Join(userHome, ".gitconfig"), []byte("[user]\n\tname = User\n\temail = user@example.com\n[init]\n\tdefaultBranch = main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gh := tickettest.NewGH(t)
	open(filepath.Dir(gh.Dir))
	open(gh.Dir)
	src := open(filepath.Join(base, "src"))
	for _, n := range []string{"api", "web"} {
		tickettest.Remote(t, src, n)
	}
	ws := open(filepath.Join(src, "ws"))
	if err := os.WriteFile(filepath.Join(ws, "moat.toml"), []byte("[workspace]\nrepos = [\"../api\", \"../web\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chown", "-R", uid+":"+uid, src, userHome, gh.Dir).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v: %s", err, out)
	}
	env := []string{"MOAT_HOME=" + home, "SUDO_UID=" + uid, "SUDO_GID=" + uid, "HOME=" + userHome}
	run := func(args ...string) result {
		t.Helper()
		return moat(t, ws, env, args...)
	}
	must := func(args ...string) string {
		t.Helper()
		r := run(args...)
		if r.code != 0 {
			t.Fatalf("moat %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	t.Cleanup(func() { run("destroy", "tk", "--force") })
	hooks := func() string {
		ents, _ := os.ReadDir(filepath.Join(src, "api", ".git", "hooks"))
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return strings.Join(names, " ")
	}
	hooksBefore := hooks()
	configBefore, _ := os.ReadFile(filepath.Join(src, "api", ".git", "config"))

	wsDir := strings.TrimSpace(must("work", "tk"))
	if got := strings.TrimSpace(must("exec", "tk", "--", "pwd")); got != wsDir {
		t.Errorf("the agent starts in %q, want the ticket's workspace %q", got, wsDir)
	}

	// The agent's work, in both repositories.
	guest := `set -e
export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
id -u
for r in api web; do
	cd ` + wsDir + `/$r
	test "$(git branch --show-current)" = tk
	echo "$r change" > change.txt
	git add change.txt
	git commit -q -m "$r: the change"
	git log --oneline | head -1
	git diff --stat HEAD~1
done
`
	out := must("exec", "tk", "--", "sh", "-c", guest)
	if !strings.HasPrefix(out, uid+"\n") || !strings.Contains(out, "api: the change") || !strings.Contains(out, "web: the change") ||
		strings.Count(out, "change.txt | 1 +") != 2 {
		t.Errorf("guest commits:\n%s", out)
	}

	// Nothing the host's git runs or obeys can be planted from the guest.
	mainGit := filepath.Join(src, "api", ".git")
	for _, p := range []string{"hooks/post-checkout", "config", "info/attributes", "objects/info/alternates"} {
		r := run("exec", "tk", "--", "sh", "-c", "echo 'touch /tmp/pwned' >> "+filepath.Join(mainGit, p))
		if r.code == 0 {
			t.Errorf("the guest wrote %s", filepath.Join(mainGit, p))
		}
	}
	if _, err := os.Stat(filepath.Join(mainGit, "hooks", "post-checkout")); !os.IsNotExist(err) {
		t.Errorf("a post-checkout hook appeared on the host: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(mainGit, "config")); string(got) != string(configBefore) {
		t.Errorf("the main repository's config changed:\n%s", got)
	}
	r := run("exec", "tk", "--", "sh", "-c", "admin=$(git -C "+wsDir+"/api rev-parse --git-dir); echo x > $admin/config.worktree")
	if r.code == 0 {
		t.Error("the guest wrote the worktree's config.worktree")
	}

	// A rebase in the guest, onto the default branch the host fetched.
	upstream := tickettest.PushUpstream(t, filepath.Join(src, "api.git"), "upstream.txt", "theirs")
	if c := exec.Command("git", "-C", filepath.Join(src, "api"), "fetch", "-q", "origin"); c.Run() != nil {
		t.Fatal("host fetch failed")
	}
	exec.Command("chown", "-R", uid+":"+uid, mainGit).Run() // what root's fetch wrote
	out = must("exec", "tk", "--", "sh", "-c", "cd "+wsDir+"/api && GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com git rebase -q origin/main && git log --format=%H")
	if !strings.Contains(out, upstream) {
		t.Errorf("after the guest's rebase the branch lacks the upstream commit %s:\n%s", upstream, out)
	}

	// Pull requests: two, linked; again, the same two.
	out = must("pr", "tk")
	if strings.Count(out, "opened") != 2 {
		t.Errorf("moat pr:\n%s", out)
	}
	for _, n := range []string{"api", "web"} {
		if got, want := tickettest.Git(t, filepath.Join(src, n+".git"), "rev-parse", "refs/heads/tk"),
			tickettest.Git(t, filepath.Join(wsDir, n), "rev-parse", "HEAD"); got != want {
			t.Errorf("%s: the remote's tk is %s, want the worktree's %s", n, got, want)
		}
	}
	apiBody := gh.Body(t, "api", "https://forge.test/owner/api/pull/1")
	webBody := gh.Body(t, "web", "https://forge.test/owner/web/pull/1")
	if !strings.Contains(apiBody, "https://forge.test/owner/web/pull/1") || !strings.Contains(webBody, "https://forge.test/owner/api/pull/1") {
		t.Errorf("descriptions not linked:\napi: %s\nweb: %s", apiBody, webBody)
	}
	out = must("pr", "tk")
	if strings.Contains(out, "opened") || len(gh.Calls(t, "pr create")) != 2 {
		t.Errorf("moat pr again opened more:\n%s\ncalls: %q", out, gh.Calls(t, ""))
	}
	out = must("status", "tk")
	if !strings.Contains(out, "https://forge.test/owner/api/pull/1 open") || !strings.Contains(out, "ticket:     tk") {
		t.Errorf("moat status tk:\n%s", out)
	}

	// Destroy: refused while web is dirty; --force removes the worktrees.
	must("exec", "tk", "--", "sh", "-c", "echo wip > "+wsDir+"/web/wip.txt")
	r = run("destroy", "tk", "--yes")
	if r.code == 0 || !strings.Contains(r.stderr, "web") || !strings.Contains(r.stderr, "uncommitted") {
		t.Fatalf("destroy with a dirty worktree: exit %d, %s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(wsDir, "web", "wip.txt")); err != nil {
		t.Fatalf("the refused destroy lost work: %v", err)
	}
	apiHead := tickettest.Git(t, filepath.Join(src, "api"), "rev-parse", "HEAD")
	must("destroy", "tk", "--force")
	if _, err := os.Stat(wsDir); !os.IsNotExist(err) {
		t.Errorf("the ticket's workspace survived: %v", err)
	}
	for _, n := range []string{"api", "web"} {
		main := filepath.Join(src, n)
		tickettest.Git(t, main, "fsck", "--no-progress")
		if got := tickettest.Git(t, main, "worktree", "list"); strings.Contains(got, "\n") {
			t.Errorf("%s: worktrees left: %q", n, got)
		}
		if got := tickettest.Git(t, main, "status", "--porcelain"); got != "" {
			t.Errorf("%s: the main repository's work tree changed: %q", n, got)
		}
		if got := tickettest.Git(t, main, "log", "-1", "--format=%s", "tk"); got != n+": the change" {
			t.Errorf("%s: the branch tk lost its commit: %q", n, got)
		}
	}
	if got := tickettest.Git(t, filepath.Join(src, "api"), "rev-parse", "HEAD"); got != apiHead {
		t.Errorf("api's HEAD moved: %s, want %s", got, apiHead)
	}
	if got := hooks(); got != hooksBefore {
		t.Errorf("the main repository's hooks changed: %q, want %q", got, hooksBefore)
	}
	if r := run("list"); strings.Contains(r.stdout, "tk ") {
		t.Errorf("the sandbox survived:\n%s", r.stdout)
	}
}
