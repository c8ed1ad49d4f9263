package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// File is one parsed and checked configuration file: one layer for Merge.
// Scalars are pointers, nil when the file does not set them, because
// "not set" must let a lower scope through while "set to the default"
// must not.
type File struct {
	Path     string
	Sandbox  SandboxLayer
	Shares   []Share
	Files    []CopyFile
	Network  NetworkLayer
	Secrets  map[string]Secret
	Env      []EnvVar // in file order
	Forwards Forwards
	Hooks    Hooks
	SSHAgent SSHAgent
	Policies map[string]Policy // [policies.NAME]
	Audit    AuditLayer
	MCP      map[string]MCPServer // [mcp.NAME]
	// Workspace is [workspace] repos: the repositories `moat work` opens
	// a ticket across, as absolute host paths (internal/ticket).
	Workspace []string

	ix *docIndex // positions of keys, for errors found after merging
}

// AuditLayer is the [audit] table of one file: nil where it is silent.
type AuditLayer struct {
	MaxBytes  *uint64
	Retention *time.Duration
}

// SandboxLayer is the [sandbox] table of one file.
type SandboxLayer struct {
	Name           *string
	Image          *string
	Runtime        *string
	CPUs           *int
	MemoryBytes    *uint64
	MemoryMaxBytes *uint64
	PidsMax        *int
	// IdleTimeout is 0 for "off": no accepted duration is shorter than
	// a minute, so 0 cannot mean anything else.
	IdleTimeout *time.Duration
	// DaemonMemoryMaxBytes limits the sandbox's daemon group
	// (resources.DaemonLimit); absent: derived from memory_max.
	DaemonMemoryMaxBytes *uint64
	// DiskBytes is 0 for "unlimited": no accepted size is below
	// disk.MinBytes, so 0 cannot mean anything else.
	DiskBytes *uint64
	// Platform is gVisor's platform: "auto", "systrap" or "kvm".
	Platform *string
	// IdleAction is what the idle timeout does: "suspend" or "stop".
	IdleAction *string
}

// ParseFile reads and parses path. A missing file is an error wrapping
// fs.ErrNotExist, so that a caller who named the file explicitly can say
// so; LoadOptional is for files that may be absent.
func ParseFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return Parse(path, data)
}

// LoadOptional is ParseFile, except that a missing file, or an empty
// path, gives (nil, nil): neither the user nor the project file needs to
// exist.
func LoadOptional(path string) (*File, error) {
	if path == "" {
		return nil, nil
	}
	f, err := ParseFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return f, err
}

// Parse parses data as the configuration file at path. path names the
// file in errors and anchors relative paths in it.
func Parse(path string, data []byte) (*File, error) {
	var raw rawFile
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, decodeError(path, data, err)
	}
	c, err := newChecker(path, indexDoc(data))
	if err != nil {
		return nil, err
	}
	f := c.file(&raw)
	if len(c.errs) > 0 {
		return nil, joinErrors(c.errs)
	}
	return f, nil
}

// The raw* types are the schema as the decoder sees it. Their field
// names are the TOML keys, so they are frozen: renaming one breaks every
// moat.toml that uses it.
type rawFile struct {
	Sandbox   rawSandbox           `toml:"sandbox"`
	Shares    []rawShare           `toml:"shares"`
	Files     []rawCopy            `toml:"files"`
	Network   rawNetwork           `toml:"network"`
	Secrets   map[string]rawSecret `toml:"secrets"`
	Env       map[string]any       `toml:"env"` // strings, or true: the host's value
	Forwards  rawForwards          `toml:"forwards"`
	Hooks     rawHooks             `toml:"hooks"`
	SSHAgent  rawSSHAgent          `toml:"ssh_agent"`
	Policies  map[string]rawPolicy `toml:"policies"`
	Audit     rawAudit             `toml:"audit"`
	MCP       map[string]rawMCP    `toml:"mcp"`
	Workspace rawWorkspace         `toml:"workspace"`
}

type rawWorkspace struct {
	Repos []string `toml:"repos"`
}

type rawAudit struct {
	MaxSize   *string `toml:"max_size"`
	Retention *string `toml:"retention"`
}

type rawSandbox struct {
	Name        *string `toml:"name"`
	Image       *string `toml:"image"`
	Runtime     *string `toml:"runtime"`
	CPUs        *int64  `toml:"cpus"`
	Memory      *string `toml:"memory"`
	MemoryMax   *string `toml:"memory_max"`
	PidsMax     *int64  `toml:"pids_max"`
	IdleTimeout *string `toml:"idle_timeout"`
	DaemonMax   *string `toml:"daemon_memory_max"`
	Disk        *string `toml:"disk"`
	Platform    *string `toml:"platform"`
	IdleAction  *string `toml:"idle_action"`
}

