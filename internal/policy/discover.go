package policy

import (
	"io"
	"io/fs"
	"net/netip"
	"net/url"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// Discover finds the package mirrors and registries a sandbox's tools are
// configured to use, so the default policy does not have to guess them:
// the same image fetches from different mirrors in different places, and
// a company proxy in GOPROXY or an npmrc is exactly what must be allowed.
//
// root is the tree to read: "/" for the host, or an image's rootfs. It is
// opened as an os.Root, so a symbolic link in an image cannot make
// Discover read host files outside it. It reads:
//
//   - etc/apt/sources.list, etc/apt/sources.list.d/*.list (one-line form)
//     and *.sources (deb822 URIs:)
//   - etc/apk/repositories
//   - etc/pip.conf, etc/xdg/pip/pip.conf and the pip.conf files in the
//     home directories, plus $PIP_INDEX_URL, $PIP_EXTRA_INDEX_URL
//   - etc/npmrc, usr/etc/npmrc, usr/local/etc/npmrc, ~/.npmrc, and
//     `npm config get registry`
//   - $GOPROXY and $GOSUMDB, else `go env GOPROXY GOSUMDB`
//   - ~/.cargo/config.toml (and the older ~/.cargo/config)
//
// The home directories are /root and $HOME, both inside root. run runs a
// command on the host and may be nil (no commands, e.g. for an image
// whose tools the host cannot run); env reads the host's environment and
// may be nil. Errors are not reported: a file that is missing or does not
// parse simply contributes nothing.
//
// Each host becomes an allow rule, layer LayerNamed, source "discovered:
// <file or command>": the host alone, or host:port when the URL names a
// port other than its scheme's default. An IP address that Special
// refuses (a mirror on the loopback or the local network) is skipped: an
// image must not be able to open the host's network by naming it in a
// sources.list. Write an address rule for such a mirror.
func Discover(root string, run func(name string, args ...string) (string, error), env func(string) string) []Rule {
	if env == nil {
		env = func(string) string { return "" }
	}
	d := &discovery{seen: map[string]bool{}}
	if r, err := os.OpenRoot(root); err == nil {
		defer r.Close()
		d.fsys = r.FS()
	}
	homes := []string{"/root"}
	if h := env("HOME"); strings.HasPrefix(h, "/") && path.Clean(h) != "/root" {
		homes = append(homes, path.Clean(h))
	}

	d.apt()
	d.apk()
	d.pip(homes, env)
	d.npm(homes, run)
	d.golang(run, env)
	d.cargo(homes, env)
	return d.out
}

type discovery struct {
	fsys fs.FS // nil when root could not be opened
	seen map[string]bool
	out  []Rule
}

// maxConfig bounds what is read of one file: these are a few lines, and
// an image could hold anything at these paths.
const maxConfig = 1 << 20

// read returns the file at p (absolute, inside root), or "".
func (d *discovery) read(p string) string {
	if d.fsys == nil {
		return ""
	}
	f, err := d.fsys.Open(strings.TrimPrefix(path.Clean(p), "/"))
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return ""
	}
	b, err := io.ReadAll(io.LimitReader(f, maxConfig))
	if err != nil {
		return ""
	}
	return string(b)
}

// glob lists the files matching pattern (absolute, inside root), sorted.
func (d *discovery) glob(pattern string) []string {
	if d.fsys == nil {
		return nil
	}
	m, _ := fs.Glob(d.fsys, strings.TrimPrefix(pattern, "/"))
	for i := range m {
		m[i] = "/" + m[i]
	}
	return m
}

// defaultPorts are the ports a URL without one means; such a URL becomes
// a portless rule.
var defaultPorts = map[string]string{"http": "80", "https": "443", "ftp": "21", "ssh": "22", "git": "9418"}

