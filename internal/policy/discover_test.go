package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeTree writes files (path relative to root → content) under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeRun answers the commands Discover may run from a table and
// records what was asked.
type fakeRun struct {
	out   map[string]string
	asked []string
}

func (f *fakeRun) run(name string, args ...string) (string, error) {
	cmd := strings.Join(append([]string{name}, args...), " ")
	f.asked = append(f.asked, cmd)
	if out, ok := f.out[cmd]; ok {
		return out, nil
	}
	return "", errors.New("not found")
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// summary is "entry <- source" per rule, checking the fixed fields.
func summary(t *testing.T, rules []Rule) []string {
	t.Helper()
	var out []string
	for _, r := range rules {
		if r.Action != Allow || r.Layer != LayerNamed || !strings.HasPrefix(r.Source, "discovered: ") {
			t.Errorf("rule %+v: want an allow in layer policy from \"discovered: ...\"", r)
		}
		if _, err := ParseEntry(r.Entry); err != nil {
			t.Errorf("rule entry %q does not parse: %v", r.Entry, err)
		}
		out = append(out, r.Entry+" <- "+strings.TrimPrefix(r.Source, "discovered: "))
	}
	return out
}

func diffLists(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

func TestDiscover(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"etc/apt/sources.list": `# the main mirror
deb http://mirror.test.example/debian bookworm main
deb-src http://mirror.test.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] https://secure.test.example:8443/repo stable main
deb [ arch=amd64 ] https://Spaced.Test.Example./repo stable main # trailing comment
# deb http://commented.test.example/debian bookworm main
deb file:/srv/local ./
deb cdrom:[Debian GNU/Linux]/ bookworm main
deb mirror+http://mlist.test.example/mirrors.txt bookworm main
deb http://127.0.0.1:3142/debian bookworm main
deb http://10.0.0.5:3142/debian bookworm main
deb http://192.0.2.5:3142/debian bookworm main
deb http://[2001:db8::5]/debian bookworm main
deb https://secure.test.example:443/other stable main
rubbish line
`,
		"etc/apt/sources.list.d/extra.list": "deb https://extra.test.example/apt stable main\r\n",
		"etc/apt/sources.list.d/zz.sources": `Types: deb deb-src
URIs: https://deb822.test.example/debian
 https://continued.test.example/debian
Suites: bookworm
Components: main

# a disabled stanza
Types: deb
URIs: https://disabled.test.example/debian
Suites: bookworm
Enabled: no

Types: deb
uris: http://lower.test.example/debian http://second.test.example/debian
Suites: bookworm
`,
		"etc/apt/sources.list.d/notes.txt": "deb https://ignored.test.example/ x main\n",
		"etc/apk/repositories": `https://apk.test.example/alpine/v3.20/main
@edge https://edge.test.example/alpine/edge/testing
/media/cdrom/apks
# https://commented.test.example/alpine
`,
		"etc/pip.conf": `[global]
index-url = https://pypi.test.example/simple
extra-index-url =
    https://extra1.test.example/simple
    https://user:secret@extra2.test.example:8080/simple
trusted-host = trusted.test.example
; index-url = https://commented.test.example/simple
`,
		"root/.config/pip/pip.conf": "[install]\nfind_links = https://links.test.example/wheels\n",
		"etc/npmrc":                 "registry=https://npm.test.example/\n",
		"root/.npmrc": `@corp:registry = https://corp-npm.test.example:4873/
//corp-npm.test.example:4873/:_authToken=SECRET
registry=${NPM_REGISTRY}
`,
		"home/dev/.npmrc": "registry=https://home-npm.test.example\n",
		"root/.cargo/config.toml": `[registries.corp]
index = "sparse+https://cargo.test.example/index/"

[source.mirror]
registry = "https://git-cargo.test.example/index.git"

[registries]
inline = { index = "ssh://git@ssh-cargo.test.example:2222/index.git" }
# index = "https://commented.test.example/"

[http]
proxy = "proxy.test.example:3128"
`,
	})
	run := &fakeRun{out: map[string]string{
		"npm config get registry": "https://npmcli.test.example/\n",
		"go env GOPROXY GOSUMDB":  "https://goproxy.test.example,direct\nsumdb.test.example+abc123 https://sumdb-url.test.example\n",
	}}
	env := envOf(map[string]string{
		"HOME":                "/home/dev",
		"PIP_INDEX_URL":       "https://envpip.test.example/simple",
		"PIP_EXTRA_INDEX_URL": "https://envx1.test.example/ https://envx2.test.example/",
	})
	got := summary(t, Discover(root, run.run, env))
	want := []string{
		"mirror.test.example <- /etc/apt/sources.list",
		"secure.test.example:8443 <- /etc/apt/sources.list",
		"Spaced.Test.Example. <- /etc/apt/sources.list",
		"mlist.test.example <- /etc/apt/sources.list",
		"192.0.2.5:3142 <- /etc/apt/sources.list",
		"2001:db8::5 <- /etc/apt/sources.list",
		"secure.test.example <- /etc/apt/sources.list", // :443 is https's default: any port
		"extra.test.example <- /etc/apt/sources.list.d/extra.list",
		"deb822.test.example <- /etc/apt/sources.list.d/zz.sources",
		"continued.test.example <- /etc/apt/sources.list.d/zz.sources",
		"lower.test.example <- /etc/apt/sources.list.d/zz.sources",
		"second.test.example <- /etc/apt/sources.list.d/zz.sources",
		"apk.test.example <- /etc/apk/repositories",
		"edge.test.example <- /etc/apk/repositories",
		"pypi.test.example <- /etc/pip.conf",
		"extra1.test.example <- /etc/pip.conf",
		"extra2.test.example:8080 <- /etc/pip.conf",
		"links.test.example <- /root/.config/pip/pip.conf",
		"envpip.test.example <- $PIP_INDEX_URL",
		"envx1.test.example <- $PIP_EXTRA_INDEX_URL",
		"envx2.test.example <- $PIP_EXTRA_INDEX_URL",
		"npm.test.example <- /etc/npmrc",
		"corp-npm.test.example:4873 <- /root/.npmrc",
		"home-npm.test.example <- /home/dev/.npmrc",
		"npmcli.test.example <- npm config get registry",
		"goproxy.test.example <- go env GOPROXY GOSUMDB",
		"sumdb-url.test.example <- go env GOPROXY GOSUMDB",
		"cargo.test.example <- /root/.cargo/config.toml",
		"git-cargo.test.example <- /root/.cargo/config.toml",
		"ssh-cargo.test.example:2222 <- /root/.cargo/config.toml",
	}
	diffLists(t, got, want)
	for _, r := range got {
		if strings.Contains(r, "SECRET") || strings.Contains(r, "secret") {
			t.Errorf("a credential leaked into %q", r)
		}
	}
}

