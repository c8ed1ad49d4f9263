package config

// [mcp.NAME]: a remote MCP server the agent may use, and which of its
// tools and resources. Declaring one allows its URL (host, port and path)
// through the gate as request rules of the file's own network layer, so
// the gate terminates TLS to it and a project's declaration needs the
// user's consent like any other network.allow (the consent lists it).
//
// A URL on http://127.0.0.1:PORT is a server on the host's own loopback
// (an editor's, a local tool's). It allows nothing in the policy: the
// guest reaches it at the gateway's PORT, where the gate reads its
// requests as it reads a remote server's (docs/mcp.md, "Servers on the
// host"). The one spelling is deliberate: "localhost" may name ::1,
// other 127/8 addresses are other services, and the daemon dials the
// IPv4 loopback only.

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"

	"moat.dev/moat/internal/policy"
)

// MCPServer is one [mcp.NAME] table. Persisted in the record's
// configuration snapshot (under network): JSON names frozen.
type MCPServer struct {
	Name string `json:"name"`
	// URL is as written; Host (normalized), Port and Path (escaped, no
	// trailing "/", "/" for the root) are read from it.
	URL  string `json:"url,omitempty"`
	Host string `json:"host,omitempty"`
	Port uint16 `json:"port,omitempty"`
	Path string `json:"path,omitempty"`
	// Command is a stdio server the agent runs in the sandbox: the
	// program and its arguments. Exclusive with URL.
	Command []string `json:"command,omitempty"`
	// Secret names a [secrets] entry bound to Host, whose placeholder
	// the presets put in the agent's MCP configuration.
	Secret    string   `json:"secret,omitempty"`
	Tools     []string `json:"tools,omitempty"`
	Resources []string `json:"resources,omitempty"`
	// AuditArguments writes each call's arguments to the audit.
	AuditArguments bool   `json:"audit_arguments,omitempty"`
	Source         string `json:"source,omitempty"` // the file that declared it
	// Local says the server is on the host's loopback: Host is
	// LocalHost, and the guest reaches it at the gateway's Port.
	Local bool `json:"local,omitempty"`
}

// LocalHost is the one host a host-local server's URL names.
const LocalHost = "127.0.0.1"

// GuestURL is the URL the agent in the guest uses: the declared one,
// except that a host-local server is at gateway (the guest's address for
// the host) on the same port.
func (s MCPServer) GuestURL(gateway string) string {
	if !s.Local {
		return s.URL
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		return s.URL // checked when the file was read: cannot happen
	}
	u.Host = net.JoinHostPort(gateway, strconv.Itoa(int(s.Port)))
	return u.String()
}

// AllowEntries are the request rules that let the server's URL through:
// its path and everything below it, any method.
func (s MCPServer) AllowEntries() []string {
	if s.Host == "" || s.Local {
		// A command: nothing to allow. A host-local server: the policy
		// does not decide the gateway's ports, the declaration does.
		return nil
	}
	hp := s.Host + ":" + strconv.Itoa(int(s.Port))
	if s.Path == "/" {
		return []string{hp + "/*"}
	}
	return []string{hp + s.Path, hp + s.Path + "/*"}
}

// SortedMCP is m's servers sorted by name.
func SortedMCP(m map[string]MCPServer) []MCPServer {
	out := make([]MCPServer, 0, len(m))
	for _, n := range sortedKeys(m) {
		out = append(out, m[n])
	}
	return out
}

type rawMCP struct {
	URL            *string  `toml:"url"`
	Command        []string `toml:"command"`
	Secret         *string  `toml:"secret"`
	Tools          []string `toml:"tools"`
	Resources      []string `toml:"resources"`
	AuditArguments bool     `toml:"audit_arguments"`
}

// tokenQuery are words in a query parameter's name that say it carries
// a credential.
var tokenQuery = []string{"token", "key", "secret", "password", "passwd", "auth", "sig", "credential", "session"}

