package ticket

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// host runs the host's git and gh as the owner of a main repository.
// moat runs as root (through sudo); git run as root would leave root's
// files in the user's .git (a ref, a reflog, the worktree itself) that
// the user's own git, and the sandbox's agent with the user's uid, could
// then not write, and would push with root's credentials rather than the
// user's.
type host struct {
	dir  string // where the command runs
	cred *syscall.Credential
	home string
	// Progress receives git's and gh's stderr (push, fetch); nil: kept
	// for the error only.
	progress io.Writer
}

func hostFor(main string, progress io.Writer) host {
	h := host{dir: main, progress: progress}
	var st syscall.Stat_t
	if os.Geteuid() != 0 || syscall.Stat(main, &st) != nil || st.Uid == 0 {
		return h
	}
	h.cred = &syscall.Credential{Uid: st.Uid, Gid: st.Gid}
	if u, err := user.LookupId(strconv.Itoa(int(st.Uid))); err == nil {
		h.home = u.HomeDir
		if gids, err := u.GroupIds(); err == nil {
			for _, g := range gids {
				if n, err := strconv.Atoi(g); err == nil {
					h.cred.Groups = append(h.cred.Groups, uint32(n))
				}
			}
		}
	}
	return h
}

func (h host) cmd(name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Dir = h.dir
	c.Env = os.Environ()
	if h.cred != nil {
		c.SysProcAttr = &syscall.SysProcAttr{Credential: h.cred}
		if h.home != "" {
			c.Env = append(c.Env, "HOME="+h.home)
		}
	}
	// Never a prompt for a password on a terminal moat's caller may not
	// be watching: a missing credential is an error that says so.
	c.Env = append(c.Env, "GIT_TERMINAL_PROMPT=0")
	return c
}

// run runs name with args and returns its stdout, trimmed. An error
// carries the command and its stderr.
func (h host) run(name string, args ...string) (string, error) {
	c := h.cmd(name, args...)
	var out, errb bytes.Buffer
	c.Stdout = &out
	c.Stderr = &errb
	if h.progress != nil {
		c.Stderr = io.MultiWriter(&errb, h.progress)
	}
	if err := c.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = err.Error()
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return strings.TrimSpace(out.String()), &cmdError{cmd: name + " " + strings.Join(args, " "), dir: h.dir, msg: msg, code: ee.ExitCode()}
		}
		if name == "gh" && errors.Is(err, exec.ErrNotFound) {
			return "", fmt.Errorf("%w: gh, GitHub's command line, is not on PATH; install it and log in (gh auth login) for pull requests", ErrNoGH)
		}
		return "", fmt.Errorf("running %s in %s: %w", name, h.dir, err)
	}
	return strings.TrimSpace(out.String()), nil
}

func (h host) git(args ...string) (string, error) { return h.run("git", args...) }

// ErrNoGH is returned when gh is not installed.
var ErrNoGH = errors.New("no gh")

// cmdError is a command that ran and failed.
type cmdError struct {
	cmd, dir, msg string
	code          int
}

func (e *cmdError) Error() string { return fmt.Sprintf("%s (in %s): %s", e.cmd, e.dir, e.msg) }

// exitedWith reports whether err is a command that exited with code.
func exitedWith(err error, code int) bool {
	var ce *cmdError
	return errors.As(err, &ce) && ce.code == code
}

// repo is what moat reads of a main repository before making a worktree.
type repo struct {
	top    string // its work tree
	common string // its .git
	remote string // "origin", its only remote, or ""
}

