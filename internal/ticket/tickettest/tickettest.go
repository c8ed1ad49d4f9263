// Package tickettest is what ticket mode's tests stand on: real git
// against local bare repositories that stand in for the remotes, and a
// stand-in for gh on PATH that records each call and answers with gh's
// own JSON shapes (there is no forge on a test machine).
package tickettest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// GitEnv gives git an identity and a HOME of its own, so that no config
// of the machine's changes what the test sees.
func GitEnv(t testing.TB) {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	for k, v := range map[string]string{
		"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com",
		"GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.com",
	} {
		t.Setenv(k, v)
	}
	if err := os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[init]\n\tdefaultBranch = main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TryGit runs git in dir and returns its trimmed output.
func TryGit(dir string, args ...string) (string, error) {
	c := exec.Command("git", append([]string{"-C", dir}, args...)...)
	out, err := c.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// Git is TryGit that fails the test.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := TryGit(dir, args...)
	if err != nil {
		t.Fatalf("git %s in %s: %v: %s", strings.Join(args, " "), dir, err, out)
	}
	return out
}

// Remote makes root/NAME.git, a bare repository with one commit on main,
// and root/NAME, its clone: a main repository whose origin it is.
func Remote(t testing.TB, root, name string) (bare, clone string) {
	t.Helper()
	bare, clone = filepath.Join(root, name+".git"), filepath.Join(root, name)
	Git(t, root, "init", "-q", "--bare", "-b", "main", bare)
	seed := filepath.Join(t.TempDir(), "seed")
	Git(t, root, "clone", "-q", bare, seed)
	if err := os.WriteFile(filepath.Join(seed, "README"), []byte(name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	Git(t, seed, "add", "README")
	Git(t, seed, "commit", "-q", "-m", "start "+name)
	Git(t, seed, "push", "-q", "origin", "HEAD:refs/heads/main")
	Git(t, root, "clone", "-q", bare, clone)
	return bare, clone
}

// MergeUpstream merges branch into the bare repository's main with a
// merge commit, as a forge's merge button does.
func MergeUpstream(t testing.TB, bare, branch string) {
	t.Helper()
	c := filepath.Join(t.TempDir(), "merge")
	Git(t, filepath.Dir(bare), "clone", "-q", bare, c)
	Git(t, c, "merge", "-q", "--no-ff", "-m", "Merge "+branch, "origin/"+branch)
	Git(t, c, "push", "-q", "origin", "HEAD:refs/heads/main")
}

// PushUpstream commits file with content on the bare repository's main,
// as someone else's work would land, and returns the commit.
func PushUpstream(t testing.TB, bare, file, content string) string {
	t.Helper()
	c := filepath.Join(t.TempDir(), "up")
	Git(t, filepath.Dir(bare), "clone", "-q", bare, c)
	if err := os.WriteFile(filepath.Join(c, file), []byte(content+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	Git(t, c, "add", file)
	Git(t, c, "commit", "-q", "-m", "upstream "+file)
	Git(t, c, "push", "-q", "origin", "HEAD:refs/heads/main")
	return Git(t, c, "rev-parse", "HEAD")
}

// GH is the gh stand-in: an executable script named gh first on PATH.
// It knows exactly the calls moat makes (pr list, pr create, pr edit)
// and refuses any other, so a new call fails the tests until it is
// added here and to docs/tickets.md. Pull requests live under Dir as
// prs/REPO/NUMBER/{head,state,url,title,body}, REPO being the last
// element of the directory gh runs in (the main repository).
type GH struct{ Dir string }

const ghScript = `#!/bin/sh
# gh stand-in (internal/ticket/tickettest): records each call, answers
# with gh's JSON shapes.
d="$GH_STANDIN_DIR"
repo=$(basename "$PWD")
printf '%s\t%s\n' "$repo" "$(printf '%s ' "$@" | tr '\n' ' ')" >> "$d/calls"
[ "$1" = pr ] || { echo "gh stand-in: unknown command: $*" >&2; exit 1; }
cmd=$2; shift 2
head= state= body= title= base= json= num=
if [ "$cmd" = edit ]; then num=$1; shift; fi
while [ $# -gt 0 ]; do
	case $1 in
	--head) head=$2;; --state) state=$2;; --body) body=$2;;
	--title) title=$2;; --base) base=$2;; --json) json=$2;;
	*) echo "gh stand-in: unknown flag: $1" >&2; exit 1;;
	esac
	shift 2
done
r="$d/prs/$repo"
mkdir -p "$r"
case $cmd in
create)
	[ -n "$head" ] && [ -n "$base" ] && [ -n "$title" ] || { echo "gh stand-in: create needs --head, --base, --title" >&2; exit 1; }
	for p in "$r"/*/; do
		[ -f "$p/head" ] || continue
		if [ "$(cat "$p/head")" = "$head" ] && [ "$(cat "$p/state")" = OPEN ]; then
			echo "a pull request for branch \"$head\" into branch \"$base\" already exists:" >&2; cat "$p/url" >&2; exit 1
		fi
	done
	n=$(( $(cat "$r/next" 2>/dev/null || echo 0) + 1 )); echo $n > "$r/next"
	p="$r/$n"; mkdir -p "$p"
	echo "$head" > "$p/head"; echo OPEN > "$p/state"; echo "$title" > "$p/title"
	printf '%s' "$body" > "$p/body"
	echo "https://forge.test/owner/$repo/pull/$n" | tee "$p/url"
	;;
list)
	[ "$json" = "url,number,state" ] || { echo "gh stand-in: unexpected --json $json" >&2; exit 1; }
	sep=
	printf '['
	for n in $(ls "$r" | grep -v next | sort -rn); do
		p="$r/$n"; st=$(cat "$p/state")
		[ -z "$head" ] || [ "$(cat "$p/head")" = "$head" ] || continue
		case ${state:-open} in
		all) ;; open) [ "$st" = OPEN ] || continue;;
		merged) [ "$st" = MERGED ] || continue;; closed) [ "$st" = CLOSED ] || continue;;
		*) echo "gh stand-in: bad --state $state" >&2; exit 1;;
		esac
		printf '%s{"number":%s,"state":"%s","url":"%s"}' "$sep" "$n" "$st" "$(cat "$p/url")"
		sep=,
	done
	printf ']\n'
	;;
edit)
	[ -d "$r/$num" ] || { echo "GraphQL: Could not resolve to a PullRequest with the number of $num." >&2; exit 1; }
	printf '%s' "$body" > "$r/$num/body"
	;;
*) echo "gh stand-in: unknown command: pr $cmd" >&2; exit 1;;
esac
`

// NewGH writes the stand-in and puts it first on PATH.
func NewGH(t testing.TB) *GH {
	t.Helper()
	g := &GH{Dir: t.TempDir()}
	bin := filepath.Join(g.Dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "gh"), []byte(ghScript), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GH_STANDIN_DIR", g.Dir)
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return g
}

// Calls is every call so far whose arguments start with prefix, as
// "ARGS" (the repository left out), in order.
func (g *GH) Calls(t testing.TB, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.Dir, "calls"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		_, args, ok := strings.Cut(l, "\t")
		if ok && strings.HasPrefix(args, prefix) {
			out = append(out, strings.TrimSpace(args))
		}
	}
	return out
}

// Body is the description of the pull request at url in repo.
func (g *GH) Body(t testing.TB, repo, url string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.Dir, "prs", repo, url[strings.LastIndexByte(url, '/')+1:], "body"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// SetState changes a pull request's state, as a merge or a close on the
// forge would.
func (g *GH) SetState(t testing.TB, repo string, number int, state string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(g.Dir, "prs", repo, strconv.Itoa(number), "state"), []byte(state+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