type rawShare struct {
	Path   *string `toml:"path"`
	Target *string `toml:"target"`
	RW     bool    `toml:"rw"`
}

type rawCopy struct {
	Source *string `toml:"source"`
	Target *string `toml:"target"`
	Mode   *string `toml:"mode"`
}

type rawNetwork struct {
	Use     []string `toml:"use"`
	Allow   []string `toml:"allow"`
	Block   []string `toml:"block"`
	Inspect *bool    `toml:"inspect"`
	Trust   []string `toml:"trust"`
	Mode    *string  `toml:"mode"`

	MaxConnections *int64 `toml:"max_connections"`
	MaxDNSQueries  *int64 `toml:"max_dns_queries"`
	MaxHolds       *int64 `toml:"max_holds"`
}

type rawSecret struct {
	From    *string  `toml:"from"`
	Hosts   []string `toml:"hosts"`
	Header  *string  `toml:"header"`
	Query   *string  `toml:"query"`
	Require bool     `toml:"require"`
}

type rawForwards struct {
	Ports   []any `toml:"ports"` // integers or "host:guest" strings
	Reverse []any `toml:"reverse"`
}

type rawSSHAgent struct {
	Keys    []string `toml:"keys"`
	Confirm *bool    `toml:"confirm"`
}

type rawHooks struct {
	OnCreate []string `toml:"on_create"`
	OnUp     []string `toml:"on_up"`
}

// knownKeys lists each table's keys for "unknown key" errors, in the
// order the documentation gives them. It must match the raw* types.
var knownKeys = map[string][]string{
	"":           {"sandbox", "shares", "files", "network", "secrets", "env", "forwards", "hooks", "policies", "ssh_agent", "audit", "mcp", "workspace"},
	"sandbox":    {"name", "image", "runtime", "cpus", "memory", "memory_max", "pids_max", "idle_timeout", "daemon_memory_max", "disk", "platform"},
	"shares[]":   {"path", "target", "rw"},
	"files[]":    {"source", "target", "mode"},
	"network":    {"use", "allow", "block", "inspect", "trust", "mode", "max_connections", "max_dns_queries", "max_holds"},
	"secrets.*":  {"from", "hosts", "header", "query", "require"},
	"policies.*": {"allow", "block", "source", "refresh"},
	"forwards":   {"ports", "reverse"},
	"hooks":      {"on_create", "on_up"},
	"ssh_agent":  {"keys", "confirm"},
	"audit":      {"max_size", "retention"},
	"mcp.*":      {"url", "secret", "tools", "resources", "audit_arguments"},
	"workspace":  {"repos"},
}

// want is what a key's value must be, for type errors.
type want struct {
	desc  string
	kinds []unstable.Kind
}

var (
	wantTable   = want{"a table", []unstable.Kind{unstable.Table, unstable.InlineTable}}
	wantString  = want{"a string", []unstable.Kind{unstable.String}}
	wantInt     = want{"an integer", []unstable.Kind{unstable.Integer}}
	wantBool    = want{"true or false", []unstable.Kind{unstable.Bool}}
	wantList    = want{"a list of strings, e.g. [\"a\", \"b\"]", []unstable.Kind{unstable.Array}}
	wantSize    = want{`a size string such as "1GiB" (with quotes)`, []unstable.Kind{unstable.String}}
	wantDisk    = want{`a size string such as "20GiB", or "unlimited"`, []unstable.Kind{unstable.String}}
	wantIdle    = want{`a duration string such as "30m", or "off"`, []unstable.Kind{unstable.String}}
	wantPorts   = want{`a list of ports, e.g. [3000, "8080:80"]`, []unstable.Kind{unstable.Array}}
	wantPort    = want{`a port (3000) or a "host:guest" string ("8080:80")`, []unstable.Kind{unstable.Integer, unstable.String}}
	wantShares  = want{"a list of tables: write [[shares]] sections", []unstable.Kind{unstable.Array, unstable.ArrayTable}}
	wantFiles   = want{"a list of tables: write [[files]] sections", []unstable.Kind{unstable.Array, unstable.ArrayTable}}
	wantMode    = want{`an octal mode string such as "0600" (with quotes)`, []unstable.Kind{unstable.String}}
	wantShare   = want{"a table", []unstable.Kind{unstable.ArrayTable, unstable.InlineTable}}
	wantEnv     = want{`a string ("literal", "${HOST_VAR:-default}") or true (the host's value of the same name)`, []unstable.Kind{unstable.String, unstable.Bool}}
	wantSecrets = want{"a table of [secrets.NAME] tables", []unstable.Kind{unstable.Table, unstable.InlineTable}}
)

