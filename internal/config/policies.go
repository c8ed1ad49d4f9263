package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Policy is a named policy, [policies.NAME]: inline rules, a list fetched
// from a URL or read from a file, or both. network.use turns it on.
// Persisted in the record's configuration snapshot: JSON names frozen.
type Policy struct {
	Name  string   `json:"name"`
	Allow []string `json:"allow,omitempty"`
	Block []string `json:"block,omitempty"`
	// Source is an http(s) URL or an absolute path (Parse anchors a
	// relative one at the file), "" for inline rules only.
	Source string `json:"source,omitempty"`
	// Refresh is how often a URL source is fetched again; set (to
	// DefaultRefresh unless the file says) whenever Source is.
	Refresh time.Duration `json:"refresh,omitempty"`
	File    string        `json:"file,omitempty"` // the file that defined it
}

// DefaultRefresh is how often a list is fetched again unless refresh
// says: curated blocklists change about daily.
const DefaultRefresh = 24 * time.Hour

// MinRefresh is the shortest refresh: list servers rate-limit, and no
// list changes by the minute.
const MinRefresh = time.Minute

// BuiltinPolicies are the names moat defines itself; a file cannot
// redefine them.
var BuiltinPolicies = []string{"default", "none"}

type rawPolicy struct {
	Allow   []string `toml:"allow"`
	Block   []string `toml:"block"`
	Source  *string  `toml:"source"`
	Refresh *string  `toml:"refresh"`
}

// validPolicyName: what `moat policy show NAME` can be typed as.
func validPolicyName(s string) bool {
	for i, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '-' || c == '_')) {
			return false
		}
	}
	return s != "" && len(s) <= 64
}

func (c *checker) policies(raw map[string]rawPolicy) map[string]Policy {
	var out map[string]Policy // nil when there are none, like the file says
	for _, name := range sortedKeys(raw) {
		r := raw[name]
		key := "policies." + displayKey([]string{name})
		switch {
		case slices.Contains(BuiltinPolicies, name):
			c.fail(key, "%q is built in and cannot be redefined; choose another name, e.g. [policies.my-%s]", name, name)
			continue
		case !validPolicyName(name):
			c.fail(key, "policy name %q: use lower-case letters, digits, - and _, e.g. [policies.ads]", name)
			continue
		}
		p := Policy{Name: name, File: c.path,
			Allow: c.rules(key+".allow", r.Allow),
			Block: c.rules(key+".block", r.Block),
		}
		if r.Source != nil {
			p.Source = c.policySource(key+".source", *r.Source)
			p.Refresh = DefaultRefresh
		}
		if r.Refresh != nil {
			if r.Source == nil {
				c.fail(key+".refresh", "refresh without a source means nothing; add source = \"https://...\" or remove refresh")
			} else if d, err := time.ParseDuration(*r.Refresh); err != nil || d < MinRefresh {
				c.fail(key+".refresh", "%q is not a duration of at least 1m; write e.g. \"24h\" or \"30m\"", *r.Refresh)
			} else {
				p.Refresh = d
			}
		}
		if len(r.Allow)+len(r.Block) == 0 && r.Source == nil {
			c.fail(key, "an empty policy; give it allow = [...], block = [...] or source = \"https://...\"")
			continue
		}
		if out == nil {
			out = map[string]Policy{}
		}
		out[name] = p
	}
	return out
}

// policySource keeps an http(s) URL as written and makes a path
// absolute; other schemes are refused.
func (c *checker) policySource(key, v string) string {
	switch {
	case strings.TrimSpace(v) == "":
		c.fail(key, `empty source; write an http(s) URL or a file path, e.g. "https://example.com/hosts.txt" or "./blocklist.txt"`)
		return ""
	case strings.HasPrefix(v, "http://") || strings.HasPrefix(v, "https://"):
		u, err := url.Parse(v)
		if err != nil || u.Host == "" {
			c.fail(key, "%q is not a URL; write e.g. \"https://example.com/hosts.txt\"", v)
			return ""
		}
		return v
	case strings.Contains(v, "://"):
		c.fail(key, "%q: only http:// and https:// URLs are fetched; write one, or a file path", v)
		return ""
	}
	p, ok := c.hostPath(key, v)
	if !ok {
		return ""
	}
	return p
}

// mergePolicies takes f's named policies, each replacing a wider file's
// policy of that name whole (like a secret: mixing one file's source
// with another's rules would be a policy nobody wrote), and where f
// writes its network.use names.
func (c *Config) mergePolicies(f *File) {
	for _, name := range sortedKeys(f.Policies) {
		if c.Network.Policies == nil {
			c.Network.Policies = map[string]Policy{}
		}
		c.Network.Policies[name] = f.Policies[name]
	}
	// f.Network.Use has dropped repeats, so an index may be off after
	// a repeated name; the line is still the right one or close to it.
	for i, name := range f.Network.Use {
		if _, ok := c.origin[useKey+name]; !ok && c.origin != nil {
			c.origin[useKey+name] = where(f.Path, f.ix, fmt.Sprintf("network.use[%d]", i))
		}
	}
}

// useKey prefixes the origin of a name in network.use.
const useKey = "network.use:"

// validateUse checks that every name in network.use is built in or
// defined by one of the merged files: a policy may be defined in the
// user's file and used in a project's.
func (c Config) validateUse() error {
	for _, name := range c.Network.Use {
		if slices.Contains(BuiltinPolicies, name) {
			continue
		}
		if _, ok := c.Network.Policies[name]; ok {
			continue
		}
		known := append([]string(nil), BuiltinPolicies...)
		known = append(known, sortedKeys(c.Network.Policies)...)
		e := &Error{Key: "network.use"}
		if at := c.origin[useKey+name]; at != nil {
			*e = *at
		}
		e.Msg = fmt.Sprintf("unknown policy %q; define it with a [policies.%s] table (allow, block, source), or use one of: %s",
			name, name, strings.Join(known, ", "))
		return e
	}
	return nil
}
