// Package ticket is moat's ticket mode: one piece of work spanning several
// repositories of a workspace, each on a git worktree and a branch named
// after the ticket, in one sandbox, pushed and turned into linked pull
// requests from the host.
//
// It exists because the obvious ways to give a guest a worktree are
// unsafe or broken. A worktree's .git is a file naming its admin
// directory inside the main repository's .git; without the main .git
// mounted, git in the guest fails, and with all of it mounted read-write
// the guest can write .git/hooks or .git/config, which the host's git
// then runs. So the guest gets exactly the parts a worktree writes
// (objects, refs, logs, its own admin directory) read-write, at the
// paths the .git files name, and everything the host would execute or
// obey (hooks, config, info, the admin directory's commondir, gitdir and
// config.worktree) read-only (Mounts). The host, in turn, never trusts a
// file the guest could have written to find a repository: it runs git in
// the main repository, or with --git-dir set to the admin directory it
// recorded when it made the worktree, before any guest ran.
//
// Where things live: a ticket's record (ticket.json, the pull request
// cache) under moat's state, which no sandbox sees; its worktrees under a
// work directory outside the state (Store.Work), because moat refuses to
// mount anything inside its state into a guest.
package ticket

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/state"
)

// ErrNoTicket is returned for a ticket that has no record.
var ErrNoTicket = errors.New("no such ticket")

// Schema is the version of ticket.json.
const Schema = 1

// Ticket is ticket.json. Its field names are frozen: old records must
// keep loading.
type Ticket struct {
	Schema    int         `json:"schema"`
	Name      string      `json:"name"`
	Created   time.Time   `json:"created"`
	Worktrees []*Worktree `json:"worktrees"`
}

// Worktree is one repository's worktree in a ticket.
type Worktree struct {
	Repo string `json:"repo"` // the repository's name: its directory's last element
	Main string `json:"main"` // the main repository's work tree on the host
	// Common is the main repository's .git directory; Admin the
	// worktree's own directory below it (Common/worktrees/ID), read from
	// git when the worktree was made, before any guest could change the
	// worktree's .git file.
	Common string `json:"common"`
	Admin  string `json:"admin"`
	Path   string `json:"path"`   // the worktree, under the ticket's workspace
	Branch string `json:"branch"` // the ticket's name, or NAME-2 after a merge
	Base   string `json:"base"`   // the default branch, e.g. "main"
	Remote string `json:"remote"` // "origin", or "" for a repository without one
	// Start is the commit the branch started from: a branch that moved
	// past it and is now part of the default branch was merged.
	Start string `json:"start"`
	// PRBody is the description moat last wrote to the pull request, so
	// that running moat pr again edits only what changed.
	PRBody string `json:"pr_body,omitempty"`
	PRURL  string `json:"pr_url,omitempty"`
	// Pushed is the commit moat pr pushed last: the remote branch may
	// be overwritten (after a rebase) only while it is still there.
	Pushed string `json:"pushed,omitempty"`
}

// Store is where tickets live.
type Store struct {
	State string // records: <state>/tickets/NAME/ticket.json
	Work  string // worktrees: <work>/NAME/REPO, the sandbox's workspace is <work>/NAME
}

// NewStore is the store for moat's state directory stateDir: records in
// stateDir/tickets, worktrees in $MOAT_HOME/tickets when MOAT_HOME is set,
// else in the XDG data directory ($XDG_DATA_HOME/moat/tickets,
// ~/.local/share/moat/tickets, the home being the sudo user's under sudo).
func NewStore(stateDir string) (Store, error) {
	work, err := state.DataDir("tickets")
	return Store{State: filepath.Join(stateDir, "tickets"), Work: work}, err
}

// Workspace is the directory holding a ticket's worktrees: the sandbox's
// workspace, where the agent starts.
func (s Store) Workspace(name string) string { return filepath.Join(s.Work, name) }

func (s Store) dir(name string) string { return filepath.Join(s.State, name) }

// ValidName refuses a ticket name that cannot be both a sandbox's name and
// a branch's: lower-case letters, digits and "-".
func ValidName(name string) error {
	if err := config.ValidName(name); err != nil {
		return fmt.Errorf("ticket name %q: %w", name, err)
	}
	return nil
}

// Load reads the ticket called name.
func (s Store) Load(name string) (*Ticket, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(s.dir(name), "ticket.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w %q; open one with: moat work %s", ErrNoTicket, name, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading ticket %s: %w", name, err)
	}
	var t Ticket
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("reading ticket %s: %w", name, err)
	}
	if t.Schema != Schema {
		return nil, fmt.Errorf("ticket %s has schema %d; this moat reads %d", name, t.Schema, Schema)
	}
	return &t, nil
}

// Exists reports whether a ticket called name has a record.
func (s Store) Exists(name string) bool {
	if ValidName(name) != nil {
		return false
	}
	_, err := os.Stat(filepath.Join(s.dir(name), "ticket.json"))
	return err == nil
}

// Save writes t's record, replacing it by rename so that a reader never
// sees half of it.
func (s Store) Save(t *Ticket) error {
	dir := s.dir(t.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating ticket state: %w", err)
	}
	sort.Slice(t.Worktrees, func(i, j int) bool { return t.Worktrees[i].Repo < t.Worktrees[j].Repo })
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "ticket.json.tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing ticket %s: %w", t.Name, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "ticket.json")); err != nil {
		return fmt.Errorf("writing ticket %s: %w", t.Name, err)
	}
	return nil
}

// List is every ticket, by name.
func (s Store) List() ([]*Ticket, error) {
	ents, err := os.ReadDir(s.State)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing tickets: %w", err)
	}
	var out []*Ticket
	for _, e := range ents {
		if !e.IsDir() || !s.Exists(e.Name()) {
			continue
		}
		t, err := s.Load(e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// Worktree is t's worktree of repo, or nil.
func (t *Ticket) Worktree(repo string) *Worktree {
	for _, w := range t.Worktrees {
		if w.Repo == repo {
			return w
		}
	}
	return nil
}

// ForWorkspace is the ticket whose sandbox workspace is ws, or nil: how a
// sandbox's start finds the git mounts its ticket needs.
func (s Store) ForWorkspace(ws string) (*Ticket, error) {
	if filepath.Dir(filepath.Clean(ws)) != filepath.Clean(s.Work) {
		return nil, nil
	}
	name := filepath.Base(ws)
	if !s.Exists(name) {
		return nil, nil
	}
	return s.Load(name)
}
