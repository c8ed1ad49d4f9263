// Package config reads moat's TOML configuration — the project's moat.toml
// and the user's ~/.config/moat/config.toml — and merges them over built-in
// defaults into the one Config a sandbox is created from.
//
// It exists because configuration is part of the sandbox's boundary: a
// misspelt key that is silently ignored ("imgae", "blok") would start a
// sandbox with a policy the user did not write. So parsing is strict: an
// unknown key, a wrong type, a bad size or duration is an error that names
// the file, line, column and full dotted key and says what to write instead.
//
// Precedence is built-in < user < project < flags. Lists are unioned,
// lowest scope first, without duplicates; a scalar is taken from the
// narrowest scope that sets it. Flags are applied as one more layer: the
// command line builds a File (Path "command line") and passes it last to
// Merge, so its values go through the same checks and carry an origin in
// error messages.
//
// The merge itself (Merge, Config.Validate) does no I/O. Parse resolves
// "~" through $HOME and relative paths against the file's directory, so
// that a File already holds the host paths it means.
package config

import (
	"errors"
	"fmt"
	"time"
)

// ErrInvalid is matched by every configuration error: errors.Is(err,
// ErrInvalid) tells a bad file apart from one that could not be read.
var ErrInvalid = errors.New("invalid configuration")

// Error is one problem in a configuration file. Line and Col are 1-based;
// zero means unknown (for example a value given on the command line).
type Error struct {
	File string // as given to Parse, e.g. "moat.toml"
	Line int
	Col  int
	Key  string // full dotted key, e.g. "sandbox.memory" or "shares[1].path"
	Msg  string // what is wrong and what to write instead

	// keyInMsg is set when Msg already quotes Key (unknown keys), so
	// Error does not print the key twice.
	keyInMsg bool
}

func (e *Error) Error() string {
	s := e.position()
	if s != "" {
		s += ": "
	}
	if e.Key != "" && !e.keyInMsg {
		s += e.Key + ": "
	}
	return s + e.Msg
}

// position is file:line:col, as far as it is known.
func (e *Error) position() string {
	s := e.File
	if s != "" && e.Line > 0 {
		s += fmt.Sprintf(":%d", e.Line)
		if e.Col > 0 {
			s += fmt.Sprintf(":%d", e.Col)
		}
	}
	return s
}

// Is makes errors.Is(err, ErrInvalid) true for every *Error.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Config is the effective configuration. It is snapshotted as JSON into
// the sandbox record at create, so its JSON names are frozen: renaming
// one makes old records unreadable.
type Config struct {
	Sandbox  Sandbox           `json:"sandbox"`
	Shares   []Share           `json:"shares,omitempty"`
	Files    []CopyFile        `json:"files,omitempty"`
	Network  Network           `json:"network"`
	Secrets  map[string]Secret `json:"secrets"`
	Env      map[string]string `json:"env"`
	EnvVars  []EnvVar          `json:"env_vars,omitempty"` // Env in file order, lowest scope first
	Forwards Forwards          `json:"forwards"`
	Hooks    Hooks             `json:"hooks"`
	SSHAgent SSHAgent          `json:"ssh_agent,omitzero"`
	Audit    Audit             `json:"audit,omitzero"`
	Sources  []string          `json:"sources,omitempty"` // files that contributed, lowest scope first

	// origin records where each scalar in Sandbox was set, so that
	// Validate can point at the line to change. Absent: built-in default.
	origin map[string]*Error
}

// Audit holds the [audit] scalars; zero is the audit package's default
// (audit.DefaultMaxBytes, audit.DefaultRetention).
type Audit struct {
	MaxBytes  uint64        `json:"max_bytes,omitempty"`
	Retention time.Duration `json:"retention,omitempty"`
}

