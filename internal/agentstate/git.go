package agentstate

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// repo is a project's bare repository. Every git moat runs on it is
// plumbing (fast-import, ls-tree, merge-tree, cat-file): nothing reads a
// work tree, so no attribute, filter or hook the guest could plant is
// ever consulted, and the configuration is moat's alone (no system or
// global file, hooks pointed at /dev/null).
type repo struct{ dir string }

// mainRef is the project's main line; sandboxRef(name) each sandbox's.
const mainRef = "refs/heads/main"

func sandboxRef(name string) string { return "refs/heads/sandbox/" + name }

// attributes are the repository's only attributes, in info/attributes:
// transcripts and histories are append-only logs of independent lines,
// so two sandboxes' appends are both kept.
const attributes = "*.jsonl merge=union\n"

// initRepo makes dir a bare repository if it is not one, and rewrites
// its attributes.
func initRepo(dir string) (repo, error) {
	r := repo{dir: dir}
	if _, err := os.Stat(filepath.Join(dir, "HEAD")); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return r, fmt.Errorf("creating %s: %w", dir, err)
		}
		if _, err := r.git(nil, "init", "--quiet", "--bare", "--object-format=sha1", "--initial-branch=main"); err != nil {
			return r, err
		}
		// init copies templates (sample hooks): harmless with hooksPath
		// at /dev/null, but nothing of them is wanted.
		os.RemoveAll(filepath.Join(dir, "hooks"))
	}
	if err := os.MkdirAll(filepath.Join(dir, "info"), 0o700); err != nil {
		return r, err
	}
	if err := os.WriteFile(filepath.Join(dir, "info", "attributes"), []byte(attributes), 0o600); err != nil {
		return r, fmt.Errorf("writing the repository's attributes: %w", err)
	}
	return r, nil
}

// git runs git on the repository with moat's own configuration only.
func (r repo) git(stdin io.Reader, args ...string) ([]byte, error) {
	out, err := r.gitCode(stdin, args...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (r repo) gitCode(stdin io.Reader, args ...string) ([]byte, error) {
	full := append([]string{
		"-c", "core.hooksPath=/dev/null",
		"-c", "core.attributesFile=/dev/null",
		"-c", "safe.directory=" + r.dir,
		"-c", "gc.auto=0",
		"--git-dir=" + r.dir,
	}, args...)
	cmd := exec.Command("git", full...)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + r.dir, "LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_ATTR_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
	}
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out, &gitError{args: args, code: ee.ExitCode(), stderr: strings.TrimSpace(stderr.String())}
		}
		return out, fmt.Errorf("running git %s: %w", args[0], err)
	}
	return out, nil
}

type gitError struct {
	args   []string
	code   int
	stderr string
}

func (e *gitError) Error() string {
	return fmt.Sprintf("git %s: exit %d: %s", strings.Join(e.args, " "), e.code, e.stderr)
}

// tip is the commit ref points at, "" when it does not exist.
func (r repo) tip(ref string) (string, error) {
	out, err := r.gitCode(nil, "rev-parse", "--verify", "-q", ref+"^{commit}")
	var ge *gitError
	if errors.As(err, &ge) && ge.code == 1 {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// entry is a file of a tree: its blob and size.
type entry struct {
	sha  string
	size int64
}

// tree lists rev's files (rev "": none).
func (r repo) tree(rev string) (map[string]entry, error) {
	m := map[string]entry{}
	if rev == "" {
		return m, nil
	}
	out, err := r.git(nil, "ls-tree", "-r", "-l", "-z", "--full-tree", rev)
	if err != nil {
		return nil, err
	}
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		// "<mode> SP <type> SP <sha> SP+ <size> TAB <path>"
		meta, path, ok := bytes.Cut(rec, []byte{'\t'})
		f := strings.Fields(string(meta))
		if !ok || len(f) != 4 || f[1] != "blob" {
			continue
		}
		size, _ := strconv.ParseInt(f[3], 10, 64)
		m[string(path)] = entry{sha: f[2], size: size}
	}
	return m, nil
}

// blobSHA is git's name for content as a blob (SHA-1 repositories).
func blobSHA(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// file is one path of a commit to make: its content, or the blob it
// has already.
type file struct {
	path    string
	sha     string
	content []byte // nil: sha is in the repository
}

// commit makes a commit of exactly files on ref, whose tip must be
// parent ("": a new ref), with merge as a second parent when set. It
// goes through fast-import, which neither reads a work tree nor runs a
// hook, and refuses to move ref unless parent is still its tip.
func (r repo) commit(ref, parent, merge, msg string, files []file, when time.Time) error {
	var b bytes.Buffer
	b.WriteString("feature done\n")
	fmt.Fprintf(&b, "commit %s\n", ref)
	fmt.Fprintf(&b, "committer moat <moat@localhost> %d +0000\n", when.Unix())
	fmt.Fprintf(&b, "data %d\n%s\n", len(msg), msg)
	if parent != "" {
		fmt.Fprintf(&b, "from %s\n", parent)
	}
	if merge != "" {
		fmt.Fprintf(&b, "merge %s\n", merge)
	}
	b.WriteString("deleteall\n")
	for _, f := range files {
		if f.content == nil {
			fmt.Fprintf(&b, "M 100644 %s %s\n", f.sha, f.path)
			continue
		}
		fmt.Fprintf(&b, "M 100644 inline %s\ndata %d\n", f.path, len(f.content))
		b.Write(f.content)
		b.WriteByte('\n')
	}
	b.WriteString("\ndone\n")
	_, err := r.git(&b, "fast-import", "--quiet", "--date-format=raw")
	return err
}

// blobs reads the blobs shas through one cat-file.
func (r repo) blobs(shas []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(shas) == 0 {
		return out, nil
	}
	var in bytes.Buffer
	for _, s := range shas {
		in.WriteString(s + "\n")
	}
	raw, err := r.git(&in, "cat-file", "--batch")
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(bytes.NewReader(raw))
	for range shas {
		head, err := br.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("reading cat-file's answer: %w", err)
		}
		f := strings.Fields(head)
		if len(f) != 3 || f[1] != "blob" {
			return nil, fmt.Errorf("cat-file: unexpected %q", strings.TrimSpace(head))
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			return nil, fmt.Errorf("cat-file: unexpected %q", strings.TrimSpace(head))
		}
		b := make([]byte, n+1)
		if _, err := io.ReadFull(br, b); err != nil {
			return nil, fmt.Errorf("reading blob %s: %w", f[0], err)
		}
		out[f[0]] = b[:n]
	}
	return out, nil
}