func (c *checker) mcp(raw map[string]rawMCP) map[string]MCPServer {
	var out map[string]MCPServer
	for _, name := range sortedKeys(raw) {
		r := raw[name]
		key := "mcp." + displayKey([]string{name})
		if !validPolicyName(name) {
			c.fail(key, "MCP server name %q: use lower-case letters, digits, - and _, e.g. [mcp.github]", name)
			continue
		}
		if len(r.Command) > 0 {
			if s, ok := c.mcpCommand(key, name, r); ok {
				if out == nil {
					out = map[string]MCPServer{}
				}
				out[name] = s
			}
			continue
		}
		if r.URL == nil {
			c.fail(key, `no url; write e.g. url = "https://mcp.example.com/mcp", or command = ["program", "arg"] for a server the agent runs in the sandbox`)
			continue
		}
		s, ok := c.mcpURL(key+".url", *r.URL)
		if !ok {
			continue
		}
		s.Name, s.Source, s.AuditArguments = name, c.path, r.AuditArguments
		if r.Secret != nil && s.Local {
			// The gate swaps a placeholder only for the host a secret
			// is bound to, by name; the host's loopback has none.
			c.fail(key+".secret", "a server on the host's loopback gets no secret swapped in; remove secret (the server runs on your machine: give it its token there)")
			continue
		}
		if r.Secret != nil {
			if !isEnvName(*r.Secret) {
				c.fail(key+".secret", "%q is not a secret's name; write the NAME of a [secrets.NAME] entry", *r.Secret)
				continue
			}
			s.Secret = *r.Secret
		}
		s.Tools = c.mcpPatterns(key+".tools", r.Tools)
		s.Resources = c.mcpPatterns(key+".resources", r.Resources)
		if out == nil {
			out = map[string]MCPServer{}
		}
		out[name] = s
	}
	return out
}

// mcpCommand reads a stdio server: a program the agent starts in the
// sandbox. The gate never sees its calls (they do not leave the guest),
// so the keys that would pretend to decide them are refused; what it
// reaches over the network is decided like anything else in the guest.
func (c *checker) mcpCommand(key, name string, r rawMCP) (MCPServer, bool) {
	ok := true
	for _, k := range []struct {
		key string
		set bool
	}{{"url", r.URL != nil}, {"secret", r.Secret != nil}, {"tools", r.Tools != nil}, {"resources", r.Resources != nil}, {"audit_arguments", r.AuditArguments}} {
		if k.set {
			c.fail(key+"."+k.key, "%s applies to a server reached by url; a command server runs in the sandbox, where the gate does not see its calls (the sandbox is its boundary): remove %s or the command", k.key, k.key)
			ok = false
		}
	}
	for i, a := range r.Command {
		if a == "" || strings.ContainsFunc(a, func(r rune) bool { return r == 0 }) {
			c.fail(fmt.Sprintf("%s.command[%d]", key, i), "empty or NUL argument; remove it")
			ok = false
		}
	}
	return MCPServer{Name: name, Command: r.Command, Source: c.path}, ok
}

