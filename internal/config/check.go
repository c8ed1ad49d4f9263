package config

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/disk"
	"moat.dev/moat/internal/policy"
)

// checker turns a decoded rawFile into a File, collecting every problem
// with the position of the key it is about.
type checker struct {
	path string
	dir  string // absolute directory of the file; anchors relative paths
	ix   *docIndex
	errs []error
}

func newChecker(path string, ix *docIndex) (*checker, error) {
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("resolving the directory of %s: %w", path, err)
	}
	return &checker{path: path, dir: dir, ix: ix}, nil
}

// where is an *Error positioned at key's value (or, for a table, its
// header). A key the index does not know gets the file alone.
func where(file string, ix *docIndex, key string) *Error {
	e := &Error{File: file, Key: key}
	if ix == nil {
		return e
	}
	// A key that is not written (a default target, a missing from) is
	// pointed at through the nearest enclosing key that is.
	for k := key; k != ""; k = k[:max(strings.LastIndexAny(k, ".["), 0)] {
		if ent, ok := ix.lookup(k); ok {
			p := ent.val
			if p.line == 0 {
				p = ent.key1
			}
			e.Line, e.Col = p.line, p.col
			break
		}
	}
	return e
}

func (c *checker) fail(key, format string, args ...any) {
	e := where(c.path, c.ix, key)
	e.Msg = fmt.Sprintf(format, args...)
	c.errs = append(c.errs, e)
}

// failErr reports an error from ParseSize, ValidName and friends, whose
// *Error carries a message but no position.
func (c *checker) failErr(key string, err error) {
	c.fail(key, "%s", err.(*Error).Msg)
}

func (c *checker) file(raw *rawFile) *File {
	f := &File{Path: c.path, ix: c.ix}
	f.Sandbox = c.sandbox(&raw.Sandbox)
	f.Shares = c.shares(raw.Shares)
	f.Files = c.files(raw.Files)
	f.Network = NetworkLayer{
		Source: c.path,
		Use:    c.list("network.use", raw.Network.Use),
		Allow:  c.rules("network.allow", raw.Network.Allow),
		Block:  c.rules("network.block", raw.Network.Block),

		Inspect: raw.Network.Inspect,
		Trust:   c.trust("network.trust", raw.Network.Trust),
		Mode:    c.mode("network.mode", raw.Network.Mode),

		MaxConnections: c.atLeast("network.max_connections", raw.Network.MaxConnections, 1),
		MaxDNSQueries:  c.atLeast("network.max_dns_queries", raw.Network.MaxDNSQueries, 1),
		MaxHolds:       c.atLeast("network.max_holds", raw.Network.MaxHolds, 1),
	}
	f.Policies = c.policies(raw.Policies)
	f.MCP = c.mcp(raw.MCP)
	for _, s := range SortedMCP(f.MCP) {
		// Declaring a server allows its URL, in this file's layer.
		f.Network.Allow = union(f.Network.Allow, s.AllowEntries())
	}
	f.Audit = c.audit(&raw.Audit)
	f.Secrets = c.secrets(raw.Secrets)
	f.Env = c.env(raw.Env)
	f.Forwards = Forwards{
		Ports:   c.forwards("forwards.ports", raw.Forwards.Ports, func(f Forward) uint16 { return f.Host }),
		Reverse: c.forwards("forwards.reverse", raw.Forwards.Reverse, func(f Forward) uint16 { return f.Guest }),
	}
	if keys := c.list("ssh_agent.keys", raw.SSHAgent.Keys); len(keys) > 0 {
		f.SSHAgent = SSHAgent{Keys: keys, Sources: []string{c.path}}
	}
	if raw.SSHAgent.Confirm != nil && *raw.SSHAgent.Confirm {
		f.SSHAgent.Confirm = true
	}
	f.Hooks = Hooks{
		OnCreate: c.list("hooks.on_create", raw.Hooks.OnCreate),
		OnUp:     c.list("hooks.on_up", raw.Hooks.OnUp),
	}
	f.Workspace = c.workspace(raw.Workspace.Repos)
	return f
}

