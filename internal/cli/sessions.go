package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"moat.dev/moat/internal/agentstate"
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/state"
)

// removeAgentState merges a destroyed sandbox's agent state into its
// project and removes its directory.
func (e *env) removeAgentState(rec *state.Record) {
	s, err := agentstate.NewStore(e.dirs.State)
	if err != nil {
		return
	}
	s.Note = func(m string) { fmt.Fprintln(os.Stderr, "moat: agent state:", m) }
	if err := s.Remove(rec.Workspace, rec.Name); err != nil {
		fmt.Fprintf(os.Stderr, "moat: keeping %s's agent conversations: %v (its directory stays: %s)\n",
			rec.Name, err, s.SandboxDir(agentstate.ProjectID(rec.Workspace), rec.Name))
	}
}

func newSessionsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "sessions",
		Short: "List, show and remove the agents' kept conversations",
		Long: `Claude Code's and Codex's conversations are kept on the host per project (the
workspace directory), so a new sandbox of the project resumes them (claude
--resume, codex resume). PROJECT is a workspace directory, a project's name
as listed, or a sandbox's name; without it, the current directory's project,
else every project. See docs/sessions.md.`,
	}
	c.AddCommand(newSessionsListCmd(), newSessionsShowCmd(), newSessionsRmCmd())
	return c
}

// sessionJSON is a conversation in --json output. Fields are only added.
type sessionJSON struct {
	Schema    int       `json:"schema"`
	Project   string    `json:"project"`
	Workspace string    `json:"workspace,omitempty"`
	Agent     string    `json:"agent"`
	ID        string    `json:"id"`
	Path      string    `json:"path"`
	Size      int64     `json:"size"`
	Time      time.Time `json:"time"`
	Sandbox   string    `json:"sandbox"`
	// show only
	Lines   int       `json:"lines,omitempty"`
	First   time.Time `json:"first,omitzero"`
	Last    time.Time `json:"last,omitzero"`
	Cwd     string    `json:"cwd,omitempty"`
	Version string    `json:"version,omitempty"`
}

func (e *env) sessionStore() (agentstate.Store, error) {
	s, err := agentstate.NewStore(e.dirs.State)
	s.Note = func(m string) { fmt.Fprintln(os.Stderr, "moat: agent state:", m) }
	return s, err
}

// sessionProjects resolves PROJECT (see the command's help) to projects.
func (e *env) sessionProjects(s agentstate.Store, args []string) ([]agentstate.Project, error) {
	all, err := s.Projects()
	if err != nil {
		return nil, err
	}
	byID := func(id string) []agentstate.Project {
		for _, p := range all {
			if p.ID == id {
				return []agentstate.Project{p}
			}
		}
		return nil
	}
	if len(args) == 0 {
		d, err := cwd()
		if err != nil {
			return nil, err
		}
		if p := byID(agentstate.ProjectID(findWorkspace(d))); p != nil {
			return p, nil
		}
		return all, nil
	}
	arg := args[0]
	if st, err := os.Stat(arg); err == nil && st.IsDir() {
		abs, err := filepath.Abs(arg)
		if err != nil {
			return nil, err
		}
		if r, err := filepath.EvalSymlinks(abs); err == nil {
			abs = r
		}
		ws := findWorkspace(abs)
		if p := byID(agentstate.ProjectID(ws)); p != nil {
			return p, nil
		}
		return nil, codef(ExitNotFound, "no agent conversations kept for %s; they are kept once an agent ran in a sandbox of it", ws)
	}
	if p := byID(arg); p != nil {
		return p, nil
	}
	if config.ValidName(arg) == nil {
		if r, err := state.Load(e.dirs.Sandbox(arg)); err == nil {
			if p := byID(agentstate.ProjectID(r.Workspace)); p != nil {
				return p, nil
			}
		}
	}
	var named []agentstate.Project
	for _, p := range all {
		if i := strings.LastIndex(p.ID, "-"); i > 0 && p.ID[:i] == arg {
			named = append(named, p)
		}
	}
	if len(named) > 0 {
		return named, nil
	}
	return nil, codef(ExitNotFound, "no project %q with kept conversations; see them with: moat sessions list", arg)
}

func toJSON(c agentstate.Conversation, ws string) sessionJSON {
	return sessionJSON{Schema: 1, Project: c.Project, Workspace: ws, Agent: c.Agent, ID: c.ID, Path: c.Path,
		Size: c.Size, Time: c.Time, Sandbox: c.Sandbox}
}

func newSessionsListCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list [PROJECT]",
		Short: "List the kept conversations, newest first",
		Long: `List the conversations kept for PROJECT (default: the current directory's,
else every project), newest first: the project, the agent, the conversation's
id (Claude Code's session id, Codex's rollout name), its size in bytes, when
it last changed and which sandbox changed it. Running sandboxes' conversations
are merged in first.`,
		Example: `  moat sessions list
  moat sessions list ~/src/api --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			s, err := e.sessionStore()
			if err != nil {
				return err
			}
			ps, err := e.sessionProjects(s, args)
			if err != nil {
				return err
			}
			var rows []sessionJSON
			for _, p := range ps {
				cs, err := s.Conversations(p.ID)
				if err != nil {
					return err
				}
				for _, c := range cs {
					rows = append(rows, toJSON(c, p.Workspace))
				}
			}
			return printSessions(c.OutOrStdout(), rows, asJSON)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON, one object per conversation")
	return c
}

func printSessions(w io.Writer, rows []sessionJSON, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	if len(rows) == 0 {
		fmt.Fprintln(os.Stderr, "moat: no kept conversations")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECT\tAGENT\tID\tSIZE\tTIME\tSANDBOX")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", r.Project, r.Agent, r.ID, r.Size, r.Time.Local().Format("2006-01-02 15:04"), r.Sandbox)
	}
	return tw.Flush()
}

// findSession is the conversation id in PROJECT (args), or an error
// with exit code 3.
func (e *env) findSession(s agentstate.Store, id string, args []string) (agentstate.Conversation, string, error) {
	ps, err := e.sessionProjects(s, args)
	if err != nil {
		return agentstate.Conversation{}, "", err
	}
	var errs []error
	for _, p := range ps {
		c, err := s.Find(p.ID, id)
		if err == nil {
			return c, p.Workspace, nil
		}
		if !errors.Is(err, agentstate.ErrNoConversation) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return agentstate.Conversation{}, "", withCode(ExitUsage, errors.Join(errs...))
	}
	return agentstate.Conversation{}, "", codef(ExitNotFound, "no kept conversation %q; see them with: moat sessions list", id)
}

func newSessionsShowCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "show ID [PROJECT]",
		Short: "Show a kept conversation's details",
		Long: `Show what a kept conversation's transcript says about itself: its lines, the
first and last timestamps, the directory it ran in, the agent's version, and
the sandbox that last changed it. ID may be a prefix of the id.`,
		Example: `  moat sessions show 3f1c2a`,
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			s, err := e.sessionStore()
			if err != nil {
				return err
			}
			conv, ws, err := e.findSession(s, args[0], args[1:])
			if err != nil {
				return err
			}
			d, err := s.Show(conv)
			if err != nil {
				return err
			}
			j := toJSON(conv, ws)
			j.Lines, j.First, j.Last, j.Cwd, j.Version = d.Lines, d.First, d.Last, d.Cwd, d.Version
			if asJSON {
				return json.NewEncoder(c.OutOrStdout()).Encode(j)
			}
			tw := tabwriter.NewWriter(c.OutOrStdout(), 0, 0, 2, ' ', 0)
			row := func(k, v string) {
				if v != "" {
					fmt.Fprintf(tw, "%s:\t%s\n", k, v)
				}
			}
			when := func(t time.Time) string {
				if t.IsZero() {
					return ""
				}
				return t.Local().Format(time.RFC3339)
			}
			row("id", j.ID)
			row("agent", j.Agent)
			row("project", j.Project)
			row("workspace", j.Workspace)
			row("file", j.Path)
			row("size", fmt.Sprint(j.Size))
			row("lines", fmt.Sprint(j.Lines))
			row("first", when(j.First))
			row("last", when(j.Last))
			row("cwd", j.Cwd)
			row("version", j.Version)
			row("sandbox", j.Sandbox)
			row("kept", when(j.Time))
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newSessionsRmCmd() *cobra.Command {
	var yes bool
	c := &cobra.Command{
		Use:   "rm ID [PROJECT]",
		Short: "Remove a kept conversation",
		Long: `Remove a conversation from its project's kept state. Stopped sandboxes of the
project lose it at their next start; a running sandbox that still writes to
it brings it back when it stops. Its history stays in the project's
repository (git objects) until moat compacts it.`,
		Example: `  moat sessions rm 3f1c2a --yes`,
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			s, err := e.sessionStore()
			if err != nil {
				return err
			}
			conv, _, err := e.findSession(s, args[0], args[1:])
			if err != nil {
				return err
			}
			if !yes {
				if !term.IsTerminal(int(os.Stdin.Fd())) {
					return codef(ExitUsage, "rm deletes the conversation %s; confirm with: moat sessions rm %s --yes", conv.ID, conv.ID)
				}
				fmt.Fprintf(os.Stderr, "Remove the %s conversation %s (%d bytes)? [y/N] ", conv.Agent, conv.ID, conv.Size)
				var answer string
				fmt.Scanln(&answer)
				if a := strings.ToLower(answer); a != "y" && a != "yes" {
					return errors.New("not removed")
				}
			}
			if err := s.Delete(conv); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "moat: removed %s\n", conv.ID)
			return nil
		},
	}
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask")
	return c
}
