package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/state"
)

func newNetworkCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "network",
		Short: "See and change what a sandbox may reach",
		Long: `Every connection a sandbox makes is decided by the gate outside it. Rules come in
layers, lowest first: built-in and named policies (moat policy show default), your
config.toml, the project's moat.toml, and runtime rules added here. The highest layer
with an opinion wins; a block wins a tie.

  moat network allow api pypi.org files.pythonhosted.org
  moat network block api telemetry.example.com
  moat network list api
  moat network denials
  moat network audit api -f`,
	}
	for _, op := range []string{"allow", "block", "remove"} {
		c.AddCommand(newRuleCmd(op))
	}
	c.AddCommand(newNetworkListCmd(), newDenialsCmd(), newAuditCmd(), newSuggestCmd(), newWatchCmd())
	return c
}

var ruleHelp = map[string]string{
	"allow":  "Allow destinations, live and kept with the sandbox",
	"block":  "Block destinations, live and kept with the sandbox",
	"remove": "Remove runtime rules added with allow or block",
}

func newRuleCmd(op string) *cobra.Command {
	return &cobra.Command{
		Use:   op + " NAME ENTRY...",
		Short: ruleHelp[op],
		Long: ruleHelp[op] + `.

An entry is a host name (example.com: exactly that name), a wildcard (*.example.com:
any subdomain, not example.com itself), either with a port (example.com:22), an IP
address or a CIDR (10.20.0.0/16). Private, loopback and link-local addresses open only
through an address rule. A request rule puts methods and a path glob on a name
('GET,HEAD github.com/*', 'read pypi.org'; quote it as one argument): the gate then
terminates TLS for that host and decides each request. A running sandbox applies the
change at once.`,
		Example: fmt.Sprintf("  moat network %s api registry.example.com *.example.org:443\n  moat network %s api 'POST api.example.com/v1/*'", op, op),
		Args:    cobra.MinimumNArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			_, dir, _, err := sandboxNamed(args[0])
			if err != nil {
				return err
			}
			entries := args[1:]
			for _, en := range entries {
				if _, err := policy.ParseEntry(en); err != nil {
					return codef(ExitUsage, "%q: %v", en, err)
				}
			}
			err = sandboxAt(dir).change(10*time.Second, func(ctx context.Context, c *control.Client) error {
				_, err := c.ChangeRules(ctx, control.RuleChange{Op: op, Entries: entries})
				return err
			}, func(r *state.Record) error {
				return withCode(ExitUsage, daemon.ApplyRuleChange(r, op, entries))
			})
			if err != nil {
				return err
			}
			verb := map[string]string{"allow": "allowed", "block": "blocked", "remove": "removed"}[op]
			fmt.Fprintf(os.Stderr, "moat: %s %s for %s\n", verb, strings.Join(entries, " "), args[0])
			return nil
		},
	}
}

// rulesOf returns the rules in force for a sandbox: the daemon's when it
// runs, else compiled from its record (discovering from the host's files
// only; the running daemon also asks the host's tools and reads the image).
func (e *env) rulesOf(dir string, rec *state.Record) ([]control.Rule, error) {
	if r, ok := ask(sandboxAt(dir), 10*time.Second, (*control.Client).Rules); ok {
		return r.Rules, nil
	}
	cfg, err := rec.Snapshot()
	if err != nil {
		return nil, err
	}
	// The lists as cached; only the running daemon fetches.
	loaded := daemon.LoadLists(context.Background(), e.listCache(), cfg.Network, false)
	rules, err := daemon.Rules(daemon.RuleSources{Network: cfg.Network, UserConfig: e.dirs.UserConfig(), Presets: rec.Presets,
		Runtime: rec.Rules, Discovered: policy.Discover("/", nil, func(string) string { return "" }), Loaded: loaded})
	if err != nil {
		return nil, err
	}
	return control.RulesOf(rules), nil
}

func newNetworkListCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list NAME",
		Short: "List every network rule of a sandbox with its layer",
		Long: `List every rule in force for a sandbox, lowest layer first: the named
policies, the presets, your config.toml, the project's moat.toml, the rules
added at run time. The highest layer with an opinion decides a destination.`,
		Example: `  moat network list api
  moat network list api --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, dir, rec, err := sandboxNamed(args[0])
			if err != nil {
				return err
			}
			rules, err := e.rulesOf(dir, rec)
			if err != nil {
				return err
			}
			out := c.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(control.Rules{Schema: control.Schema, Rules: rules})
			}
			return printRules(out, rules)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func printRules(out io.Writer, rules []control.Rule) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tENTRY\tLAYER\tSOURCE")
	for _, r := range rules {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Action, r.Entry, r.Layer, r.Source)
	}
	return tw.Flush()
}

func newDenialsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "denials [NAME]",
		Short: "Show what the gate denied, per destination (all sandboxes without NAME)",
		Long: `Show, per destination, what the gate refused a sandbox (every sandbox
without NAME): how often, when last, and why, as the audit log says it.`,
		Example: `  moat network denials
  moat network denials api --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			var recs []*state.Record
			if len(args) == 1 {
				_, r, err := e.byName(args[0])
				if err != nil {
					return err
				}
				recs = []*state.Record{r}
			} else if recs, err = state.List(e.dirs); err != nil {
				return err
			}
			type result struct {
				Sandbox string `json:"sandbox"`
				control.Denials
			}
			var all []result
			for _, r := range recs {
				d, err := e.denials(e.dirs.Sandbox(r.Name), r)
				if err != nil {
					return err
				}
				all = append(all, result{r.Name, *d})
			}
			out := c.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{"schema": control.Schema, "sandboxes": all})
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SANDBOX\tDESTINATION\tCOUNT\tLAST\tWHY")
			for _, s := range all {
				for _, en := range s.Entries {
					why := audit.Why(en.Layer, en.Rule, en.Reason)
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", s.Sandbox, en.Dest, en.Count, en.Last.Local().Format("15:04:05"), why)
				}
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// denials asks the running daemon for its ledger; for a stopped sandbox it
// rebuilds one from the audit log.
func (e *env) denials(dir string, rec *state.Record) (*control.Denials, error) {
	l := audit.NewLedger(1024)
	add := func(r audit.Record) bool {
		// As the gate's own ledger: no DNS, no MCP calls (their
		// destination is allowed; the rule that refused the call is).
		if r.Verdict == audit.Deny && r.Proto != "dns" && r.Proto != "mcp" {
			l.Add(r)
		}
		return true
	}
	if rec.Runtime == runtimeKube {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := kubeAudit(ctx, dir, false, func(r audit.Record) { add(r) }); err != nil {
			return nil, err
		}
		return &control.Denials{Schema: control.Schema, Total: l.Total(), Entries: l.Entries()}, nil
	}
	if d, ok := ask(sandboxAt(dir), 5*time.Second, (*control.Client).Denials); ok {
		return d, nil
	}
	err := audit.ReadLogs(auditLogs(dir, rec), add)
	// Wrapped: os.IsNotExist would not see it (a sandbox never started).
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading the audit log: %w", err)
	}
	return &control.Denials{Schema: control.Schema, Total: l.Total(), Entries: l.Entries()}, nil
}

func newAuditCmd() *cobra.Command {
	var asJSON, follow bool
	c := &cobra.Command{
		Use:   "audit NAME [-f]",
		Short: "Print the gate's audit log: one line per decision",
		Long: `Print the gate's audit log: one line per decision, oldest first, across
its rotated files. A connection the gate carried has two lines: its
decision when it was made, and "end" with its bytes and duration. A
destination refused again and again has its first refusals one by one,
then one line per 10 s saying how many more there were. "dropped" lines
say what was lost (a full disk) or deleted (the [audit] size bound and
retention).`,
		Example: `  moat network audit api
  moat network audit api -f
  moat network audit api --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			_, dir, rec, err := anySandboxNamed(args[0]) // a claim on Kubernetes too (kube.go)
			if err != nil {
				return err
			}
			print := auditPrinter(c.OutOrStdout(), asJSON)
			if rec.Runtime == runtimeKube {
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
				defer stop()
				return kubeAudit(ctx, dir, follow, print) // the gate's records through the API (kube.go)
			}
			paths := auditLogs(dir, rec) // with a Docker sandbox's forwarder's (dockeraudit.go)
			if !follow {
				err := audit.ReadLogs(paths, func(r audit.Record) bool { print(r); return true })
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			err = audit.FollowLogs(ctx, paths, print)
			if ctx.Err() != nil {
				return nil
			}
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print each record as JSON (schema 1)")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new decisions until Ctrl-C")
	return c
}

// auditPrinter prints audit records as moat network audit shows them: a
// line each, or with asJSON the record as JSON.
func auditPrinter(out io.Writer, asJSON bool) func(audit.Record) {
	enc := json.NewEncoder(out)
	return func(r audit.Record) {
		if asJSON {
			enc.Encode(r)
			return
		}
		name := r.Name
		if name == "" {
			name = "-"
		}
		if r.Proto == "mcp" {
			name = strings.TrimSpace(fmt.Sprintf("%s %s %s %s%s", name, r.MCPServer, r.MCPMethod, r.MCPTool, r.MCPURI))
		}
		why := audit.Why(r.Layer, r.Rule, r.Reason)
		verdict := r.Verdict
		switch {
		case r.Count > 0:
			// An aggregate: the first of these has a line of its own.
			why = fmt.Sprintf("%s (%d more until %s)", why, r.Count, r.Last.Local().Format("15:04:05"))
		case r.Phase == audit.PhaseEnd:
			verdict = "end"
			why = fmt.Sprintf("%d B up, %d B down in %d ms; %s", r.BytesUp, r.BytesDown, r.DurationMS, why)
		}
		fmt.Fprintf(out, "%s  %-5s %-4s %-21s %s  %s\n", r.Time.Local().Format("15:04:05.000"), verdict, r.Proto, r.Dst, name, why)
	}
}

// hostRun runs one of the host's tools for discovery, bounded in time.
func hostRun(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	return string(out), err
}
