package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/ticket"
)

// ticketCommands are ticket mode's commands, registered by root.go.
func ticketCommands() []*cobra.Command {
	return []*cobra.Command{newWorkCmd(), newPRCmd(), newWorktreeCmd()}
}

func (e *env) tickets() (ticket.Store, error) { return ticket.NewStore(e.dirs.State) }

// loadTicket is the ticket called name, or an error with exit code 3.
func (e *env) loadTicket(name string) (ticket.Store, *ticket.Ticket, error) {
	s, err := e.tickets()
	if err != nil {
		return s, nil, err
	}
	if err := ticket.ValidName(name); err != nil {
		return s, nil, withCode(ExitUsage, err)
	}
	t, err := s.Load(name)
	if errors.Is(err, ticket.ErrNoTicket) {
		return s, nil, withCode(ExitNotFound, err)
	}
	return s, t, err
}

func newWorkCmd() *cobra.Command {
	var repos string
	c := &cobra.Command{
		Use:   "work TICKET",
		Short: "Open a ticket: a worktree per repository, all in one sandbox",
		Long: `Open TICKET across the repositories of the workspace ([workspace] repos in the
nearest moat.toml, else in config.toml): for each, a git worktree on a branch
named TICKET from the repository's freshly fetched default branch, then one
sandbox named TICKET with every worktree in its workspace, one directory per
repository, where the agent starts. Git works inside; the main repositories'
hooks and config are read-only to the guest. Run it again to start the
ticket's sandbox, or to add repositories with --repos.

A ticket's name is its branch's and its sandbox's: lower-case letters, digits
and "-". See docs/tickets.md.`,
		Example: `  moat work fix-login
  moat work fix-login --repos api,web`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			var only []string
			if repos != "" {
				only = strings.Split(repos, ",")
			}
			return e.work(c.OutOrStdout(), args[0], only)
		},
	}
	c.Flags().StringVar(&repos, "repos", "", "only these repositories of the workspace, by name (comma-separated)")
	return c
}

func (e *env) work(out io.Writer, name string, only []string) error {
	s, err := e.tickets()
	if err != nil {
		return err
	}
	if err := ticket.ValidName(name); err != nil {
		return withCode(ExitUsage, err)
	}
	var names []string
	var paths map[string]string
	if !s.Exists(name) || len(only) > 0 {
		d, err := cwd()
		if err != nil {
			return err
		}
		r, err := ticket.FindRepos(d, e.dirs.UserConfig())
		if err != nil {
			return withCode(ExitUsage, err)
		}
		if names, err = r.Select(only); err != nil {
			return withCode(ExitUsage, fmt.Errorf("--repos: %w", err))
		}
		paths = r.Paths
	}
	had := map[string]bool{}
	if old, err := s.Load(name); err == nil {
		for _, w := range old.Worktrees {
			had[w.Repo] = true
		}
	}
	t, err := s.Open(name, names, paths, os.Stderr)
	if err != nil {
		return err
	}
	ws := s.Workspace(name)
	dir, rec, err := e.byName(name)
	if err == nil && rec.State == state.StateRunning && len(t.Worktrees) > len(had) {
		// The new worktrees' git data is mounted at the next start.
		fmt.Fprintf(os.Stderr, "moat: restart the sandbox to use the new repositories' git: moat down %s && moat work %s\n", name, name)
	}
	switch {
	case exitCode(err) == ExitNotFound:
		if dir, rec, err = e.create(ws, name); err != nil {
			return err
		}
	case err != nil:
		return err
	case rec.Workspace != ws:
		return codef(ExitUsage, "the name %q is taken by the sandbox of %s; destroy it (moat destroy %s) or choose another ticket name", name, rec.Workspace, name)
	}
	if err := e.start(dir); err != nil {
		return err
	}
	var repos []string
	for _, w := range t.Worktrees {
		repos = append(repos, w.Repo+" ("+w.Branch+")")
	}
	fmt.Fprintf(os.Stderr, "moat: ticket %s: %s in %s; enter it with: moat shell %s\n", name, strings.Join(repos, ", "), ws, rec.Name)
	fmt.Fprintln(out, ws)
	return nil
}

func newPRCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "pr TICKET",
		Short: "Push a ticket's branches and open linked pull requests",
		Long: `For each repository of TICKET with commits past its default branch, push the
branch with the host's git and credentials (never the guest's), then open a
pull request through gh unless one is open already, each description linking
the ticket's other pull requests. Repositories without commits are skipped.
Run it again after more commits: it pushes, and reuses the pull requests.
Which gh calls moat makes: docs/tickets.md.`,
		Example: `  moat pr fix-login
  moat pr fix-login --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			s, t, err := e.loadTicket(args[0])
			if err != nil {
				return err
			}
			res, err := s.PR(t, os.Stderr)
			printPRs(c.OutOrStdout(), res, asJSON)
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON, one object per repository")
	return c
}

// prJSON is one repository in moat pr --json.
type prJSON struct {
	Schema  int    `json:"schema"`
	Repo    string `json:"repo"`
	Skipped string `json:"skipped,omitempty"`
	URL     string `json:"url,omitempty"`
	Number  int    `json:"number,omitempty"`
	Created bool   `json:"created"`
	Edited  bool   `json:"edited"`
}

func printPRs(out io.Writer, res []ticket.PRResult, asJSON bool) {
	if asJSON {
		enc := json.NewEncoder(out)
		for _, r := range res {
			_ = enc.Encode(prJSON{Schema: 1, Repo: r.Repo, Skipped: r.Skipped, URL: r.PR.URL, Number: r.PR.Number, Created: r.Created, Edited: r.Edited})
		}
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REPO\tPULL REQUEST\t")
	for _, r := range res {
		switch {
		case r.Skipped != "":
			fmt.Fprintf(tw, "%s\t-\tskipped: %s\n", r.Repo, r.Skipped)
		case r.Created:
			fmt.Fprintf(tw, "%s\t%s\topened\n", r.Repo, r.PR.URL)
		default:
			fmt.Fprintf(tw, "%s\t%s\tpushed to the open one\n", r.Repo, r.PR.URL)
		}
	}
	tw.Flush()
}

// ticketJSON is a ticket's part of moat status --json, added beside the
// sandbox's fields.
type ticketJSON struct {
	Name  string          `json:"name"`
	Repos []ticket.Status `json:"repos"`
}

// withTicket adds the ticket's repositories to the sandbox's status when
// the sandbox is a ticket's (moat status TICKET).
func (e *env) withTicket(le listEntry) any {
	s, err := e.tickets()
	if err != nil || !s.Exists(le.Name) {
		return le
	}
	t, err := s.Load(le.Name)
	if err != nil {
		return le
	}
	return struct {
		listEntry
		Ticket ticketJSON `json:"ticket"`
	}{le, ticketJSON{Name: t.Name, Repos: s.Status(t, time.Now())}}
}

// printTicketStatus is moat status's table of a ticket's repositories.
func (e *env) printTicketStatus(out io.Writer, name string) {
	s, err := e.tickets()
	if err != nil || !s.Exists(name) {
		return
	}
	t, err := s.Load(name)
	if err != nil {
		fmt.Fprintf(out, "ticket:     %v\n", err)
		return
	}
	fmt.Fprintf(out, "ticket:     %s\n", name)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  REPO\tBRANCH\tAHEAD\tBEHIND\tDIRTY\tPULL REQUEST")
	for _, st := range s.Status(t, time.Now()) {
		pr := "-"
		switch {
		case st.PR != nil:
			pr = st.PR.URL + " " + strings.ToLower(st.PR.State)
		case st.PRError != "":
			pr = "unknown (" + st.PRError + ")"
		}
		if st.Err != "" {
			fmt.Fprintf(tw, "  %s\t%s\t?\t?\t?\t%s (%s)\n", st.Repo, st.Branch, pr, st.Err)
			continue
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\t%s\n", st.Repo, st.Branch, st.Ahead, st.Behind, st.Dirty, pr)
	}
	tw.Flush()
}

// ticketDestroy is moat destroy's check for a ticket's sandbox: nil when
// name is not a ticket's. A ticket with uncommitted changes or unpushed
// commits is refused, listing them, unless force.
func (e *env) ticketDestroy(args []string, force bool) (*ticketRemoval, error) {
	if len(args) == 0 {
		// moat destroy in the ticket's workspace: its sandbox's name.
		if _, rec, err := e.resolve(nil); err == nil {
			args = []string{rec.Name}
		}
	}
	if len(args) != 1 {
		return nil, nil
	}
	s, err := e.tickets()
	if err != nil || !s.Exists(args[0]) {
		return nil, err
	}
	t, err := s.Load(args[0])
	if err != nil {
		return nil, err
	}
	if probs := t.Problems(); len(probs) > 0 && !force {
		var b strings.Builder
		for _, p := range probs {
			b.WriteString("\n  " + p.String())
		}
		return nil, codef(ExitError, "ticket %s has work that destroying it would lose:%s\npush it with: moat pr %s, or destroy anyway with: moat destroy %s --force",
			t.Name, b.String(), t.Name, t.Name)
	}
	return &ticketRemoval{s: s, t: t}, nil
}

// ticketRemoval removes a ticket's worktrees once its sandbox is gone.
type ticketRemoval struct {
	s ticket.Store
	t *ticket.Ticket
}

func (r *ticketRemoval) remove() error {
	if r == nil {
		return nil
	}
	if err := r.s.Remove(r.t, os.Stderr); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "moat: removed ticket %s's worktrees; its branches stay in the repositories\n", r.t.Name)
	return nil
}