// TestDiscoverGo covers the forms of GOPROXY and GOSUMDB, from the
// environment and from `go env`.
func TestDiscoverGo(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		goEnv string // output of go env GOPROXY GOSUMDB; "" = the command fails
		want  []string
		asked bool
	}{
		{"env only", map[string]string{"GOPROXY": "https://p1.test.example,https://p2.test.example:8443|direct", "GOSUMDB": "sum.test.example"}, "",
			[]string{"p1.test.example <- $GOPROXY", "p2.test.example:8443 <- $GOPROXY", "sum.test.example <- $GOSUMDB"}, false},
		{"off", map[string]string{"GOPROXY": "off", "GOSUMDB": "off"}, "", nil, false},
		{"direct", map[string]string{"GOPROXY": "direct", "GOSUMDB": "sum.test.example+key"}, "",
			[]string{"sum.test.example <- $GOSUMDB"}, false},
		{"sumdb with url", map[string]string{"GOPROXY": "direct", "GOSUMDB": "sum.test.example+key https://sum-mirror.test.example/x"}, "",
			[]string{"sum-mirror.test.example <- $GOSUMDB"}, false},
		{"file proxy", map[string]string{"GOPROXY": "file:///srv/goproxy", "GOSUMDB": "off"}, "", nil, false},
		{"go env for both", nil, "https://gp.test.example\nsum.test.example\n",
			[]string{"gp.test.example <- go env GOPROXY GOSUMDB", "sum.test.example <- go env GOPROXY GOSUMDB"}, true},
		{"go env for the sum db", map[string]string{"GOPROXY": "https://mine.test.example"}, "https://ignored.test.example\nsum.test.example\n",
			[]string{"mine.test.example <- $GOPROXY", "sum.test.example <- go env GOPROXY GOSUMDB"}, true},
		{"go env fails", map[string]string{"GOPROXY": "https://mine.test.example"}, "",
			[]string{"mine.test.example <- $GOPROXY"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := &fakeRun{out: map[string]string{}}
			if tt.goEnv != "" {
				run.out["go env GOPROXY GOSUMDB"] = tt.goEnv
			}
			got := summary(t, Discover(t.TempDir(), run.run, envOf(tt.env)))
			diffLists(t, got, tt.want)
			asked := strings.Contains(strings.Join(run.asked, "\n"), "go env")
			if asked != tt.asked {
				t.Errorf("ran go env: %v, want %v (asked %q)", asked, tt.asked, run.asked)
			}
		})
	}
}

