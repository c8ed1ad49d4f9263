// Package state owns moat's files on disk: where they live (MOAT_HOME or
// the XDG directories) and the per-sandbox record that both the CLI and the
// daemon write.
//
// The record is the only place a sandbox's life is written down. The CLI
// writes what the user wants (Desired); the daemon writes what is (State,
// StopReason). Both write under one file lock and replace the file by rename,
// so a reader never sees half a record and two writers never lose each
// other's change.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/config"
)

// Dirs are moat's three roots.
type Dirs struct {
	Config string // config.toml
	State  string // one directory per sandbox under sandboxes/
	Cache  string // images, unpacked layers
}

// Resolve finds moat's directories: $MOAT_HOME/{config,state,cache} when
// MOAT_HOME is set (tests always set it), else the XDG locations.
func Resolve() (Dirs, error) {
	if h := os.Getenv("MOAT_HOME"); h != "" {
		abs, err := filepath.Abs(h)
		if err != nil {
			return Dirs{}, fmt.Errorf("resolving MOAT_HOME: %w", err)
		}
		return Dirs{Config: filepath.Join(abs, "config"), State: filepath.Join(abs, "state"), Cache: filepath.Join(abs, "cache")}, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return Dirs{}, fmt.Errorf("finding home directory (set MOAT_HOME instead): %w", err)
	}
	xdg := func(env, def string) string {
		if v := os.Getenv(env); filepath.IsAbs(v) {
			return filepath.Join(v, "moat")
		}
		return filepath.Join(home, def, "moat")
	}
	return Dirs{
		Config: xdg("XDG_CONFIG_HOME", ".config"),
		State:  xdg("XDG_STATE_HOME", ".local/state"),
		Cache:  xdg("XDG_CACHE_HOME", ".cache"),
	}, nil
}

// UserConfig is the path of the user's config file.
func (d Dirs) UserConfig() string { return filepath.Join(d.Config, "config.toml") }

// Images is the image store's root.
func (d Dirs) Images() string { return filepath.Join(d.Cache, "images") }

// Sandboxes is the directory holding one directory per sandbox.
func (d Dirs) Sandboxes() string { return filepath.Join(d.State, "sandboxes") }

// Sandbox is the state directory of the sandbox called name.
func (d Dirs) Sandbox(name string) string { return filepath.Join(d.Sandboxes(), name) }

// Lifecycle states, persisted in record.json: frozen.
const (
	StateCreated  = "created"
	StateStarting = "starting"
	StateRunning  = "running"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateCrashed  = "crashed" // never written: derived when the record says running but no daemon holds the lock
	// A suspended sandbox's guest is saved, memory and all, in its
	// checkpoint image (runtime.SuspendDir) and nothing of it runs; its
	// next start restores it. Suspending is the daemon ending sessions
	// and writing that image; resuming, its start from one.
	StateSuspending = "suspending"
	StateSuspended  = "suspended"
	StateResuming   = "resuming"
)

// Stop reasons, persisted: frozen.
const (
	StopUser  = "user"
	StopIdle  = "idle"
	StopCrash = "crash"
	StopHost  = "host"
	StopError = "error"
	// StopSuspend: stopped by `moat suspend`, with the guest saved.
	StopSuspend = "suspend"
)

// RecordSchema is the version of record.json. Bump it only with a migration.
const RecordSchema = 1

