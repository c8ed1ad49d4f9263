// Package agentstate keeps the coding agents' conversations on the host,
// per project, so that they outlive the sandbox that had them: a new
// sandbox of the project resumes them (`claude --resume`), and two
// sandboxes of one project do not overwrite each other's.
//
// Each project (a workspace directory) has a bare git repository in
// moat's state, never mounted into a guest. Each sandbox of the project
// has a directory on the host, outside the state, whose agent
// subdirectories are mounted at the agent's home paths (~/.claude,
// ~/.codex). When the sandbox starts, its directory is committed on its
// branch (sandbox/NAME), merged into the project's main line, and the
// main line is written back into it; when it stops (or is destroyed, or
// `moat sessions` looks) its directory is committed and merged again.
// Transcripts and histories merge as unions of lines (*.jsonl
// merge=union); any other conflict takes the sandbox's version.
//
// Only a whitelist is versioned (Agent.Keep): the conversations, never a
// credential or the settings moat seeds, whatever the guest writes. The
// guest's files are data to the host: they are read and written through
// an os.Root (no link leads out), and git runs as plumbing only, with
// hooks off and no configuration but moat's (git.go).
//
// Not kept: ~/.claude.json (Claude Code's per-directory state, its
// onboarding answers and its OAuth account). Resuming does not need it:
// `claude --resume` and `--continue` read the transcripts under
// ~/.claude/projects.
package agentstate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"moat.dev/moat/internal/state"
)

// Agent is one agent's state directory in the guest's home.
type Agent struct {
	Name string // the preset's, and the directory's name on the host
	Home string // the directory, relative to the guest's home
	// Keep are the versioned paths, relative to the directory: a name
	// ending in "/" is a directory and all below it.
	Keep []string
}

// Agents are the agents whose state is kept. Claude Code: its
// transcripts (projects/DIR/SESSION.jsonl), the prompt history and the
// to-do lists; not settings.json (moat seeds it), .credentials.json,
// statsig/, shell-snapshots/. Codex: its rollouts (sessions/Y/M/D/...)
// and history; not config.toml or auth.json (moat seeds them).
var Agents = []Agent{
	{Name: "claude", Home: ".claude", Keep: []string{"projects/", "history.jsonl", "todos/"}},
	{Name: "codex", Home: ".codex", Keep: []string{"sessions/", "history.jsonl"}},
}

// Store is where the state lives.
type Store struct {
	State string // bare repositories: <state>/agentstate/PROJECT.git
	Work  string // sandboxes' directories: <work>/PROJECT/SANDBOX/AGENT
	// Note receives what was left out and why (nil: discarded).
	Note func(string)
	// Now is the clock for commit times (nil: time.Now).
	Now func() time.Time
}

// NewStore is the store for moat's state directory stateDir, the
// sandboxes' directories in $MOAT_HOME/agentstate when MOAT_HOME is set,
// else in the XDG data directory (~/.local/share/moat/agentstate, the
// home being the sudo user's under sudo), as tickets' worktrees are:
// never inside the state, which no share may reach.
func NewStore(stateDir string) (Store, error) {
	work, err := state.DataDir("agentstate")
	return Store{State: filepath.Join(stateDir, "agentstate"), Work: work}, err
}

var projectJunk = regexp.MustCompile(`[^a-z0-9-]+`)

// ProjectID names the project of workspace ws: its directory's name and
// a hash of its path, so two checkouts named alike stay apart.
func ProjectID(ws string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(ws)))
	base := strings.Trim(projectJunk.ReplaceAllString(strings.ToLower(filepath.Base(ws)), "-"), "-")
	if len(base) > 32 {
		base = strings.Trim(base[:32], "-")
	}
	if base == "" {
		base = "project"
	}
	return base + "-" + hex.EncodeToString(sum[:4])
}