// addURL adds the host of raw, a URL from source. Transport prefixes
// ("mirror+http", "tor+https", "sparse+https", "git+ssh") are stripped;
// schemes that do not reach the network (file, cdrom, copy) are skipped.
func (d *discovery) addURL(raw, source string) {
	raw = strings.Trim(strings.TrimSpace(raw), `"'`)
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return
	}
	scheme := strings.ToLower(u.Scheme)
	if i := strings.LastIndexByte(scheme, '+'); i >= 0 {
		scheme = scheme[i+1:]
	}
	def, ok := defaultPorts[scheme]
	if !ok {
		return
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if _, sp := Special(ip, nil); sp {
			return
		}
	}
	entry := host
	if strings.Contains(host, ":") {
		entry = "[" + host + "]"
	}
	switch {
	case port != "" && port != def:
		entry += ":" + port
	case strings.Contains(host, ":"):
		entry = host // a bare IPv6 address takes no brackets
	}
	r, err := ParseEntry(entry)
	if err != nil {
		return
	}
	key := r.Name
	if r.IsAddr() {
		key = r.Prefix.String()
	}
	key += ":" + strconv.Itoa(int(r.Port))
	if d.seen[key] {
		return
	}
	d.seen[key] = true
	r.Action, r.Layer, r.Source = Allow, LayerNamed, "discovered: "+source
	d.out = append(d.out, r)
}