// wants is the schema by pattern (see pattern): what each value must be.
var wants = map[string]want{
	"sandbox":              wantTable,
	"sandbox.name":         wantString,
	"sandbox.image":        wantString,
	"sandbox.runtime":      wantString,
	"sandbox.cpus":         wantInt,
	"sandbox.memory":       wantSize,
	"sandbox.memory_max":   wantSize,
	"sandbox.pids_max":     wantInt,
	"sandbox.idle_timeout": wantIdle,
	"shares":               wantShares,
	"shares[]":             wantShare,
	"shares[].path":        wantString,
	"shares[].target":      wantString,
	"shares[].rw":          wantBool,
	"files":                wantFiles,
	"files[]":              wantShare,
	"files[].source":       wantString,
	"files[].target":       wantString,
	"files[].mode":         wantMode,
	"network":              wantTable,
	"network.use":          wantList,
	"network.allow":        wantList,
	"network.block":        wantList,
	"network.inspect":      wantBool,
	"network.mode":         wantString,
	"network.trust":        wantList,
	"network.trust[]":      wantString,
	"network.use[]":        wantString,
	"network.allow[]":      wantString,
	"network.block[]":      wantString,
	"secrets":              wantSecrets,
	"secrets.*":            wantTable,
	"policies":             {"a table of [policies.NAME] tables", []unstable.Kind{unstable.Table, unstable.InlineTable}},
	"policies.*":           wantTable,
	"policies.*.allow":     wantList,
	"policies.*.allow[]":   wantString,
	"policies.*.block":     wantList,
	"policies.*.block[]":   wantString,
	"policies.*.source":    wantString,
	"policies.*.refresh":   {`a duration string such as "24h"`, []unstable.Kind{unstable.String}},
	"secrets.*.from":       wantString,
	"secrets.*.hosts":      wantList,
	"secrets.*.hosts[]":    wantString,
	"secrets.*.header":     wantString,
	"secrets.*.query":      wantString,
	"secrets.*.require":    wantBool,
	"env":                  wantTable,
	"env.*":                wantEnv,
	"forwards":             wantTable,
	"forwards.ports":       wantPorts,
	"forwards.reverse":     wantPorts,
	"forwards.ports[]":     wantPort,
	"forwards.reverse[]":   wantPort,
	"hooks":                wantTable,
	"hooks.on_create":      wantList,
	"hooks.on_up":          wantList,
	"hooks.on_create[]":    wantString,
	"hooks.on_up[]":        wantString,
	"ssh_agent":            wantTable,
	"ssh_agent.keys":       wantList,
	"ssh_agent.keys[]":     wantString,
	"ssh_agent.confirm":    wantBool,
	"audit":                wantTable,
	"audit.max_size":       wantSize,
	"audit.retention":      {`a duration string such as "7d" or "48h"`, []unstable.Kind{unstable.String}},

	// In its own block: one long key would realign the whole table.
	"sandbox.daemon_memory_max": wantSize,
	"sandbox.disk":              wantDisk,
	"sandbox.platform":          wantString,
	"sandbox.idle_action":       wantString,

	"workspace":         wantTable,
	"workspace.repos":   wantList,
	"workspace.repos[]": wantString,

	// The gate's per-sandbox bounds.
	"network.max_connections": wantInt,
	"network.max_dns_queries": wantInt,
	"network.max_holds":       wantInt,
}

// decodeError turns the decoder's error into *Errors that name the full
// key and say what to write. The decoder's own messages name Go types
// ("into struct field rawSandbox.CPUs of type int64") and only the last
// key part, which helps nobody editing moat.toml.
func decodeError(path string, data []byte, err error) error {
	ix := indexDoc(data)
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var errs []error
		for i := range strict.Errors {
			errs = append(errs, unknownKey(path, ix, &strict.Errors[i]))
		}
		return joinErrors(errs)
	}
	var de *toml.DecodeError
	if !errors.As(err, &de) {
		return &Error{File: path, Msg: fmt.Sprintf("reading TOML: %v", err)}
	}
	line, col := de.Position()
	e := &Error{File: path, Line: line, Col: col}
	msg := strings.TrimPrefix(de.Error(), "toml: ")
	if !ix.ok {
		e.Msg = "TOML syntax error: " + msg
		return e
	}
	if d := ix.dup; d != nil {
		first, _ := ix.lookup(d.key)
		e.Line, e.Col, e.Key = d.key1.line, d.key1.col, d.key
		e.Msg = fmt.Sprintf("set twice (first on line %d); remove one", first.key1.line)
		return e
	}
	ent, ok := ix.at(line, col)
	if !ok {
		// The decoder could not place a nested array (it has no range
		// of its own); its key still finds it.
		ent, ok = ix.lookup(displayKey(de.Key()))
	}
	if !ok {
		e.Key = displayKey(de.Key())
		e.Msg = msg
		return e
	}
	if m := typeMismatch(ix, ent); m != nil {
		m.File = path
		return m
	}
	e.Key = ent.key
	e.Msg = msg
	return e
}