// TestDiscoverNoRunNoEnv: an image's rootfs with no commands and no
// environment still yields its files' hosts.
func TestDiscoverNoRunNoEnv(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{"etc/apk/repositories": "https://apk.test.example/main\n"})
	diffLists(t, summary(t, Discover(root, nil, nil)), []string{"apk.test.example <- /etc/apk/repositories"})
	if got := Discover(filepath.Join(root, "missing"), nil, nil); len(got) != 0 {
		t.Errorf("Discover on a missing root = %v", got)
	}
}

// TestDiscoverStaysInRoot: a symbolic link in an image cannot make
// Discover read a file outside the image.
func TestDiscoverStaysInRoot(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	root := filepath.Join(dir, "root")
	writeTree(t, outside, map[string]string{"repositories": "https://escaped.test.example/\n", "npmrc": "registry=https://escaped-npm.test.example/\n"})
	writeTree(t, root, map[string]string{"etc/apt/sources.list.d/ok.list": "deb https://inside.test.example/ x main\n"})
	if err := os.MkdirAll(filepath.Join(root, "etc/apk"), 0o755); err != nil {
		t.Fatal(err)
	}
	// One absolute link, one relative link climbing out.
	if err := os.Symlink(filepath.Join(outside, "repositories"), filepath.Join(root, "etc/apk/repositories")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../outside/npmrc", filepath.Join(root, "etc/npmrc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "root")); err != nil {
		t.Fatal(err)
	}
	got := summary(t, Discover(root, nil, nil))
	diffLists(t, got, []string{"inside.test.example <- /etc/apt/sources.list.d/ok.list"})
}

func TestAptLineURI(t *testing.T) {
	tests := []struct{ line, want string }{
		{"deb http://a.test.example/ x main", "http://a.test.example/"},
		{"  deb   http://a.test.example/ x main", "http://a.test.example/"},
		{"deb\thttp://a.test.example/ x main", "http://a.test.example/"},
		{"deb [trusted=yes] http://a.test.example/ ./", "http://a.test.example/"},
		{"deb [trusted=yes http://a.test.example/", ""},
		{"deb []", ""},
		{"deb", ""},
		{"#deb http://a.test.example/ x", ""},
		{"rpm http://a.test.example/ x", ""},
	}
	for _, tt := range tests {
		if got := aptLineURI(tt.line); got != tt.want {
			t.Errorf("aptLineURI(%q) = %q, want %q", tt.line, got, tt.want)
		}
	}
}