// Sandbox holds the [sandbox] scalars.
type Sandbox struct {
	// Name is empty unless a file sets it; the CLI then derives one from
	// the workspace directory.
	Name string `json:"name,omitempty"`
	// Image is "host", an OCI reference, or an absolute path to an image
	// archive (Parse makes paths absolute, and no OCI reference starts
	// with "/", so the first byte tells them apart).
	Image          string        `json:"image"`
	Runtime        string        `json:"runtime"`
	CPUs           int           `json:"cpus"`
	MemoryBytes    uint64        `json:"memory_bytes"`     // baseline (soft limit)
	MemoryMaxBytes uint64        `json:"memory_max_bytes"` // ceiling (hard limit)
	PidsMax        int           `json:"pids_max"`
	IdleTimeout    time.Duration `json:"idle_timeout"` // zero when IdleOff
	IdleOff        bool          `json:"idle_off,omitempty"`
	// DaemonMemoryMaxBytes is the memory limit of the cgroup that holds
	// the sandbox's daemon (keeper and gate process); 0: derived from
	// MemoryMaxBytes (resources.DaemonLimit).
	DaemonMemoryMaxBytes uint64 `json:"daemon_memory_max_bytes,omitempty"`
	// DiskBytes limits the writable layer (internal/disk); 0: not set, a
	// new sandbox's image gets disk.Default and an existing one keeps its
	// size. DiskUnlimited: disk = "unlimited". DiskFrom: the file that set
	// it, which the daemon's errors name (the snapshot keeps no origins).
	DiskBytes     uint64 `json:"disk_bytes,omitempty"`
	DiskUnlimited bool   `json:"disk_unlimited,omitempty"`
	DiskFrom      string `json:"disk_from,omitempty"`
	// Platform is gVisor's platform as configured: "auto", "systrap" or
	// "kvm"; "" is "auto" (runtime.ChoosePlatform).
	Platform string `json:"platform,omitempty"`
	// IdleAction is what the idle timeout does: IdleSuspend, IdleStop,
	// or "" for suspend when the state's filesystem has room for the
	// image, else stop (daemon/suspend_idle.go).
	IdleAction string `json:"idle_action,omitempty"`
}

// Share is a host path mounted into the guest.
type Share struct {
	Path   string `json:"path"`   // absolute host path
	Target string `json:"target"` // absolute guest path; defaults to Path
	RW     bool   `json:"rw,omitempty"`
	// Source is the file that asked for this share. A project file comes
	// with the repository, so the CLI may want to show it before mounting
	// host paths it names.
	Source string `json:"source,omitempty"`
}

// CopyFile is a [[files]] entry: a host file copied into the guest at
// every start.
type CopyFile struct {
	Source string `json:"source"` // absolute host path
	Target string `json:"target"` // absolute guest path
	Mode   uint32 `json:"mode"`   // permission bits, default 0644
	Origin string `json:"origin,omitempty"`
}

// MaxCopyFile bounds one [[files]] entry: configuration files and keys,
// not datasets (those are [[shares]]).
const MaxCopyFile = 1 << 20

// NetworkLayer is the network rules of one file.
type NetworkLayer struct {
	Source string   `json:"source,omitempty"`
	Use    []string `json:"use,omitempty"`
	Allow  []string `json:"allow,omitempty"`
	Block  []string `json:"block,omitempty"`
	// Inspect is nil when the file does not set it, so that a narrower
	// file's silence lets a wider file's choice through.
	Inspect *bool `json:"inspect,omitempty"`
	// Trust is absolute paths of PEM files with extra root certificates.
	Trust []string `json:"trust,omitempty"`
	// Mode is ModeEnforce or ModeReport, empty when the file does not set it.
	Mode string `json:"mode,omitempty"`
	// The gate's per-sandbox bounds, nil when the file does not set them.
	MaxConnections *int `json:"max_connections,omitempty"`
	MaxDNSQueries  *int `json:"max_dns_queries,omitempty"`
	MaxHolds       *int `json:"max_holds,omitempty"`
}

// Network modes.
const (
	// ModeEnforce refuses what the policy denies (the default).
	ModeEnforce = "enforce"
	// ModeReport lets through what the policy would deny and audits it as
	// would_deny, to learn what an agent needs before enforcing.
	ModeReport = "report"
)