// validSandbox: a sandbox's name as moat makes them, which is also a
// directory and a branch name here. A function, not a regexp: the bounded
// repetition compiles into a program of tens of KB that every process of
// moat-sandbox would hold from its start.
func validSandbox(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ErrNoProject is returned for a project without kept state.
var ErrNoProject = errors.New("no kept agent state for this project")

func (s Store) bare(project string) string { return filepath.Join(s.State, project+".git") }

// SandboxDir is the host directory of sandbox's state in project.
func (s Store) SandboxDir(project, sandbox string) string {
	return filepath.Join(s.Work, project, sandbox)
}

// workspaceFile names the project's workspace, for listings.
const workspaceFile = "moat-workspace"

func (s Store) note(msg string) {
	if s.Note != nil {
		s.Note(msg)
	}
}

func (s Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// open opens (creating when create) the project's repository, locked
// until the returned function is called.
func (s Store) open(project, ws string, create bool) (repo, func(), error) {
	dir := s.bare(project)
	if !create {
		if _, err := os.Stat(filepath.Join(dir, "HEAD")); err != nil {
			return repo{}, nil, fmt.Errorf("%s: %w", project, ErrNoProject)
		}
	}
	if err := os.MkdirAll(s.State, 0o700); err != nil {
		return repo{}, nil, err
	}
	unlock, err := lock(dir + ".lock")
	if err != nil {
		return repo{}, nil, err
	}
	r, err := initRepo(dir)
	if err != nil {
		unlock()
		return r, nil, err
	}
	if ws != "" {
		os.WriteFile(filepath.Join(dir, workspaceFile), []byte(ws+"\n"), 0o600)
	}
	return r, unlock, nil
}

// Mount is an agent's directory and where the guest sees it.
type Mount struct {
	Source string // on the host
	Target string // relative to the guest's home, e.g. ".claude"
}

// Start folds the project's state into sandbox's directory before the
// sandbox starts: every sandbox directory of the project is committed
// and merged, then the main line is written into sandbox's, owned by
// uid:gid. keep leaves sandbox's directory as it is (a guest restored
// from a checkpoint holds its files open). It returns the mounts.
func (s Store) Start(ws, sandbox string, uid, gid int, keep bool) ([]Mount, error) {
	if !validSandbox(sandbox) {
		return nil, fmt.Errorf("sandbox name %q: not a valid name", sandbox)
	}
	project := ProjectID(ws)
	dir := s.SandboxDir(project, sandbox)
	// Nothing kept yet (no repository, no sandbox of the project with a
	// kept file): no git on the sandbox's start, the common case for a
	// project whose sandboxes never ran an agent.
	if !s.hasRepo(project) && s.nothingKept(project) {
		return s.mounts(dir, uid, gid)
	}
	r, unlock, err := s.open(project, ws, true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.syncAll(r, project); err != nil {
		return nil, err
	}
	mounts, err := s.mounts(dir, uid, gid)
	if err != nil || keep {
		return mounts, err
	}
	return mounts, s.checkout(r, sandbox, dir, uid, gid)
}

// hasRepo says whether the project's repository exists.
func (s Store) hasRepo(project string) bool {
	_, err := os.Stat(filepath.Join(s.bare(project), "HEAD"))
	return err == nil
}

// nothingKept says whether no sandbox directory of the project holds a
// file that would be kept (unreadable directories count as holding one,
// so that the slow path reports them).
func (s Store) nothingKept(project string) bool {
	ents, err := os.ReadDir(filepath.Join(s.Work, project))
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	for _, e := range ents {
		if !e.IsDir() || !validSandbox(e.Name()) {
			continue
		}
		if files, err := scan(filepath.Join(s.Work, project, e.Name()), func(string) {}); err != nil || len(files) > 0 {
			return false
		}
	}
	return true
}

// mounts makes the sandbox's directory and its agents' directories,
// owned by uid:gid, and returns their mounts.
func (s Store) mounts(dir string, uid, gid int) ([]Mount, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var mounts []Mount
	for _, a := range Agents {
		d := filepath.Join(dir, a.Name)
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		// Lchown: the guest may have made it a link; then the mount
		// fails (the runtime refuses links) rather than follows it.
		if err := os.Lchown(d, uid, gid); err != nil {
			return nil, err
		}
		mounts = append(mounts, Mount{Source: d, Target: a.Home})
	}
	return mounts, nil
}

// Save commits sandbox's directory and merges it into the main line:
// at the sandbox's stop.
func (s Store) Save(ws, sandbox string) error {
	project := ProjectID(ws)
	if !s.hasRepo(project) && s.nothingKept(project) {
		return nil
	}
	r, unlock, err := s.open(project, ws, true)
	if err != nil {
		return err
	}
	defer unlock()
	return s.sync(r, sandbox, s.SandboxDir(project, sandbox))
}

// Remove saves sandbox's directory and removes it: at the sandbox's
// destroy. Its branch goes too; its commits stay in the main line.
func (s Store) Remove(ws, sandbox string) error {
	project := ProjectID(ws)
	dir := s.SandboxDir(project, sandbox)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !s.hasRepo(project) && s.nothingKept(project) {
		return os.RemoveAll(dir)
	}
	r, unlock, err := s.open(project, ws, true)
	if err != nil {
		return err
	}
	defer unlock()
	if err := s.sync(r, sandbox, dir); err != nil {
		return err
	}
	if tip, _ := r.tip(sandboxRef(sandbox)); tip != "" {
		if _, err := r.git(nil, "update-ref", "-d", sandboxRef(sandbox), tip); err != nil {
			return err
		}
	}
	return os.RemoveAll(dir)
}

// syncAll commits and merges every sandbox directory of the project.
func (s Store) syncAll(r repo, project string) error {
	ents, err := os.ReadDir(filepath.Join(s.Work, project))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !validSandbox(e.Name()) {
			continue
		}
		if err := s.sync(r, e.Name(), filepath.Join(s.Work, project, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// sync commits dir on sandbox's branch and merges the branch into main.
func (s Store) sync(r repo, sandbox, dir string) error {
	if err := s.save(r, sandbox, dir); err != nil {
		return err
	}
	return s.merge(r, sandbox)
}

// save commits dir's versioned files on sandbox's branch, if they
// changed.
func (s Store) save(r repo, sandbox, dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	files, err := scan(dir, func(m string) { s.note("sandbox " + sandbox + ": " + m) })
	if err != nil {
		return err
	}
	ref := sandboxRef(sandbox)
	tip, err := r.tip(ref)
	if err != nil {
		return err
	}
	parent := tip
	if tip == "" {
		// A directory without a branch (its sandbox was never checked
		// out: restored from a checkpoint, or older than this): based
		// on the main line.
		if parent, err = r.tip(mainRef); err != nil {
			return err
		}
	}
	old, err := r.tree(parent)
	if err != nil {
		return err
	}
	// Additive: a file the directory lacks is kept, not deleted. The
	// agents prune old transcripts themselves (Claude Code after 30
	// days), and a directory that never had a file (one without a
	// branch) must not delete it from the project; removing is moat
	// sessions rm's.
	have := map[string]bool{}
	for _, f := range files {
		have[f.path] = true
	}
	for p, e := range old {
		if !have[p] {
			files = append(files, file{path: p, sha: e.sha})
		}
	}
	if tip != "" && sameFiles(old, files) {
		return nil
	}
	for i, f := range files {
		if e, ok := old[f.path]; ok && e.sha == f.sha {
			files[i].content = nil // in the repository already
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	return r.commit(ref, parent, "", "sandbox "+sandbox, files, s.now())
}

func sameFiles(old map[string]entry, files []file) bool {
	if len(old) != len(files) {
		return false
	}
	for _, f := range files {
		if e, ok := old[f.path]; !ok || e.sha != f.sha {
			return false
		}
	}
	return true
}

// merge brings sandbox's branch into the main line: a fast-forward when
// it can, else a merge of the two trees (merge-tree, no work tree), where
// a conflict the union of lines cannot settle takes the sandbox's side.
func (s Store) merge(r repo, sandbox string) error {
	st, err := r.tip(sandboxRef(sandbox))
	if err != nil || st == "" {
		return err
	}
	mt, err := r.tip(mainRef)
	if err != nil {
		return err
	}
	if st == mt {
		return nil
	}
	if mt == "" || r.ancestor(mt, st) {
		_, err := r.git(nil, "update-ref", mainRef, st, mt)
		return err
	}
	if r.ancestor(st, mt) {
		return nil
	}
	out, err := r.gitCode(nil, "merge-tree", "--write-tree", "-z", "--name-only", mt, st)
	var ge *gitError
	if err != nil && !(errors.As(err, &ge) && ge.code == 1) {
		return err
	}
	parts := strings.Split(string(out), "\x00")
	treeSHA := strings.TrimSpace(parts[0])
	var conflicted []string
	for _, p := range parts[1:] {
		if p == "" {
			break
		}
		conflicted = append(conflicted, p)
	}
	merged, err := r.tree(treeSHA)
	if err != nil {
		return err
	}
	if len(conflicted) > 0 {
		theirs, err := r.tree(st)
		if err != nil {
			return err
		}
		ours, err := r.tree(mt)
		if err != nil {
			return err
		}
		for _, p := range conflicted {
			if e, ok := theirs[p]; ok {
				merged[p] = e
			} else if e, ok := ours[p]; ok {
				merged[p] = e
			} else {
				delete(merged, p)
			}
			s.note(fmt.Sprintf("sandbox %s: %s changed in the project too; kept the sandbox's version", sandbox, p))
		}
	}
	files := make([]file, 0, len(merged))
	for p, e := range merged {
		files = append(files, file{path: p, sha: e.sha})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	return r.commit(mainRef, mt, st, "merge sandbox "+sandbox, files, s.now())
}

// ancestor reports whether a is an ancestor of b.
func (r repo) ancestor(a, b string) bool {
	_, err := r.gitCode(nil, "merge-base", "--is-ancestor", a, b)
	return err == nil
}

// checkout writes the main line into sandbox's directory (whose files
// were just committed on its branch) and points the branch at it.
func (s Store) checkout(r repo, sandbox, dir string, uid, gid int) error {
	mt, err := r.tip(mainRef)
	if err != nil || mt == "" {
		return err
	}
	st, err := r.tip(sandboxRef(sandbox))
	if err != nil {
		return err
	}
	had, err := r.tree(st)
	if err != nil {
		return err
	}
	// What the directory holds, not what its branch says: a directory
	// that had no branch when it was committed (its sandbox started
	// before the project kept anything) got one based on the main line,
	// whose files it lacks.
	present, err := scan(dir, func(string) {})
	if err != nil {
		return err
	}
	sums := make(map[string]string, len(present))
	for _, f := range present {
		sums[f.path] = f.sha
	}
	for p, e := range had {
		if sums[p] != e.sha {
			delete(had, p)
		}
	}
	want, err := r.tree(mt)
	if err != nil {
		return err
	}
	if err := writeTree(dir, had, want, r.blobs, uid, gid); err != nil {
		// The branch stays where it was: what could not be written is
		// then not taken, at the next commit, for a deletion.
		s.note(fmt.Sprintf("sandbox %s: %v; left as it was", sandbox, err))
		return nil
	}
	_, err = r.git(nil, "update-ref", sandboxRef(sandbox), mt, st)
	return err
}

// lock is moat's file lock: one writer per project repository.
func lock(path string) (func(), error) { return state.Lock(path) }
