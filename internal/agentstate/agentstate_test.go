package agentstate

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

type fixture struct {
	s  Store
	ws string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	root := t.TempDir()
	ws := filepath.Join(root, "src", "api")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	var notes []string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("notes: %q", notes)
		}
	})
	clock := time.Unix(1_800_000_000, 0)
	return &fixture{ws: ws, s: Store{
		State: filepath.Join(root, "state", "agentstate"), Work: filepath.Join(root, "work"),
		Note: func(m string) { notes = append(notes, m) },
		Now:  func() time.Time { clock = clock.Add(time.Second); return clock },
	}}
}

// start starts sandbox name and returns its directory.
func (f *fixture) start(t *testing.T, name string) string {
	t.Helper()
	ms, err := f.s.Start(f.ws, name, os.Getuid(), os.Getgid(), false)
	if err != nil {
		t.Fatalf("Start(%s): %v", name, err)
	}
	var targets []string
	for _, m := range ms {
		targets = append(targets, m.Target)
	}
	if want := []string{".claude", ".codex"}; !slices.Equal(targets, want) {
		t.Fatalf("Start(%s) mounts %v, want %v", name, targets, want)
	}
	return f.s.SandboxDir(ProjectID(f.ws), name)
}

func (f *fixture) save(t *testing.T, name string) {
	t.Helper()
	if err := f.s.Save(f.ws, name); err != nil {
		t.Fatalf("Save(%s): %v", name, err)
	}
}

func write(t *testing.T, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func appendTo(t *testing.T, dir, rel, content string) {
	t.Helper()
	fh, err := os.OpenFile(filepath.Join(dir, rel), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteString(content); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, dir, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, rel))
	if err != nil {
		t.Fatalf("reading %s: %v", rel, err)
	}
	return string(b)
}

func exists(dir, rel string) bool {
	_, err := os.Lstat(filepath.Join(dir, rel))
	return err == nil
}

const session1 = "claude/projects/-src-api/11111111-aaaa.jsonl"
const session2 = "claude/projects/-src-api/22222222-bbbb.jsonl"

func TestFoldIntoANewSandbox(t *testing.T) {
	f := newFixture(t)
	a := f.start(t, "a")
	write(t, a, session1, `{"type":"user","timestamp":"2026-12-05T10:00:00Z","cwd":"/src/api"}`+"\n")
	write(t, a, "codex/sessions/2026/12/05/rollout-x.jsonl", "{}\n")
	f.save(t, "a")
	b := f.start(t, "b")
	if got := read(t, b, session1); !strings.Contains(got, `"type":"user"`) {
		t.Errorf("b's %s = %q, want a's conversation", session1, got)
	}
	if !exists(b, "codex/sessions/2026/12/05/rollout-x.jsonl") {
		t.Errorf("b lacks a's codex rollout")
	}
	cs, err := f.s.Conversations(ProjectID(f.ws))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cs {
		got = append(got, c.Agent+" "+c.ID+" "+c.Sandbox)
	}
	slices.Sort(got)
	if want := []string{"claude 11111111-aaaa a", "codex rollout-x a"}; !slices.Equal(got, want) {
		t.Errorf("Conversations = %q, want %q", got, want)
	}
}

func TestTwoSandboxesKeepBoth(t *testing.T) {
	f := newFixture(t)
	a := f.start(t, "a")
	write(t, a, "claude/history.jsonl", "{\"display\":\"base\"}\n")
	write(t, a, "claude/todos/t.json", "[]\n")
	f.save(t, "a")
	a = f.start(t, "a")
	b := f.start(t, "b")
	// Both from the same main line, then each its own session, its own
	// history lines and its own version of a to-do list.
	write(t, a, session1, "{\"from\":\"a\"}\n")
	write(t, b, session2, "{\"from\":\"b\"}\n")
	appendTo(t, a, "claude/history.jsonl", "{\"display\":\"from a\"}\n")
	appendTo(t, b, "claude/history.jsonl", "{\"display\":\"from b\"}\n")
	write(t, a, "claude/todos/t.json", "[\"a\"]\n")
	write(t, b, "claude/todos/t.json", "[\"b\"]\n")
	f.save(t, "a")
	f.save(t, "b")
	c := f.start(t, "c")
	for _, p := range []string{session1, session2} {
		if !exists(c, p) {
			t.Errorf("c lacks %s", p)
		}
	}
	hist := read(t, c, "claude/history.jsonl")
	for _, want := range []string{"base", "from a", "from b"} {
		if !strings.Contains(hist, want) {
			t.Errorf("history.jsonl = %q, lacks %q", hist, want)
		}
	}
	if got := read(t, c, "claude/todos/t.json"); got != "[\"b\"]\n" {
		t.Errorf("todos/t.json = %q, want the last merged sandbox's (b's)", got)
	}
}