// Network is the merged network rules. Use, Allow and Block are the union
// over all files. Layers keeps each file's rules apart, lowest first,
// because the gate decides by layer (the highest layer with an opinion
// wins): a project's allow must beat a user's block of the same name,
// which a flat union, where deny wins a tie, cannot express.
//
// Inspect and Trust are about TLS, not about which destinations are
// allowed, so they are merged like any other scalar and list: Inspect
// from the narrowest file that sets it, Trust the union.
type Network struct {
	Use   []string `json:"use,omitempty"`
	Allow []string `json:"allow,omitempty"`
	Block []string `json:"block,omitempty"`
	// Inspect makes the gate terminate TLS for every allowed HTTPS host,
	// not only for hosts with a bound secret or method/path rules.
	Inspect bool `json:"inspect,omitempty"`
	// MaxConnections, MaxDNSQueries and MaxHolds bound what the gate
	// holds for the sandbox at once: open connections, DNS queries being
	// answered, destinations waiting for a watcher. 0: derived from
	// memory_max by the daemon (connections, DNS) or the gate's default.
	MaxConnections int `json:"max_connections,omitempty"`
	MaxDNSQueries  int `json:"max_dns_queries,omitempty"`
	MaxHolds       int `json:"max_holds,omitempty"`
	// Trust is PEM files of root certificates the gate accepts from
	// upstreams besides the host's own roots: a corporate TLS proxy, or
	// a test's own CA. Parse has checked that each holds certificates.
	Trust []string `json:"trust,omitempty"`
	// Mode is ModeEnforce or ModeReport, from the narrowest file that
	// sets it; empty means enforce.
	Mode   string         `json:"mode,omitempty"`
	Layers []NetworkLayer `json:"layers,omitempty"`
	// Policies are the [policies.NAME] tables of every file, by name; a
	// narrower file's definition replaces a wider one's whole. They
	// live here, not beside Network, so the gate gets them with its rules.
	Policies map[string]Policy `json:"policies,omitempty"`
	// MCP are the [mcp.NAME] servers of every file, by name; a narrower
	// file's declaration replaces a wider one's whole. Here for the same
	// reason as Policies: the gate decides their calls.
	MCP map[string]MCPServer `json:"mcp,omitempty"`
}

// Secret is a credential the gate swaps in for a placeholder. From names
// where the value comes from, never the value itself, so a Secret is safe
// to write to the record.
type Secret struct {
	Name    string   `json:"name"`
	From    string   `json:"from"` // "env:VAR", "file:/abs/path" or "command:..."
	Hosts   []string `json:"hosts"`
	Header  string   `json:"header,omitempty"`
	Query   string   `json:"query,omitempty"` // URL query parameter that may carry the placeholder
	Require bool     `json:"require,omitempty"`
	Source  string   `json:"source,omitempty"` // file that defined it
}

// EnvVar is one [env] entry. Value is the template as written; expand it
// with ExpandEnv on the host at create.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	// Pass (NAME = true) takes the host's value of NAME as it is; an
	// unset NAME stays unset in the guest.
	Pass   bool   `json:"pass,omitempty"`
	Source string `json:"source,omitempty"` // file that defined it

}

// Forward is one port forward. Both lists use "host:guest" order, so the
// order of the two numbers never depends on the direction.
type Forward struct {
	Host  uint16 `json:"host"`
	Guest uint16 `json:"guest"`
	// Source is the file that declared it, for consent.
	Source string `json:"source,omitempty"`
}

// Forwards are host→guest (Ports: the host listens) and guest→host
// (Reverse: the guest listens) port forwards.
type Forwards struct {
	Ports   []Forward `json:"ports,omitempty"`
	Reverse []Forward `json:"reverse,omitempty"`
}

// SSHAgent is [ssh_agent]: which keys of the host's ssh-agent the guest
// may list and sign with, by SHA256 fingerprint or by comment. None: the
// guest gets no agent at all.
type SSHAgent struct {
	Keys []string `json:"keys,omitempty"`
	// Confirm asks the interactive gate's watcher before each signature.
	Confirm bool `json:"confirm,omitempty"`
	// Sources are the files that listed keys, for consent.
	Sources []string `json:"sources,omitempty"`
}

// Hooks are shell commands run in the guest.
type Hooks struct {
	OnCreate []string `json:"on_create,omitempty"`
	OnUp     []string `json:"on_up,omitempty"`
}

// Built-in defaults.
const (
	defaultCPUs    = 4
	defaultPidsMax = 4096
	// 30 min: long enough to read docs between prompts, short
	// enough that forgotten sandboxes give their memory back.
	defaultIdle = 30 * time.Minute
)

// Defaults is the built-in layer.
func Defaults() Config {
	return Config{
		Sandbox: Sandbox{
			Image:          "host",
			Runtime:        "gvisor",
			CPUs:           defaultCPUs,
			MemoryBytes:    1 << 30,
			MemoryMaxBytes: 4 << 30,
			PidsMax:        defaultPidsMax,
			IdleTimeout:    defaultIdle,
		},
		Secrets: map[string]Secret{},
		Env:     map[string]string{},
	}
}

// The values of [sandbox] idle_action, persisted in the configuration
// snapshot: frozen.
const (
	IdleSuspend = "suspend"
	IdleStop    = "stop"
)