// mcpURL reads an MCP server's URL: https, a name (request rules need
// one), no credentials in it.
func (c *checker) mcpURL(key, v string) (MCPServer, bool) {
	var s MCPServer
	u, err := url.Parse(v)
	if err != nil || u.Host == "" || u.Opaque != "" {
		c.fail(key, "%q is not a URL; write e.g. \"https://mcp.example.com/mcp\"", v)
		return s, false
	}
	useSecret := "put the credential in a secret instead: [secrets.NAME] with from = \"env:VAR\" and hosts = [\"" +
		u.Hostname() + "\"], then secret = \"NAME\" here"
	local, ok := c.mcpLocalHost(key, v, u)
	if !ok {
		return s, false
	}
	switch {
	case u.User != nil:
		c.fail(key, "the URL carries credentials (user info); remove them and %s", useSecret)
		return s, false
	case local && u.Scheme != "http":
		c.fail(key, "%q: a server on the host's loopback is reached over plain http (its bytes never leave the host, and the gate reads them); write \"http://127.0.0.1:%s%s\"", v, portOr(u, "PORT"), u.EscapedPath())
		return s, false
	case local && u.Port() == "":
		c.fail(key, "%q: name the port the server listens on, e.g. \"http://127.0.0.1:7777%s\"", v, u.EscapedPath())
		return s, false
	case !local && u.Scheme != "https":
		c.fail(key, "%q: the gate reads MCP traffic over https only; write an https:// URL (or http://127.0.0.1:PORT/PATH for a server on this host's loopback)", v)
		return s, false
	case u.Fragment != "" || strings.Contains(v, "#"):
		c.fail(key, "%q has a fragment; remove it", v)
		return s, false
	}
	for k, vals := range u.Query() {
		lk := strings.ToLower(k)
		looks := slices.ContainsFunc(tokenQuery, func(w string) bool { return strings.Contains(lk, w) })
		for _, x := range vals {
			looks = looks || len(x) >= 20
		}
		if looks {
			c.fail(key, "the URL's query parameter %q looks like a credential; remove it and %s, with query = %q", k, useSecret, k)
			return s, false
		}
	}
	host, err := policy.NormalizeName(u.Hostname())
	if local {
		host, err = LocalHost, nil
	}
	if err != nil || (!local && net.ParseIP(u.Hostname()) != nil) {
		c.fail(key, "%q: the server needs a host name (the gate decides MCP by name), not an address", v)
		return s, false
	}
	s.URL, s.Host, s.Port, s.Path = v, host, 443, strings.TrimSuffix(u.EscapedPath(), "/")
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			c.fail(key, "%q: port %q is not 1-65535", v, p)
			return s, false
		}
		s.Port = uint16(n)
	}
	if s.Path == "" {
		s.Path = "/"
	}
	if local {
		if s.Port == 53 {
			c.fail(key, "%q: port 53 is the gateway's DNS in the guest; run the server on another port", v)
			return s, false
		}
		s.Local = true
		return s, true
	}
	for _, e := range s.AllowEntries() {
		if _, err := policy.ParseEntry(e); err != nil {
			c.fail(key, "%q: its path cannot be a gate rule: %v", v, err)
			return s, false
		}
	}
	return s, true
}

// mcpLocalHost reports whether u names the host's loopback, and refuses
// the spellings of it other than 127.0.0.1: "localhost" (which may be
// ::1, or anything /etc/hosts says), ::1, other 127/8 addresses and the
// unspecified addresses. One spelling means one port on one address is
// opened to the guest, the one the user reads.
func (c *checker) mcpLocalHost(key, v string, u *url.URL) (local, ok bool) {
	h := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if h == LocalHost {
		return true, true
	}
	ip := net.ParseIP(h)
	if h == "localhost" || strings.HasSuffix(h, ".localhost") || ip != nil && (ip.IsLoopback() || ip.IsUnspecified()) {
		c.fail(key, "%q: write the host's loopback as 127.0.0.1, e.g. \"http://127.0.0.1:%s%s\" (moat reaches the host's IPv4 loopback only, and localhost may name ::1)", v, portOr(u, "PORT"), u.EscapedPath())
		return false, false
	}
	return false, true
}

func portOr(u *url.URL, def string) string {
	if p := u.Port(); p != "" {
		return p
	}
	return def
}

// mcpPatterns checks tools or resources patterns: "*" globs, "!" refuses.
func (c *checker) mcpPatterns(key string, v []string) []string {
	var out []string
	for i, p := range v {
		k := fmt.Sprintf("%s[%d]", key, i)
		body := strings.TrimPrefix(p, "!")
		switch {
		case body == "":
			c.fail(k, "empty pattern; write a name, a glob such as \"search_*\", or \"!name\" to refuse one")
			continue
		case strings.HasPrefix(body, "!"):
			c.fail(k, "%q: one \"!\" refuses; write %q", p, "!"+strings.TrimLeft(body, "!"))
			continue
		case strings.ContainsFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			c.fail(k, "%q contains white space or control characters; patterns match names exactly", p)
			continue
		}
		out = appendNew(out, p)
	}
	return out
}