// minMemory catches a missing unit: "memory = \"512\"" is 512 bytes,
// and no guest boots in less than 64 MiB.
const minMemory = 64 << 20

func (c *checker) sandbox(r *rawSandbox) SandboxLayer {
	var s SandboxLayer
	if r.Name != nil {
		if err := ValidName(*r.Name); err != nil {
			c.failErr("sandbox.name", err)
		}
		s.Name = r.Name
	}
	if r.Image != nil {
		s.Image = c.image(*r.Image)
	}
	if r.Runtime != nil {
		switch *r.Runtime {
		case "gvisor", "docker", "kubernetes":
			s.Runtime = r.Runtime
		case "runc", "vm":
			c.fail("sandbox.runtime", "runtime %q is not supported yet; remove the line, or write \"gvisor\", \"docker\" or \"kubernetes\"", *r.Runtime)
		default:
			c.fail("sandbox.runtime", "unknown runtime %q; write \"gvisor\" (moat's own sandbox), \"docker\" (containers through the Docker engine; docs/docker.md) or \"kubernetes\" (a claim on a cluster; docs/kubernetes.md)", *r.Runtime)
		}
	}
	s.CPUs = c.atLeast("sandbox.cpus", r.CPUs, 1)
	s.PidsMax = c.atLeast("sandbox.pids_max", r.PidsMax, 1)
	s.MemoryBytes = c.size("sandbox.memory", r.Memory)
	s.MemoryMaxBytes = c.size("sandbox.memory_max", r.MemoryMax)
	s.DaemonMemoryMaxBytes = c.size("sandbox.daemon_memory_max", r.DaemonMax)
	if s.MemoryBytes != nil && s.MemoryMaxBytes != nil && *s.MemoryMaxBytes < *s.MemoryBytes {
		c.fail("sandbox.memory_max", "%s is less than sandbox.memory %s; the ceiling must be at least the baseline",
			FormatSize(*s.MemoryMaxBytes), FormatSize(*s.MemoryBytes))
	}
	if r.Disk != nil {
		s.DiskBytes = c.disk("sandbox.disk", *r.Disk)
	}
	if r.Platform != nil {
		switch *r.Platform {
		case "auto", "systrap", "kvm":
			s.Platform = r.Platform
		default:
			c.fail("sandbox.platform", "unknown platform %q; write \"auto\" (KVM where the host has it, else systrap), \"systrap\" or \"kvm\"", *r.Platform)
		}
	}
	if r.IdleAction != nil {
		switch *r.IdleAction {
		case IdleSuspend, IdleStop:
			s.IdleAction = r.IdleAction
		default:
			c.fail("sandbox.idle_action", "unknown idle action %q; write \"suspend\" (keep the processes, when the state's disk has room) or \"stop\"", *r.IdleAction)
		}
	}
	if r.IdleTimeout != nil {
		d, err := parseIdle(*r.IdleTimeout)
		if err != nil {
			c.failErr("sandbox.idle_timeout", err)
		} else {
			s.IdleTimeout = &d
		}
	}
	return s
}

// image keeps "host" and OCI references as written and makes archive
// paths absolute. A path is anything that starts like one (/, ./, ../,
// ~) or ends in a tar suffix, so "images/dev.tar" is a file, not a
// repository called dev.tar.
func (c *checker) image(v string) *string {
	switch {
	case v == "":
		c.fail("sandbox.image", `empty image; write "host", an OCI reference such as "debian:bookworm", or a path to an image archive`)
		return nil
	case strings.ContainsAny(v, " \t\r\n"):
		c.fail("sandbox.image", "%q contains white space; write an OCI reference such as \"debian:bookworm\" or a path", v)
		return nil
	case v == "host":
		return &v
	}
	isPath := strings.HasPrefix(v, "/") || strings.HasPrefix(v, "./") || strings.HasPrefix(v, "../") ||
		v == "~" || strings.HasPrefix(v, "~/")
	for _, suf := range []string{".tar", ".tar.gz", ".tgz"} {
		isPath = isPath || strings.HasSuffix(v, suf)
	}
	if !isPath {
		return &v
	}
	p, ok := c.hostPath("sandbox.image", v)
	if !ok {
		return nil
	}
	return &p
}