// Record is record.json. Field names are frozen: old records must keep
// loading.
type Record struct {
	Schema     int       `json:"schema"`
	Name       string    `json:"name"`
	Workspace  string    `json:"workspace"`
	Image      string    `json:"image"`
	Runtime    string    `json:"runtime"`
	Desired    string    `json:"desired"` // running | stopped
	State      string    `json:"state"`
	StopReason string    `json:"stop_reason,omitempty"`
	Error      string    `json:"error,omitempty"` // last start failure, for humans
	Created    time.Time `json:"created"`
	Started    time.Time `json:"started,omitzero"`
	Stopped    time.Time `json:"stopped,omitzero"`
	DaemonPID  int       `json:"daemon_pid,omitempty"`
	GuestUID   int       `json:"guest_uid"`
	GuestGID   int       `json:"guest_gid"`
	// Config is the effective configuration snapshotted at create, so editing
	// moat.toml later changes nothing until --reconfigure.
	Config json.RawMessage `json:"config,omitempty"`
	// Rules are the network rules added at run time (`moat network
	// allow|block`): the highest layer, kept with the sandbox across
	// restarts and discarded by destroy.
	Rules *RuntimeRules `json:"runtime_rules,omitempty"`
	// Presets are the agent presets used in this sandbox (`moat run
	// claude`), whose hosts and credentials every start adds again.
	Presets []string `json:"presets,omitempty"`
	// Placeholders are what the guest sees in place of each secret, by
	// secret name. They are not secret (the gate swaps them for the real
	// values on the way out); they stay the same across restarts so a
	// process in the guest that kept one keeps working.
	Placeholders map[string]string `json:"placeholders,omitempty"`
	// SetUp is set once on_create has succeeded; until then every start
	// runs it from the start.
	SetUp bool `json:"set_up,omitempty"`
	// Hook names the hook running now ("on_create 1/3"), so a command
	// waiting for the start knows it is long for a reason.
	Hook string `json:"hook,omitempty"`
	// Forwards are the port forwards added at run time (`moat forward
	// add`), started again with the sandbox and discarded by destroy.
	Forwards *RuntimeForwards `json:"runtime_forwards,omitempty"`
	// GuestOOMKills counts the guest processes killed at the memory
	// ceiling (resources/oom.go) over the sandbox's life; LastOOMKill
	// says when, which process and how large.
	GuestOOMKills int    `json:"guest_oom_kills,omitempty"`
	LastOOMKill   string `json:"last_oom_kill,omitempty"`
	// GateUID is the uid (and gid) the sandbox's gate process runs as,
	// one no other sandbox and nothing of the host's has; allocated at
	// the first start and kept.
	GateUID int `json:"gate_uid,omitempty"`
}

// RuntimeForwards are the port forwards added at run time. Field names
// are frozen.
type RuntimeForwards struct {
	Ports   []Forward `json:"ports,omitempty"`   // host → guest
	Reverse []Forward `json:"reverse,omitempty"` // guest → host
}

// Forward is one port forward: Host is the port on the host (listened on
// for Ports, dialed on 127.0.0.1 for Reverse), Guest the port in the
// guest (dialed for Ports, listened on at the gateway for Reverse).
// Address is the host address a host→guest forward listens on; empty
// means 127.0.0.1.
type Forward struct {
	Host    uint16 `json:"host"`
	Guest   uint16 `json:"guest"`
	Address string `json:"address,omitempty"`
}

// RuntimeRules are the runtime layer of the network policy. Entries are
// as the user typed them; the gate parses them.
type RuntimeRules struct {
	Allow []string `json:"allow,omitempty"`
	Block []string `json:"block,omitempty"`
}

// ErrNoSandbox is returned when a sandbox has no record.
var ErrNoSandbox = errors.New("no such sandbox")

const recordFile = "record.json"

// Load reads the record in dir.
func Load(dir string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoSandbox, filepath.Base(dir))
	}
	if err != nil {
		return nil, fmt.Errorf("reading record: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", filepath.Join(dir, recordFile), err)
	}
	if r.Schema > RecordSchema {
		return nil, fmt.Errorf("%s has schema %d, newer than this moat understands (%d); upgrade moat", filepath.Join(dir, recordFile), r.Schema, RecordSchema)
	}
	return &r, nil
}

// Create makes dir and writes its first record; it fails if one exists.
func Create(dir string, r *Record) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating sandbox directory: %w", err)
	}
	r.Schema = RecordSchema
	return Update(dir, func(old *Record) error {
		*old = *r
		return nil
	})
}