func TestCredentialsAndSeededFilesAreNotKept(t *testing.T) {
	f := newFixture(t)
	a := f.start(t, "a")
	secrets := []string{
		"claude/.credentials.json", "claude/settings.json", "claude/statsig/x",
		"codex/auth.json", "codex/config.toml", "claude.json",
	}
	for _, p := range secrets {
		write(t, a, p, "secret-value\n")
	}
	write(t, a, session1, "{}\n")
	f.save(t, "a")
	b := f.start(t, "b")
	if !exists(b, session1) {
		t.Fatalf("b lacks the conversation: the test proves nothing")
	}
	for _, p := range secrets {
		if exists(b, p) {
			t.Errorf("%s reached another sandbox", p)
		}
	}
	r := repo{dir: f.s.bare(ProjectID(f.ws))}
	files, err := r.tree(mainRef)
	if err != nil {
		t.Fatal(err)
	}
	for p := range files {
		if p != session1 {
			t.Errorf("the repository holds %s", p)
		}
	}
}

func TestGuestFilesRunNothingOnTheHost(t *testing.T) {
	f := newFixture(t)
	outside := t.TempDir()
	marker := filepath.Join(outside, "ran")
	hostFile := filepath.Join(outside, "host-secret")
	if err := os.WriteFile(hostFile, []byte("host-secret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := f.start(t, "a")
	hook := "#!/bin/sh\ntouch " + marker + "\n"
	// Hooks and attributes wherever a guest could put them, a filter
	// they name, and links out of the directory, to read and to write.
	write(t, a, "claude/.git/hooks/post-commit", hook)
	write(t, a, "claude/projects/.git/hooks/pre-commit", hook)
	write(t, a, "claude/projects/.gitattributes", "* filter=evil merge=evil diff=evil\n")
	write(t, a, "claude/.gitattributes", "* filter=evil\n")
	write(t, a, "claude/.gitconfig", "[filter \"evil\"]\n\tclean = touch "+marker+"\n")
	write(t, a, "claude/projects/-x/.git/config", "[core]\n\thooksPath = .\n[filter \"evil\"]\n\tclean = touch "+marker+"\n")
	for _, h := range []string{"claude/projects/-x/.git/post-commit", "claude/projects/.git/hooks/post-commit"} {
		os.Chmod(filepath.Join(a, h), 0o755)
	}
	write(t, a, session1, "{}\n")
	if err := os.Symlink(hostFile, filepath.Join(a, "claude/projects/-src-api/leak.jsonl")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(a, "claude/todos")); err != nil {
		t.Fatal(err)
	}
	f.save(t, "a")
	// A second sandbox merges with a's (merge-tree with the attributes in
	// place), then a's next start writes the main line through its links.
	b := f.start(t, "b")
	write(t, b, "claude/todos/x.json", "[]\n")
	write(t, b, session2, "{}\n")
	f.save(t, "b")
	appendTo(t, a, session1, "{}\n")
	f.start(t, "a")
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("a hook or filter the guest wrote ran on the host")
	}
	if exists(outside, "x.json") {
		t.Errorf("checkout wrote through the guest's link, outside its directory")
	}
	r := repo{dir: f.s.bare(ProjectID(f.ws))}
	files, err := r.tree(mainRef)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for p, e := range files {
		paths = append(paths, p)
		if strings.Contains(p, ".git") {
			t.Errorf("the repository holds %s", p)
		}
		if blobs, err := r.blobs([]string{e.sha}); err == nil && strings.Contains(string(blobs[e.sha]), "host-secret-value") {
			t.Errorf("%s holds the host file a link pointed at", p)
		}
	}
	slices.Sort(paths)
	if want := []string{session1, session2, "claude/todos/x.json"}; !slices.Equal(paths, want) {
		t.Errorf("repository = %q, want %q", paths, want)
	}
}

func TestDeleteAndRemove(t *testing.T) {
	f := newFixture(t)
	a := f.start(t, "a")
	write(t, a, session1, "{}\n")
	write(t, a, session2, "{\"timestamp\":\"2026-12-05T10:00:00Z\",\"cwd\":\"/w\"}\n{\"timestamp\":\"2026-12-05T11:00:00Z\"}\n")
	write(t, a, "claude/todos/11111111-aaaa-agent-1.json", "[]\n")
	if err := f.s.Remove(f.ws, "a"); err != nil {
		t.Fatal(err)
	}
	if exists(a, "") {
		t.Errorf("Remove left %s", a)
	}
	project := ProjectID(f.ws)
	c, err := f.s.Find(project, "2222")
	if err != nil {
		t.Fatal(err)
	}
	d, err := f.s.Show(c)
	if err != nil {
		t.Fatal(err)
	}
	if d.Lines != 2 || d.Cwd != "/w" || !d.Last.After(d.First) || d.Sandbox != "a" {
		t.Errorf("Show = %+v, want 2 lines, cwd /w, a span, sandbox a", d)
	}
	c, err = f.s.Find(project, "11111111-aaaa")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.s.Delete(c); err != nil {
		t.Fatal(err)
	}
	b := f.start(t, "b")
	if exists(b, session1) || exists(b, "claude/todos/11111111-aaaa-agent-1.json") {
		t.Errorf("a deleted conversation reached a new sandbox")
	}
	if !exists(b, session2) {
		t.Errorf("the other conversation is gone")
	}
	if _, err := f.s.Find(project, "11111111"); err == nil {
		t.Errorf("Find found a deleted conversation")
	}
}

func TestRestartKeepsAndRefreshes(t *testing.T) {
	f := newFixture(t)
	a := f.start(t, "a")
	b := f.start(t, "b")
	write(t, b, session2, "{}\n")
	f.save(t, "b")
	// A resumed guest holds its files open: its directory is left alone.
	if _, err := f.s.Start(f.ws, "a", os.Getuid(), os.Getgid(), true); err != nil {
		t.Fatal(err)
	}
	if exists(a, session2) {
		t.Errorf("a resumed sandbox's directory was rewritten")
	}
	f.start(t, "a")
	if !exists(a, session2) {
		t.Errorf("a restarted sandbox lacks b's conversation")
	}
}

// A sandbox whose directory was never checked out (restored from a
// checkpoint) has no branch of its own: its files join the project's,
// and what it never had is not taken for deleted, then or later.
func TestDirectoryWithoutBranchDeletesNothing(t *testing.T) {
	f := newFixture(t)
	start := func(n string) string {
		t.Helper()
		if _, err := f.s.Start(f.ws, n, os.Getuid(), os.Getgid(), true); err != nil {
			t.Fatal(err)
		}
		return f.s.SandboxDir(ProjectID(f.ws), n)
	}
	a := start("a")
	b := start("b")
	write(t, a, session1, "{}\n")
	write(t, b, session2, "{}\n")
	for _, n := range []string{"a", "b"} {
		f.save(t, n)
		if err := f.s.Remove(f.ws, n); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := f.s.Conversations(ProjectID(f.ws))
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 {
		t.Errorf("Conversations = %+v, want both sandboxes'", cs)
	}
}

// A file the guest deletes stays in the project (the agents prune old
// transcripts); moat sessions rm removes.
func TestGuestDeletionKeepsTheConversation(t *testing.T) {
	f := newFixture(t)
	a := f.start(t, "a")
	write(t, a, session1, "{}\n")
	f.save(t, "a")
	if err := os.Remove(filepath.Join(a, session1)); err != nil {
		t.Fatal(err)
	}
	f.save(t, "a")
	if b := f.start(t, "b"); !exists(b, session1) {
		t.Errorf("a conversation the guest deleted left the project")
	}
}

// A checkout in batches (here one blob each) writes every file.
func TestCheckoutInBatches(t *testing.T) {
	defer func(b int64) { batchBytes = b }(batchBytes)
	batchBytes = 1
	f := newFixture(t)
	a := f.start(t, "a")
	write(t, a, session1, "{\"n\":1}\n")
	write(t, a, session2, "{\"n\":2}\n")
	write(t, a, "claude/history.jsonl", "{\"n\":3}\n")
	f.save(t, "a")
	b := f.start(t, "b")
	for p, want := range map[string]string{session1: "{\"n\":1}\n", session2: "{\"n\":2}\n", "claude/history.jsonl": "{\"n\":3}\n"} {
		if got := read(t, b, p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
}

// Until a sandbox of the project keeps something, starting and stopping
// its sandboxes runs no git: the repository is not even made. Once one
// keeps a file, a sandbox started before that gets it at its next start.
func TestNothingKeptRunsNoGit(t *testing.T) {
	f := newFixture(t)
	project := ProjectID(f.ws)
	a := f.start(t, "a")
	b := f.start(t, "b")
	f.save(t, "a")
	if f.s.hasRepo(project) {
		t.Fatalf("a project that kept nothing has a repository after a start and a stop")
	}
	write(t, b, session2, "{}\n")
	f.save(t, "b")
	if !f.s.hasRepo(project) {
		t.Fatalf("b's conversation made no repository")
	}
	f.start(t, "a")
	if !exists(a, session2) {
		t.Errorf("a sandbox started before the project kept anything lacks b's conversation at its next start")
	}
}