// hostPath expands ~ and anchors a relative path at the file's directory:
// "./data" in a project's moat.toml means the project's data, wherever
// moat was started from.
func (c *checker) hostPath(key, p string) (string, bool) {
	switch {
	case p == "~" || strings.HasPrefix(p, "~/"):
		home, err := os.UserHomeDir()
		if err != nil {
			c.fail(key, "cannot expand %q: the home directory is unknown ($HOME is not set); write an absolute path", p)
			return "", false
		}
		p = filepath.Join(home, p[1:])
	case strings.HasPrefix(p, "~"):
		c.fail(key, "%q: only ~ and ~/ are expanded, not ~user; write an absolute path", p)
		return "", false
	case !filepath.IsAbs(p):
		p = filepath.Join(c.dir, p)
	}
	return filepath.Clean(p), true
}

func (c *checker) atLeast(key string, v *int64, lo int64) *int {
	if v == nil {
		return nil
	}
	// The upper bound keeps the value inside int on 32-bit hosts.
	if *v < lo || *v > 1<<31-1 {
		c.fail(key, "%d is out of range; write a whole number of at least %d", *v, lo)
		return nil
	}
	n := int(*v)
	return &n
}

func (c *checker) size(key string, v *string) *uint64 {
	if v == nil {
		return nil
	}
	n, err := ParseSize(*v)
	if err != nil {
		c.failErr(key, err)
		return nil
	}
	if n < minMemory {
		c.fail(key, "%q is less than the minimum of 64MiB; sizes without a unit are bytes, so write e.g. \"512MiB\"", *v)
		return nil
	}
	return &n
}

// disk reads sandbox.disk: a size of at least disk.MinBytes, or
// "unlimited" (0).
func (c *checker) disk(key, v string) *uint64 {
	if v == "unlimited" {
		return new(uint64)
	}
	n, err := ParseSize(v)
	if err != nil {
		c.fail(key, "%s, or \"unlimited\"", err.(*Error).Msg)
		return nil
	}
	if n < disk.MinBytes {
		c.fail(key, "%q is less than the minimum of %s; sizes without a unit are bytes, so write e.g. \"20GiB\"", v, FormatSize(disk.MinBytes))
		return nil
	}
	return &n
}

// minRetention: the audit counts repeated denials over 10 s intervals
// and deletes files by their age; under a minute would delete the
// records of what the agent is doing now.
const minRetention = time.Minute

// audit reads the [audit] table: the size bound of the sandbox's audit
// files and how long their records are kept.
func (c *checker) audit(r *rawAudit) AuditLayer {
	var a AuditLayer
	if r.MaxSize != nil {
		n, err := ParseSize(*r.MaxSize)
		switch {
		case err != nil:
			c.failErr("audit.max_size", err)
		case n < audit.MinMaxBytes:
			c.fail("audit.max_size", "%q is less than the minimum of %s; sizes without a unit are bytes, so write e.g. \"256MiB\"", *r.MaxSize, FormatSize(audit.MinMaxBytes))
		default:
			a.MaxBytes = &n
		}
	}
	if r.Retention != nil {
		d, err := parseDays(*r.Retention)
		switch {
		case err != nil:
			c.fail("audit.retention", "%q is not a duration; write e.g. \"7d\", \"48h\" or \"90m\"", *r.Retention)
		case d < minRetention:
			c.fail("audit.retention", "%q is shorter than the minimum of 1m; write e.g. \"7d\"", *r.Retention)
		default:
			a.Retention = &d
		}
	}
	return a
}