func inspect(h host) (repo, error) {
	top, err := h.git("rev-parse", "--show-toplevel")
	if err != nil {
		return repo{}, fmt.Errorf("%s is not a git repository with a work tree: %w", h.dir, err)
	}
	common, err := h.git("rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return repo{}, err
	}
	r := repo{top: top, common: common}
	remotes, err := h.git("remote")
	if err != nil {
		return repo{}, err
	}
	names := strings.Fields(remotes)
	switch {
	case contains(names, "origin"):
		r.remote = "origin"
	case len(names) == 1:
		r.remote = names[0]
	}
	return r, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// refExists reports whether the full ref name exists.
func (h host) refExists(ref string) bool {
	_, err := h.git("show-ref", "--verify", "--quiet", ref)
	return err == nil
}

// defaultBranch is a repository's default branch and the ref a new
// branch starts from: the remote's HEAD (refs/remotes/origin/HEAD, set by
// clone, or by git remote set-head origin --auto), else the remote's
// main, else its master; without a remote, the local main or master.
func defaultBranch(h host, remote string) (base, start string, err error) {
	if remote != "" {
		if ref, err := h.git("symbolic-ref", "--quiet", "refs/remotes/"+remote+"/HEAD"); err == nil {
			if b, ok := strings.CutPrefix(ref, "refs/remotes/"+remote+"/"); ok && b != "" {
				return b, ref, nil
			}
		}
		for _, b := range []string{"main", "master"} {
			if ref := "refs/remotes/" + remote + "/" + b; h.refExists(ref) {
				return b, ref, nil
			}
		}
	}
	for _, b := range []string{"main", "master"} {
		if ref := "refs/heads/" + b; h.refExists(ref) {
			return b, ref, nil
		}
	}
	return "", "", fmt.Errorf("cannot tell the default branch of %s: no %s/HEAD, main or master; set it with: git -C %s remote set-head origin --auto",
		h.dir, orDefault(remote, "origin"), h.dir)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// baseRef is the ref w's default branch is compared with.
func (w *Worktree) baseRef() string {
	if w.Remote != "" {
		return "refs/remotes/" + w.Remote + "/" + w.Base
	}
	return "refs/heads/" + w.Base
}

// gitWT runs git in w's worktree as the host, with the admin directory
// moat recorded rather than the one the worktree's .git file (which the
// guest can rewrite) names.
func (w *Worktree) gitWT(h host, args ...string) (string, error) {
	h.dir = w.Main
	return h.git(append([]string{"--git-dir=" + w.Admin, "--work-tree=" + w.Path}, args...)...)
}

// fetch brings the remote's branches up to date, with the host's
// credentials.
func fetch(h host, remote string) error {
	if remote == "" {
		return nil
	}
	if _, err := h.git("fetch", "--quiet", "--prune", remote); err != nil {
		return fmt.Errorf("fetching %s in %s: %w", remote, h.dir, err)
	}
	return nil
}

// Dirty lists w's uncommitted changes as git status --porcelain prints
// them (empty: clean).
func (w *Worktree) Dirty() ([]string, error) {
	out, err := w.gitWT(hostFor(w.Main, nil), "status", "--porcelain")
	if err != nil {
		return nil, err
	}
	if out == "" {
		return nil, nil
	}
	return strings.Split(out, "\n"), nil
}

// AheadBehind counts the commits of w's branch not on its default
// branch, and the other way round.
func (w *Worktree) AheadBehind() (ahead, behind int, err error) {
	h := hostFor(w.Main, nil)
	out, err := h.git("rev-list", "--left-right", "--count", w.baseRef()+"...refs/heads/"+w.Branch)
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("git rev-list --count printed %q", out)
	}
	behind, _ = strconv.Atoi(f[0])
	ahead, _ = strconv.Atoi(f[1])
	return ahead, behind, nil
}

// Unpushed counts w's commits that its remote does not have: those past
// the remote's copy of the branch, or, never pushed, past the default
// branch. Without a remote nothing can be pushed, and all of them count.
func (w *Worktree) Unpushed() (int, error) {
	h := hostFor(w.Main, nil)
	from := w.baseRef()
	if w.Remote != "" {
		if r := "refs/remotes/" + w.Remote + "/" + w.Branch; h.refExists(r) {
			from = r
		}
	}
	out, err := h.git("rev-list", "--count", from+"..refs/heads/"+w.Branch)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(out)
}

// addWorktree makes w's worktree on a new branch from start, or on the
// existing branch.
func addWorktree(h host, w *Worktree, start string) error {
	args := []string{"worktree", "add", "--quiet"}
	if h.refExists("refs/heads/" + w.Branch) {
		args = append(args, w.Path, w.Branch)
	} else {
		// --no-track: the branch's upstream is the ticket's own remote
		// branch, set by moat pr's push, not the default branch.
		args = append(args, "--no-track", "-b", w.Branch, w.Path, start)
	}
	if err := os.MkdirAll(filepath.Dir(w.Path), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(w.Path), err)
	}
	if h.cred != nil {
		_ = os.Chown(filepath.Dir(w.Path), int(h.cred.Uid), int(h.cred.Gid))
	}
	if _, err := h.git(args...); err != nil {
		return fmt.Errorf("creating the worktree of %s: %w", w.Repo, err)
	}
	// Read now, while the worktree's .git file is git's own.
	wh := h
	wh.dir = w.Path
	admin, err := wh.git("rev-parse", "--path-format=absolute", "--git-dir")
	if err != nil {
		return err
	}
	w.Admin = admin
	return nil
}

// removeWorktree removes w's worktree and what git keeps of it; the
// branch and its commits stay in the main repository.
func removeWorktree(h host, w *Worktree) error {
	if _, err := os.Stat(w.Path); err == nil {
		// Twice --force: a locked worktree (the guest may have written
		// the lock) goes too.
		if _, err := h.git("worktree", "remove", "--force", "--force", w.Path); err != nil {
			// The guest may have rewritten the worktree's .git file so
			// that git no longer recognizes it; the directory is moat's.
			if rerr := os.RemoveAll(w.Path); rerr != nil {
				return fmt.Errorf("removing the worktree %s: %w (git said: %v)", w.Path, rerr, err)
			}
		}
	}
	if _, err := h.git("worktree", "prune"); err != nil {
		return fmt.Errorf("pruning worktrees of %s: %w", w.Main, err)
	}
	return nil
}