// validateMCP checks what spans files: each server's secret is defined
// and bound to the server's host.
func (c Config) validateMCP() error {
	if err := c.validateLocalMCP(); err != nil {
		return err
	}
	for _, s := range SortedMCP(c.Network.MCP) {
		if s.Secret == "" {
			continue
		}
		e := c.origin["mcp."+s.Name+".secret"]
		if e == nil {
			e = &Error{File: s.Source}
		}
		out := *e
		out.Key = "mcp." + s.Name + ".secret"
		sec, ok := c.Secrets[s.Secret]
		switch {
		case !ok:
			out.Msg = fmt.Sprintf("no secret %s is defined; add [secrets.%s] with from = \"env:VAR\" and hosts = [%q]", s.Secret, s.Secret, s.Host)
			return &out
		case !slices.ContainsFunc(sec.Hosts, func(h string) bool { return hostCovers(h, s.Host) }):
			out.Msg = fmt.Sprintf("secret %s is bound to %s, not to %s; add %q to its hosts (%s)", s.Secret,
				strings.Join(sec.Hosts, ", "), s.Host, s.Host, sec.Source)
			return &out
		}
	}
	return nil
}

// validateLocalMCP refuses a host-local server whose port a reverse
// forward also names: on the gateway's side the two would claim one
// port, and on the host's side the forward would carry raw bytes to the
// server the declaration meant to decide call by call. Two servers on
// one port and path would leave which rules apply to chance.
func (c Config) validateLocalMCP() error {
	seen := map[string]string{}
	for _, s := range SortedMCP(c.Network.MCP) {
		if !s.Local {
			continue
		}
		key := "mcp." + s.Name + ".url"
		out := Error{File: s.Source, Key: key}
		if e := c.origin[key]; e != nil {
			out = *e
			out.Key = key
		}
		for _, f := range c.Forwards.Reverse {
			switch {
			case f.Guest == s.Port:
				out.Msg = fmt.Sprintf("gateway port %d is both MCP server %s's and the reverse forward %d:%d's in [forwards]; give the forward another guest port", s.Port, s.Name, f.Host, f.Guest)
				return &out
			case f.Host == s.Port:
				out.Msg = fmt.Sprintf("the reverse forward %d:%d in [forwards] reaches MCP server %s's port around its rules; remove the forward (the guest reaches the server at the gateway's port %d)", f.Host, f.Guest, s.Name, s.Port)
				return &out
			}
		}
		at := strconv.Itoa(int(s.Port)) + strings.ToLower(s.Path)
		if other, ok := seen[at]; ok {
			out.Msg = fmt.Sprintf("MCP servers %s and %s are both at 127.0.0.1:%s; declare the server once", other, s.Name, at)
			return &out
		}
		seen[at] = s.Name
	}
	return nil
}

// hostCovers reports whether a secret's host entry ("api.example.com",
// "*.example.com", either with a port) covers host.
func hostCovers(entry, host string) bool {
	if h, _, err := net.SplitHostPort(entry); err == nil {
		entry = h
	}
	n, err := policy.NormalizeName(strings.TrimPrefix(entry, "*."))
	if err != nil {
		return false
	}
	if strings.HasPrefix(entry, "*.") {
		return strings.HasSuffix(host, "."+n)
	}
	return n == host
}

// mergeMCP takes f's servers, each replacing a wider file's of the same
// name whole (a project's tools list does not add to the user's).
func (c *Config) mergeMCP(f *File) {
	for _, name := range sortedKeys(f.MCP) {
		if c.Network.MCP == nil {
			c.Network.MCP = map[string]MCPServer{}
		}
		c.Network.MCP[name] = f.MCP[name]
		key := "mcp." + name + ".secret"
		delete(c.origin, key)
		if f.MCP[name].Secret != "" {
			c.origin[key] = where(f.Path, f.ix, key)
		}
		key = "mcp." + name + ".url"
		delete(c.origin, key)
		if f.MCP[name].Local {
			c.origin[key] = where(f.Path, f.ix, key)
		}
	}
}

// mcpWants is the [mcp] part of the schema (wants), kept here with the
// rest of the section.
var mcpWants = map[string]want{
	"mcp":                   {"a table of [mcp.NAME] tables", []unstable.Kind{unstable.Table, unstable.InlineTable}},
	"mcp.*":                 wantTable,
	"mcp.*.url":             wantString,
	"mcp.*.secret":          wantString,
	"mcp.*.tools":           wantList,
	"mcp.*.tools[]":         wantString,
	"mcp.*.resources":       wantList,
	"mcp.*.resources[]":     wantString,
	"mcp.*.audit_arguments": wantBool,
}

func init() {
	for k, v := range mcpWants {
		wants[k] = v
	}
}