// Update reads, changes and rewrites the record under its lock. A missing
// record is passed as a zero Record only when the directory exists.
func Update(dir string, change func(*Record) error) error {
	unlock, err := Lock(filepath.Join(dir, "record.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	r, err := Load(dir)
	if errors.Is(err, ErrNoSandbox) {
		r = &Record{}
	} else if err != nil {
		return err
	}
	if err := change(r); err != nil {
		return err
	}
	r.Schema = RecordSchema
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding record: %w", err)
	}
	return WriteAtomic(filepath.Join(dir, recordFile), append(b, '\n'), 0o600)
}

// WriteAtomic writes data to path through a temporary file and a rename, so
// readers see the old content or the new, never a mix.
func WriteAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// Lock takes an exclusive flock on path, creating it, and returns the
// release function. It blocks until the lock is free.
func Lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// TryLock takes an exclusive flock on path without waiting. It returns
// ok=false when another process holds it. The daemon holds its sandbox's
// daemon.lock for its whole life, so "can I take it?" is "is the daemon
// dead?", with no pid reuse race.
func TryLock(path string) (release func(), ok bool, err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("opening lock %s: %w", path, err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return nil, false, nil
	}
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, true, nil
}

// DaemonLock is the path of the lock a sandbox's daemon holds while alive.
func DaemonLock(dir string) string { return filepath.Join(dir, "daemon.lock") }

// AuditDir is the directory of the sandbox's audit log: the one place on
// the host its gate process may write, so it holds nothing else.
func AuditDir(dir string) string { return filepath.Join(dir, "audit") }

// AuditPath is the sandbox's audit log (its rotations beside it).
func AuditPath(dir string) string { return filepath.Join(AuditDir(dir), "audit.jsonl") }

// DaemonAlive reports whether a daemon holds the sandbox's daemon lock.
func DaemonAlive(dir string) bool { return held(DaemonLock(dir)) }

// held reports whether a process holds the lock at path.
func held(path string) bool {
	release, ok, err := TryLock(path)
	if err != nil {
		return false
	}
	if ok {
		release()
		return false
	}
	return true
}

// StandbyLock is the path of the lock a standby daemon holds: one that
// `moat suspend --standby` started for a suspended sandbox, set up to its
// guest's restore and waiting to be told to go (daemon/standby.go). It
// takes the daemon lock only then, so a sandbox with a standby is
// suspended, not alive, to every reader.
func StandbyLock(dir string) string { return filepath.Join(dir, "standby.lock") }

// StandbyAlive reports whether a standby daemon holds the sandbox.
func StandbyAlive(dir string) bool { return held(StandbyLock(dir)) }

// Live says whether a sandbox in state st has a daemon, with a guest
// that runs or is about to: starting, running, stopping, suspending or
// resuming.
func Live(st string) bool {
	switch st {
	case StateStarting, StateRunning, StateStopping, StateSuspending, StateResuming:
		return true
	}
	return false
}

// Effective is the state a reader should show: a record that says it is
// Live while no daemon is alive is crashed.
func Effective(r *Record, dir string) (state, reason string) {
	if Live(r.State) && !DaemonAlive(dir) {
		return StateCrashed, StopCrash
	}
	return r.State, r.StopReason
}

// List loads every sandbox record, sorted by name.
func List(d Dirs) ([]*Record, error) {
	ents, err := os.ReadDir(d.Sandboxes())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	var out []*Record
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		r, err := Load(filepath.Join(d.Sandboxes(), e.Name()))
		if err != nil {
			continue // a directory being created or destroyed
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Snapshot is the configuration the sandbox was created with (or last
// reconfigured with): the one way every caller reads Record.Config. A
// record without one (made before snapshots) is the zero Config.
func (r *Record) Snapshot() (config.Config, error) {
	var cfg config.Config
	if len(r.Config) > 0 {
		if err := json.Unmarshal(r.Config, &cfg); err != nil {
			return config.Config{}, fmt.Errorf("reading the configuration snapshot of sandbox %q: %w", r.Name, err)
		}
	}
	return cfg, nil
}