func lines(s string) []string { return strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n") }

// apt reads the one-line and deb822 source lists.
func (d *discovery) apt() {
	for _, f := range append([]string{"/etc/apt/sources.list"}, d.glob("/etc/apt/sources.list.d/*.list")...) {
		for _, line := range lines(d.read(f)) {
			if u := aptLineURI(line); u != "" {
				d.addURL(u, f)
			}
		}
	}
	for _, f := range d.glob("/etc/apt/sources.list.d/*.sources") {
		for _, u := range deb822URIs(d.read(f)) {
			d.addURL(u, f)
		}
	}
}

// aptLineURI returns the URI of "deb [options] uri suite [components]".
func aptLineURI(line string) string {
	line, _, _ = strings.Cut(line, "#")
	line = strings.TrimSpace(line)
	i := strings.IndexAny(line, " \t")
	if i < 0 {
		return ""
	}
	typ, rest := line[:i], strings.TrimSpace(line[i+1:])
	if typ != "deb" && typ != "deb-src" {
		return ""
	}
	if strings.HasPrefix(rest, "[") {
		_, after, ok := strings.Cut(rest, "]")
		if !ok {
			return ""
		}
		rest = after
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// deb822URIs returns the URIs of the enabled stanzas of a .sources file.
func deb822URIs(s string) []string {
	var out, uris []string
	enabled, field := true, ""
	flush := func() {
		if enabled {
			out = append(out, uris...)
		}
		uris, enabled, field = nil, true, ""
	}
	for _, line := range lines(s) {
		switch {
		case strings.HasPrefix(line, "#"):
			continue
		case strings.TrimSpace(line) == "":
			flush()
			continue
		case line[0] == ' ' || line[0] == '\t':
			if field == "uris" {
				uris = append(uris, strings.Fields(line)...)
			}
			continue
		}
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		field = strings.ToLower(strings.TrimSpace(name))
		switch field {
		case "uris":
			uris = append(uris, strings.Fields(val)...)
		case "enabled":
			enabled = !strings.EqualFold(strings.TrimSpace(val), "no")
		}
	}
	flush()
	return out
}

// apk reads etc/apk/repositories: one URL (or local path) a line,
// optionally tagged "@tag URL".
func (d *discovery) apk() {
	const f = "/etc/apk/repositories"
	for _, line := range lines(d.read(f)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		fields := strings.Fields(line)
		d.addURL(fields[len(fields)-1], f)
	}
}

// pipKeys are the pip.conf options that hold index or link URLs; pip
// accepts both spellings.
var pipKeys = map[string]bool{
	"index-url": true, "index_url": true,
	"extra-index-url": true, "extra_index_url": true,
	"find-links": true, "find_links": true,
}

func (d *discovery) pip(homes []string, env func(string) string) {
	files := []string{"/etc/pip.conf", "/etc/xdg/pip/pip.conf"}
	for _, h := range homes {
		files = append(files, path.Join(h, ".config/pip/pip.conf"), path.Join(h, ".pip/pip.conf"))
	}
	for _, f := range files {
		for _, u := range iniValues(d.read(f), pipKeys) {
			d.addURL(u, f)
		}
	}
	for _, v := range []string{"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"} {
		for _, u := range strings.Fields(env(v)) {
			d.addURL(u, "$"+v)
		}
	}
}

// iniValues returns the whitespace-separated values of keys in an INI
// file, in any section, with continuation lines (pip writes
// extra-index-url lists that way).
func iniValues(s string, keys map[string]bool) []string {
	var out []string
	in := false
	for _, line := range lines(s) {
		t := strings.TrimSpace(line)
		switch {
		case t == "" || t[0] == '#' || t[0] == ';':
			continue
		case t[0] == '[':
			in = false
			continue
		case line[0] == ' ' || line[0] == '\t':
			if in {
				out = append(out, strings.Fields(t)...)
			}
			continue
		}
		k, v, ok := strings.Cut(t, "=")
		if !ok {
			in = false
			continue
		}
		in = keys[strings.ToLower(strings.TrimSpace(k))]
		if in {
			out = append(out, strings.Fields(v)...)
		}
	}
	return out
}

// npmRegistry matches "registry=URL" and "@scope:registry=URL". Only
// registry keys are read: an npmrc also holds auth tokens, which must not
// be copied anywhere.
var npmRegistry = regexp.MustCompile(`^\s*(?:@[^:\s]+:)?registry\s*=\s*(\S+)\s*$`)

func (d *discovery) npm(homes []string, run func(string, ...string) (string, error)) {
	files := []string{"/etc/npmrc", "/usr/etc/npmrc", "/usr/local/etc/npmrc"}
	for _, h := range homes {
		files = append(files, path.Join(h, ".npmrc"))
	}
	for _, f := range files {
		for _, line := range lines(d.read(f)) {
			if m := npmRegistry.FindStringSubmatch(line); m != nil && !strings.Contains(m[1], "${") {
				d.addURL(m[1], f)
			}
		}
	}
	if run != nil {
		if out, err := run("npm", "config", "get", "registry"); err == nil {
			d.addURL(out, "npm config get registry")
		}
	}
}

// golang reads GOPROXY and GOSUMDB from the environment, asking `go env`
// for whichever is unset (it knows the built-in defaults).
func (d *discovery) golang(run func(string, ...string) (string, error), env func(string) string) {
	proxy, sumdb := env("GOPROXY"), env("GOSUMDB")
	proxySrc, sumSrc := "$GOPROXY", "$GOSUMDB"
	if (proxy == "" || sumdb == "") && run != nil {
		if out, err := run("go", "env", "GOPROXY", "GOSUMDB"); err == nil {
			l := lines(strings.TrimSpace(out))
			const src = "go env GOPROXY GOSUMDB"
			if proxy == "" && len(l) > 0 {
				proxy, proxySrc = strings.TrimSpace(l[0]), src
			}
			if sumdb == "" && len(l) > 1 {
				sumdb, sumSrc = strings.TrimSpace(l[1]), src
			}
		}
	}
	// GOPROXY is a list separated by "," (fall back on 404/410) or "|"
	// (fall back on any error); "direct" and "off" are not hosts.
	for _, p := range strings.FieldsFunc(proxy, func(c rune) bool { return c == ',' || c == '|' }) {
		if p = strings.TrimSpace(p); p != "direct" && p != "off" {
			d.addURL(p, proxySrc)
		}
	}
	// GOSUMDB is "off", "name", "name+key" or "name[+key] url"; without
	// a URL the database is reached at https://name.
	if f := strings.Fields(sumdb); len(f) > 0 && f[0] != "off" {
		if len(f) > 1 {
			d.addURL(f[1], sumSrc)
		} else {
			name, _, _ := strings.Cut(f[0], "+")
			d.addURL("https://"+name, sumSrc)
		}
	}
}

// cargoURL matches the registry URLs of a cargo config: [registries.X]
// index = "...", [source.X] registry = "...", and the inline-table forms.
var cargoURL = regexp.MustCompile(`(?:^|[\s{,])(?:index|registry)\s*=\s*["']([^"']+)["']`)

func (d *discovery) cargo(homes []string, env func(string) string) {
	dirs := []string{}
	if ch := env("CARGO_HOME"); strings.HasPrefix(ch, "/") {
		dirs = append(dirs, path.Clean(ch))
	}
	for _, h := range homes {
		dirs = append(dirs, path.Join(h, ".cargo"))
	}
	for _, dir := range dirs {
		for _, name := range []string{"config.toml", "config"} {
			f := path.Join(dir, name)
			for _, line := range lines(d.read(f)) {
				line, _, _ = strings.Cut(line, "#")
				for _, m := range cargoURL.FindAllStringSubmatch(line, -1) {
					d.addURL(m[1], f)
				}
			}
		}
	}
}