// parseDays is time.ParseDuration that also takes whole days ("7d"),
// the unit people think of retention in.
func parseDays(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.ParseUint(n, 10, 16)
		if err != nil {
			return 0, err
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

func (c *checker) shares(raw []rawShare) []Share {
	var out []Share
	seen := map[string]int{} // target → index in raw
	for i, r := range raw {
		key := fmt.Sprintf("shares[%d]", i)
		if r.Path == nil || *r.Path == "" {
			c.fail(key, `share has no path; write path = "~/data" (target and rw are optional)`)
			continue
		}
		p, ok := c.hostPath(key+".path", *r.Path)
		if !ok {
			continue
		}
		s := Share{Path: p, Target: p, RW: r.RW, Source: c.path}
		if r.Target != nil {
			t := *r.Target
			if !strings.HasPrefix(t, "/") {
				c.fail(key+".target", "%q is not an absolute guest path; write e.g. \"/data\"", t)
				continue
			}
			s.Target = filepath.Clean(t)
		}
		if bad := reservedTarget(s.Target); bad != "" {
			c.fail(key+".target", "cannot mount over %s in the guest; choose another target, e.g. \"/data\"", bad)
			continue
		}
		if j, dup := seen[s.Target]; dup {
			c.fail(key, "target %s is already used by shares[%d]; give one of them another target", s.Target, j)
			continue
		}
		seen[s.Target] = i
		out = append(out, s)
	}
	return out
}

// reservedTarget returns the guest directory a share must not cover:
// the root and the kernel file systems the guest's init mounts itself.
func reservedTarget(t string) string {
	if t == "/" {
		return "/"
	}
	for _, r := range []string{"/proc", "/sys", "/dev"} {
		if t == r || strings.HasPrefix(t, r+"/") {
			return r
		}
	}
	return ""
}

// list checks a list of non-empty strings and drops duplicates.
func (c *checker) list(key string, v []string) []string {
	var out []string
	for i, s := range v {
		if strings.TrimSpace(s) == "" {
			c.fail(fmt.Sprintf("%s[%d]", key, i), "empty entry; remove it")
			continue
		}
		out = appendNew(out, s)
	}
	return out
}

// rules checks network.allow or network.block with the gate's own
// parser, policy.ParseEntry, so a mistyped rule is an error naming its
// line now instead of a rule that silently matches nothing later; and
// one parser cannot disagree with itself. Entries are kept as written:
// the gate parses them again when it compiles the policy.
func (c *checker) rules(key string, v []string) []string {
	var out []string
	for i, s := range v {
		k := fmt.Sprintf("%s[%d]", key, i)
		if strings.TrimSpace(s) == "" {
			c.fail(k, "empty entry; remove it")
			continue
		}
		if _, err := policy.ParseEntry(s); err != nil {
			c.fail(k, "%s", err)
			continue
		}
		out = appendNew(out, s)
	}
	return out
}

func (c *checker) secrets(raw map[string]rawSecret) map[string]Secret {
	out := map[string]Secret{}
	for _, name := range sortedKeys(raw) {
		r := raw[name]
		key := "secrets." + displayKey([]string{name})
		if !isEnvName(name) {
			c.fail(key, "secret name %q is not a valid environment variable name; use letters, digits and _, e.g. [secrets.GITHUB_TOKEN]", name)
			continue
		}
		s := Secret{Name: name, Hosts: c.list(key+".hosts", r.Hosts), Require: r.Require, Source: c.path}
		if r.From == nil {
			c.fail(key, "no from; write e.g. from = \"env:%s\" (or file:PATH, command:CMD)", name)
			continue
		}
		s.From = c.secretFrom(key+".from", *r.From)
		if len(s.Hosts) == 0 {
			// A secret bound to no host is never sent anywhere; that is
			// almost certainly a forgotten line, not an intent.
			c.fail(key, "no hosts; write e.g. hosts = [\"api.example.com\"]: the secret is only sent to these")
		}
		if r.Header != nil {
			if !isToken(*r.Header) {
				c.fail(key+".header", "%q is not an HTTP header name; write e.g. \"x-api-key\" or \"authorization\"", *r.Header)
			}
			s.Header = *r.Header
		}
		if r.Query != nil {
			if !isQueryName(*r.Query) {
				c.fail(key+".query", "%q is not a URL query parameter name; write the bare name, e.g. \"key\" for ?key=...", *r.Query)
			}
			s.Query = *r.Query
		}
		out[name] = s
	}
	return out
}

// isQueryName reports whether s can be matched against a decoded query
// parameter name as written: not empty, and free of the characters that
// separate or encode parameters (a user who writes "key=" or "?key"
// would otherwise get a binding that never matches).
func isQueryName(s string) bool {
	for _, c := range []byte(s) {
		if c <= ' ' || c == 0x7f || strings.IndexByte("&=?#%+;", c) >= 0 {
			return false
		}
	}
	return s != ""
}

// trust makes each path absolute and checks now that it holds PEM
// certificates. The gate reads the files again when it starts; checking
// here is what lets a typo be an error naming this line instead of an
// upstream that fails to verify much later, far from its cause.
func (c *checker) trust(key string, v []string) []string {
	var out []string
	for i, s := range v {
		k := fmt.Sprintf("%s[%d]", key, i)
		if strings.TrimSpace(s) == "" {
			c.fail(k, "empty entry; remove it")
			continue
		}
		p, ok := c.hostPath(k, s)
		if !ok {
			continue
		}
		if err := checkPEMCerts(p); err != nil {
			c.fail(k, "%s", err)
			continue
		}
		out = appendNew(out, p)
	}
	return out
}

// checkPEMCerts reads the PEM file at p and parses every certificate in
// it. A file with a broken certificate is refused whole rather than
// trusting the rest: the user meant that one too.
func checkPEMCerts(p string) error {
	data, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("reading %s: %v; write the path of a PEM file of CA certificates", p, unwrapPath(err))
	}
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue // a bundle may carry comments or keys; only certificates count
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("certificate %d in %s does not parse (%v); replace the file with the CA's PEM certificate", n+1, p, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s holds no PEM certificate (-----BEGIN CERTIFICATE-----); write the path of a PEM file of CA certificates", p)
	}
	return nil
}

// unwrapPath drops the *fs.PathError wrapper, whose text repeats the path.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// secretFrom checks the source prefix; file: paths are made absolute like
// every other host path.
func (c *checker) secretFrom(key, v string) string {
	kind, rest, _ := strings.Cut(v, ":")
	switch {
	case kind == "env" && isEnvName(rest):
		return v
	case kind == "env":
		c.fail(key, "%q: %q is not an environment variable name; write e.g. \"env:API_KEY\"", v, rest)
	case kind == "file" && rest != "":
		if p, ok := c.hostPath(key, rest); ok {
			return "file:" + p
		}
	case kind == "command" && strings.TrimSpace(rest) != "":
		return v
	default:
		c.fail(key, "%q is not a secret source; write \"env:VAR\", \"file:PATH\" or \"command:CMD\"", v)
	}
	return ""
}

func (c *checker) env(raw map[string]any) []EnvVar {
	// The decoder hands back a map; the index gives the order the user
	// wrote, which is the order the guest sees.
	var out []EnvVar
	for _, e := range c.ix.entries {
		if len(e.parts) != 2 || e.parts[0] != "env" {
			continue
		}
		name := e.parts[1]
		rv, ok := raw[name]
		if !ok {
			continue
		}
		if !isEnvName(name) {
			c.fail(e.key, "%q is not a valid environment variable name; use letters, digits and _", name)
			continue
		}
		var v string
		switch x := rv.(type) {
		case bool:
			if !x {
				c.fail(e.key, "false means nothing here; write %s = true to pass the host's value, or remove the line", name)
				continue
			}
			out = append(out, EnvVar{Name: name, Pass: true, Source: c.path})
			continue
		case string:
			v = x
		default:
			c.fail(e.key, "expected %s, got %s", wantEnv.desc, kindName(e.kind))
			continue
		}
		if _, err := ExpandEnv(v, func(string) (string, bool) { return "x", true }); err != nil {
			c.failErr(e.key, err)
			continue
		}
		out = append(out, EnvVar{Name: name, Value: v, Source: c.path})
	}
	return out
}

// forwards reads ports and reverse. A port listened on twice is an error
// (listen is the side whose port must be unique); the same forward twice
// is just a duplicate.
func (c *checker) forwards(key string, raw []any, listen func(Forward) uint16) []Forward {
	var out []Forward
	for i, v := range raw {
		k := fmt.Sprintf("%s[%d]", key, i)
		f, err := parseForward(v)
		if err != nil {
			c.failErr(k, err)
			continue
		}
		f.Source = c.path
		if j := indexForward(out, listen(f), listen); j >= 0 {
			if out[j] != f {
				c.fail(k, "port %d is already forwarded (%d:%d); remove one", listen(f), out[j].Host, out[j].Guest)
			}
			continue
		}
		out = append(out, f)
	}
	return out
}

func indexForward(fs []Forward, port uint16, listen func(Forward) uint16) int {
	for i, f := range fs {
		if listen(f) == port {
			return i
		}
	}
	return -1
}

const forwardHint = `write a port (3000) or "host:guest" ("8080:80"), ports 1-65535`

func parseForward(v any) (Forward, error) {
	switch v := v.(type) {
	case int64:
		if v < 1 || v > 65535 {
			return Forward{}, &Error{Msg: fmt.Sprintf("%d is not a port; %s", v, forwardHint)}
		}
		return Forward{Host: uint16(v), Guest: uint16(v)}, nil
	case string:
		h, g, pair := strings.Cut(v, ":")
		if !pair {
			g = h
		}
		hp, err1 := parsePort(h)
		gp, err2 := parsePort(g)
		if err1 != nil || err2 != nil {
			return Forward{}, &Error{Msg: fmt.Sprintf("%q is not a port forward; %s", v, forwardHint)}
		}
		return Forward{Host: hp, Guest: gp}, nil
	default:
		return Forward{}, &Error{Msg: fmt.Sprintf("expected %s, got %s", wantPort.desc, goKindName(v))}
	}
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return uint16(n), nil
}

// goKindName names a decoded value's TOML type for ports, which decode
// into any and so escape the decoder's type check.
func goKindName(v any) string {
	switch v.(type) {
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "a table"
	default:
		return "a date or time"
	}
}

func isEnvName(s string) bool {
	for i, c := range []byte(s) {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return s != ""
}

// isToken reports whether s is an HTTP token (RFC 9110 §5.6.2), the
// grammar of a header name.
func isToken(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

func appendNew[T comparable](list []T, v T) []T {
	for _, x := range list {
		if x == v {
			return list
		}
	}
	return append(list, v)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// mode checks [network] mode.
func (c *checker) mode(key string, v *string) string {
	if v == nil {
		return ""
	}
	switch *v {
	case ModeEnforce, ModeReport:
		return *v
	}
	c.fail(key, "must be %q or %q, not %q", ModeEnforce, ModeReport, *v)
	return ""
}

// files checks [[files]]: a host source, an absolute guest target used
// once, and an octal mode. Whether the source exists and how big it is
// are checked at each start, when it is copied.
func (c *checker) files(raw []rawCopy) []CopyFile {
	var out []CopyFile
	seen := map[string]int{}
	for i, r := range raw {
		key := fmt.Sprintf("files[%d]", i)
		if r.Source == nil || *r.Source == "" || r.Target == nil || *r.Target == "" {
			c.fail(key, `a file needs source and target; write source = "~/.gitconfig", target = "/home/agent/.gitconfig"`)
			continue
		}
		src, ok := c.hostPath(key+".source", *r.Source)
		if !ok {
			continue
		}
		t := *r.Target
		if !strings.HasPrefix(t, "/") {
			c.fail(key+".target", "%q is not an absolute guest path; write e.g. \"/home/agent/.gitconfig\"", t)
			continue
		}
		t = filepath.Clean(t)
		if bad := reservedTarget(t); bad != "" || t == "/" {
			c.fail(key+".target", "cannot write into %s in the guest; choose another target", t)
			continue
		}
		mode := uint32(0o644)
		if r.Mode != nil {
			m, err := strconv.ParseUint(*r.Mode, 8, 32)
			if err != nil || m > 0o777 {
				c.fail(key+".mode", "%q is not a permission mode; write an octal string such as \"0600\"", *r.Mode)
				continue
			}
			mode = uint32(m)
		}
		if j, dup := seen[t]; dup {
			c.fail(key+".target", "%s is already written by files[%d]; give one of them another target", t, j)
			continue
		}
		seen[t] = i
		out = append(out, CopyFile{Source: src, Target: t, Mode: mode, Origin: c.path})
	}
	return out
}
