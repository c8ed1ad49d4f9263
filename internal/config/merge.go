package config

import (
	"fmt"
	"slices"
)

// Load reads the user and project files (either may be missing, or ""),
// merges them over the defaults and validates the result.
func Load(userPath, projectPath string) (Config, error) {
	user, err := LoadOptional(userPath)
	if err != nil {
		return Config{}, err
	}
	project, err := LoadOptional(projectPath)
	if err != nil {
		return Config{}, err
	}
	c := Merge(user, project)
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Merge layers files over Defaults, lowest scope first (user, project,
// then flags); nil files are skipped.
//
// A scalar comes from the narrowest file that sets it. Lists are unioned
// in order, lowest scope first, dropping repeats. Entries with an
// identity are replaced in place by a narrower file: a share by its guest
// target, a forward by the port it listens on, an env var by its name,
// and a secret by its name, whole: a secret is one binding of a source to
// hosts, and mixing one file's source with another's hosts would send a
// credential somewhere neither file said.
//
// [network] inspect is a scalar like the [sandbox] ones, so a project
// can turn off the inspection a user's file turned on; trust is a list.
//
// memory without memory_max in the same or a narrower file means a fixed
// size: the ceiling becomes the baseline. Otherwise "memory = 512MiB"
// would keep the default 4GiB ceiling, and the user who asked for a small
// sandbox would get one that can grow eight times larger.
//
// Merge cannot fail; call Validate for the checks that span files.
func Merge(layers ...*File) Config {
	c := Defaults()
	c.origin = map[string]*Error{}
	for _, f := range layers {
		if f == nil {
			continue
		}
		c.Sources = append(c.Sources, f.Path)
		c.mergeSandbox(f)
		c.mergePolicies(f)
		c.mergeMCP(f)
		for _, s := range f.Shares {
			c.Shares = upsert(c.Shares, s, func(a, b Share) bool { return a.Target == b.Target })
		}
		for _, x := range f.Files {
			c.Files = upsert(c.Files, x, func(a, b CopyFile) bool { return a.Target == b.Target })
		}
		c.mergeNetwork(f.Network)
		setVal(&c.Audit.MaxBytes, f.Audit.MaxBytes)
		setVal(&c.Audit.Retention, f.Audit.Retention)
		for _, name := range sortedKeys(f.Secrets) {
			c.Secrets[name] = f.Secrets[name]
		}
		if f.SSHAgent.Confirm {
			// Any file asking for confirmation gets it: it only narrows.
			c.SSHAgent.Confirm = true
		}
		if len(f.SSHAgent.Keys) > 0 {
			c.SSHAgent.Keys = union(c.SSHAgent.Keys, f.SSHAgent.Keys)
			c.SSHAgent.Sources = union(c.SSHAgent.Sources, f.SSHAgent.Sources)
		}
		for _, e := range f.Env {
			c.Env[e.Name] = e.Value
			c.EnvVars = upsert(c.EnvVars, e, func(a, b EnvVar) bool { return a.Name == b.Name })
		}
		for _, p := range f.Forwards.Ports {
			c.Forwards.Ports = upsert(c.Forwards.Ports, p, func(a, b Forward) bool { return a.Host == b.Host })
		}
		for _, p := range f.Forwards.Reverse {
			c.Forwards.Reverse = upsert(c.Forwards.Reverse, p, func(a, b Forward) bool { return a.Guest == b.Guest })
		}
		c.Hooks.OnCreate = union(c.Hooks.OnCreate, f.Hooks.OnCreate)
		c.Hooks.OnUp = union(c.Hooks.OnUp, f.Hooks.OnUp)
	}
	return c
}

func (c *Config) mergeSandbox(f *File) {
	s := f.Sandbox
	set := func(key string, ok bool) {
		if ok {
			c.origin[key] = where(f.Path, f.ix, key)
		}
	}
	setVal(&c.Sandbox.Name, s.Name)
	set("sandbox.name", s.Name != nil)
	setVal(&c.Sandbox.Image, s.Image)
	set("sandbox.image", s.Image != nil)
	setVal(&c.Sandbox.Runtime, s.Runtime)
	set("sandbox.runtime", s.Runtime != nil)
	setVal(&c.Sandbox.CPUs, s.CPUs)
	set("sandbox.cpus", s.CPUs != nil)
	setVal(&c.Sandbox.PidsMax, s.PidsMax)
	set("sandbox.pids_max", s.PidsMax != nil)
	if s.MemoryBytes != nil {
		c.Sandbox.MemoryBytes = *s.MemoryBytes
		set("sandbox.memory", true)
		if s.MemoryMaxBytes == nil {
			// The fixed-size rule; the origin points at memory, the
			// line that made the ceiling what it is.
			c.Sandbox.MemoryMaxBytes = *s.MemoryBytes
			c.origin["sandbox.memory_max"] = c.origin["sandbox.memory"]
		}
	}
	setVal(&c.Sandbox.MemoryMaxBytes, s.MemoryMaxBytes)
	set("sandbox.memory_max", s.MemoryMaxBytes != nil)
	setVal(&c.Sandbox.DaemonMemoryMaxBytes, s.DaemonMemoryMaxBytes)
	set("sandbox.daemon_memory_max", s.DaemonMemoryMaxBytes != nil)
	if s.DiskBytes != nil {
		c.Sandbox.DiskBytes = *s.DiskBytes
		c.Sandbox.DiskUnlimited = *s.DiskBytes == 0
		c.Sandbox.DiskFrom = f.Path
		set("sandbox.disk", true)
	}
	setVal(&c.Sandbox.Platform, s.Platform)
	set("sandbox.platform", s.Platform != nil)
	setVal(&c.Sandbox.IdleAction, s.IdleAction)
	set("sandbox.idle_action", s.IdleAction != nil)
	if s.IdleTimeout != nil {
		c.Sandbox.IdleTimeout = *s.IdleTimeout
		c.Sandbox.IdleOff = *s.IdleTimeout == 0
		set("sandbox.idle_timeout", true)
	}
}

func (c *Config) mergeNetwork(n NetworkLayer) {
	c.Network.Use = union(c.Network.Use, n.Use)
	c.Network.Allow = union(c.Network.Allow, n.Allow)
	c.Network.Block = union(c.Network.Block, n.Block)
	setVal(&c.Network.Inspect, n.Inspect)
	c.Network.Trust = union(c.Network.Trust, n.Trust)
	if n.Mode != "" {
		c.Network.Mode = n.Mode
	}
	setVal(&c.Network.MaxConnections, n.MaxConnections)
	setVal(&c.Network.MaxDNSQueries, n.MaxDNSQueries)
	setVal(&c.Network.MaxHolds, n.MaxHolds)
	if len(n.Use)+len(n.Allow)+len(n.Block)+len(n.Trust) > 0 || n.Inspect != nil || n.Mode != "" {
		c.Network.Layers = append(c.Network.Layers, n)
	}
}

// Validate checks what no single file can: that the merged ceiling is
// not below the merged baseline. The error points at the narrower of the
// two settings, the one the user most likely just wrote.
func (c Config) Validate() error {
	if err := c.validateUse(); err != nil {
		return err
	}
	if err := c.validateMCP(); err != nil {
		return err
	}
	s := c.Sandbox
	if s.MemoryMaxBytes >= s.MemoryBytes {
		return nil
	}
	memAt, maxAt := c.origin["sandbox.memory"], c.origin["sandbox.memory_max"]
	describe := func(e *Error) string {
		if e == nil {
			return "built-in default"
		}
		return e.position()
	}
	mem, ceil := FormatSize(s.MemoryBytes), FormatSize(s.MemoryMaxBytes)
	out := &Error{Key: "sandbox.memory_max"}
	at := maxAt
	out.Msg = fmt.Sprintf("%s is less than sandbox.memory %s (%s); raise memory_max, or set memory in the same file",
		ceil, mem, describe(memAt))
	if maxAt == nil || c.narrower(memAt, maxAt) {
		at, out.Key = memAt, "sandbox.memory"
		out.Msg = fmt.Sprintf("%s is more than sandbox.memory_max %s (%s); lower memory, or set memory_max in the same file",
			mem, ceil, describe(maxAt))
	}
	if at != nil {
		out.File, out.Line, out.Col = at.File, at.Line, at.Col
	}
	return out
}

// narrower reports whether a was set by a narrower file than b.
func (c Config) narrower(a, b *Error) bool {
	if a == nil {
		return false
	}
	if b == nil {
		return true
	}
	return slices.Index(c.Sources, a.File) > slices.Index(c.Sources, b.File)
}

func setVal[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

func union(list, more []string) []string {
	for _, s := range more {
		list = appendNew(list, s)
	}
	return list
}

// upsert replaces the entry same as v in place, keeping its position (a
// lower scope's order stands), or appends v.
func upsert[T any](list []T, v T, same func(a, b T) bool) []T {
	for i := range list {
		if same(list[i], v) {
			list[i] = v
			return list
		}
	}
	return append(list, v)
}