// typeMismatch explains a decoding error at ent by the schema, or returns
// nil when the kind is one the schema accepts (a too large integer).
func typeMismatch(ix *docIndex, ent entry) *Error {
	parts, kind := ent.parts, ent.kind
	if kind == unstable.ArrayTable {
		parts = parts[:len(parts)-1] // [[x]] is about x, not x[0]
	}
	// A dotted key under a scalar (sandbox.memory.max = …) makes the
	// scalar a table: the mismatch is at the shortest known prefix.
	for i := 1; i < len(parts); i++ {
		if w, ok := wants[pattern(parts[:i])]; ok && !slices.Contains(w.kinds, unstable.Table) &&
			!slices.Contains(w.kinds, unstable.ArrayTable) && !slices.Contains(w.kinds, unstable.Array) {
			parts, kind = parts[:i], unstable.Table
			ent.val = ent.key1 // point at the key, not at max's value
			break
		}
	}
	w, ok := wants[pattern(parts)]
	if !ok {
		return nil
	}
	pos := ent.val
	if pos.line == 0 {
		pos = ent.key1
	}
	if slices.Contains(w.kinds, kind) {
		// The list itself is fine; find the element that is not.
		elem, ok := wants[pattern(parts)+"[]"]
		if !ok {
			return nil
		}
		for i := 0; ; i++ {
			c, ok := ix.lookup(displayKey(parts) + "[" + strconv.Itoa(i) + "]")
			if !ok {
				return nil
			}
			if !slices.Contains(elem.kinds, c.kind) {
				return typeMismatch(ix, c)
			}
		}
	}
	return &Error{Line: pos.line, Col: pos.col, Key: displayKey(parts),
		Msg: fmt.Sprintf("expected %s, got %s", w.desc, kindName(kind))}
}

// unknownKey names the first key part that is not in the schema, and
// lists the keys that are, with a guess when one is a likely typo.
func unknownKey(path string, ix *docIndex, de *toml.DecodeError) error {
	line, col := de.Position()
	parts := []string(de.Key())
	if ent, ok := ix.at(line, col); ok {
		parts = ent.parts
	}
	// Find the deepest known table the key is inside; the next part is
	// the unknown one (for sandbox.foo.bar that is "foo").
	table, n := "", 0
	for i := range parts {
		if _, ok := knownKeys[pattern(parts[:i])]; ok {
			table, n = pattern(parts[:i]), i
		}
	}
	if n < len(parts) && strings.HasPrefix(parts[n], "[") {
		n++ // never stop on an array position
	}
	key := displayKey(parts[:min(n+1, len(parts))])
	unknown := ""
	if n < len(parts) {
		unknown = parts[n]
	}
	known := knownKeys[table]
	where := "known keys in " + tableName(parts[:n])
	if table == "" {
		where = "known top-level tables"
	}
	msg := fmt.Sprintf("unknown key %q; %s: %s", key, where, strings.Join(known, ", "))
	if s := suggest(unknown, known); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return &Error{File: path, Line: line, Col: col, Key: key, Msg: msg, keyInMsg: true}
}

// tableName writes a table the way it is written in the file: [sandbox],
// [[shares]], [secrets.NAME].
func tableName(parts []string) string {
	if n := len(parts); n > 0 && strings.HasPrefix(parts[n-1], "[") {
		return "[[" + displayKey(parts[:n-1]) + "]]"
	}
	return "[" + displayKey(parts) + "]"
}

// suggest returns the known key within two edits of s, if exactly one is.
func suggest(s string, known []string) string {
	best := ""
	for _, k := range known {
		if editDistance(s, k) <= 2 {
			if best != "" {
				return ""
			}
			best = k
		}
	}
	return best
}

// editDistance is the optimal string alignment distance (Levenshtein with
// transpositions, so "imgae" is one edit from "image").
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99 // not a typo of any of our keys; spare the work
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

func kindName(k unstable.Kind) string {
	switch k {
	case unstable.String:
		return "a string"
	case unstable.Integer:
		return "an integer"
	case unstable.Float:
		return "a float"
	case unstable.Bool:
		return "a boolean"
	case unstable.Array:
		return "a list"
	case unstable.Table, unstable.InlineTable:
		return "a table"
	case unstable.ArrayTable:
		return "an array of tables"
	default:
		return "a date or time"
	}
}

// joinErrors returns the single error, or all of them in file order, so
// that one run shows every problem in a file rather than one per edit.
func joinErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	sort.SliceStable(errs, func(i, j int) bool {
		a, b := errs[i].(*Error), errs[j].(*Error)
		return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col
	})
	return errors.Join(errs...)
}
