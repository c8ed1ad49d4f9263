package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/ticket"
)

func newWorktreeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "worktree",
		Short: "Add, rebase and list the worktrees of tickets",
		Long:  `A ticket's worktrees: one per repository, under moat's work directory (see moat work).`,
	}
	c.AddCommand(newWorktreeAddCmd(), newWorktreeRebaseCmd(), newWorktreeListCmd())
	return c
}

func newWorktreeAddCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "add TICKET REPO",
		Short: "Give a ticket a worktree of one more repository, or a new branch after a merge",
		Long: `Give TICKET a worktree of REPO (a repository of the workspace) on branch TICKET,
from the freshly fetched default branch. When TICKET's branch was merged
upstream (its commits are in the default branch, or gh lists its pull request
as merged), the branch is TICKET-2 (then -3, …), and a merged worktree of REPO
the ticket already has is replaced (refused while it has uncommitted changes).
A running sandbox mounts the new worktree's git data at its next start.`,
		Example: `  moat worktree add fix-login docs`,
		Args:    cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			s, t, err := e.loadTicket(args[0])
			if err != nil {
				return err
			}
			repo := args[1]
			var main string
			if w := t.Worktree(repo); w != nil {
				main = w.Main
			} else {
				d, err := cwd()
				if err != nil {
					return err
				}
				r, err := ticket.FindRepos(d, e.dirs.UserConfig())
				if err != nil {
					return withCode(ExitUsage, err)
				}
				if _, err := r.Select([]string{repo}); err != nil {
					return withCode(ExitUsage, err)
				}
				main = r.Paths[repo]
			}
			branch, err := s.Add(t, repo, main, os.Stderr)
			if err != nil {
				return err
			}
			w := t.Worktree(repo)
			fmt.Fprintln(c.OutOrStdout(), w.Path)
			fmt.Fprintf(os.Stderr, "moat: %s is on branch %s in %s; restart the sandbox to use it: moat down %s && moat work %s\n",
				repo, branch, w.Path, t.Name, t.Name)
			return nil
		},
	}
}

func newWorktreeRebaseCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rebase TICKET [REPO]",
		Short: "Rebase a ticket's branches onto the freshly fetched default branch",
		Long: `Fetch each repository of TICKET (or only REPO) with the host's git and rebase
the ticket's branch onto its default branch. A worktree with uncommitted
changes is refused; a conflict is undone and reported, to be resolved in the
sandbox with git rebase.`,
		Example: `  moat worktree rebase fix-login
  moat worktree rebase fix-login api`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			s, t, err := e.loadTicket(args[0])
			if err != nil {
				return err
			}
			repo := ""
			if len(args) == 2 {
				repo = args[1]
				if t.Worktree(repo) == nil {
					return codef(ExitNotFound, "ticket %s has no repository %q; see: moat worktree list %s", t.Name, repo, t.Name)
				}
			}
			return s.Rebase(t, repo, os.Stderr)
		},
	}
}

// worktreeJSON is one worktree in moat worktree list --json.
type worktreeJSON struct {
	Schema int    `json:"schema"`
	Ticket string `json:"ticket"`
	Repo   string `json:"repo"`
	Branch string `json:"branch"`
	Base   string `json:"base"`
	Path   string `json:"path"`
	Main   string `json:"main"`
}

func newWorktreeListCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list [TICKET]",
		Short: "List the tickets' worktrees",
		Long:  `List every ticket's worktrees (or TICKET's): repository, branch, where it is and its main repository.`,
		Example: `  moat worktree list
  moat worktree list fix-login --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			var ts []*ticket.Ticket
			if len(args) == 1 {
				_, t, err := e.loadTicket(args[0])
				if err != nil {
					return err
				}
				ts = []*ticket.Ticket{t}
			} else {
				s, err := e.tickets()
				if err != nil {
					return err
				}
				if ts, err = s.List(); err != nil {
					return err
				}
			}
			out := c.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				for _, t := range ts {
					for _, w := range t.Worktrees {
						_ = enc.Encode(worktreeJSON{Schema: 1, Ticket: t.Name, Repo: w.Repo, Branch: w.Branch, Base: w.Base, Path: w.Path, Main: w.Main})
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "TICKET\tREPO\tBRANCH\tPATH\tMAIN")
			for _, t := range ts {
				for _, w := range t.Worktrees {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, w.Repo, w.Branch, w.Path, w.Main)
				}
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON, one object per worktree")
	return c
}
