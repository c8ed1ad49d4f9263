package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/lists"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/state"
)

func newPolicyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "policy",
		Short: "List, show, refresh and remove named network policies",
		Long: `A named policy is a set of rules a config turns on with [network] use = [...]:
the built-in default and none, and [policies.NAME] tables in your config.toml or the
project's moat.toml, with inline allow/block entries and/or a list to fetch:

  [policies.ads]
  source = "https://example.com/hosts.txt"   # or a file path; hosts, domain or ||name^ lines
  refresh = "24h"

  [network]
  use = ["default", "ads"]

Fetched lists are cached and refreshed in the background by running sandboxes.`,
	}
	c.AddCommand(newPolicyListCmd(), newPolicyShowCmd(), newPolicyRefreshCmd(), newPolicyRmCmd())
	return c
}

// policyConfig is the configuration the current directory's sandbox
// would be created with: the user's file and the nearest moat.toml.
func (e *env) policyConfig() (config.Config, error) {
	dir, err := cwd()
	if err != nil {
		return config.Config{}, err
	}
	cfg, err := config.Load(e.dirs.UserConfig(), filepath.Join(findWorkspace(dir), "moat.toml"))
	if err != nil {
		return config.Config{}, withCode(ExitUsage, err)
	}
	return cfg, nil
}

func (e *env) listCache() *lists.Cache { return &lists.Cache{Dir: lists.CacheDir(e.dirs)} }

// policyInfo is one policy in `moat policy list --json`.
type policyInfo struct {
	Name     string    `json:"name"`
	Rules    int       `json:"rules"`
	Source   string    `json:"source,omitempty"`
	Refresh  string    `json:"refresh,omitempty"`
	File     string    `json:"file,omitempty"`
	Fetched  time.Time `json:"fetched,omitzero"`
	Warnings []string  `json:"warnings,omitempty"`
}

// load reads every named policy of cfg without fetching.
func (e *env) policyInfos(cfg config.Config) ([]policyInfo, map[string]*lists.Loaded) {
	n := cfg.Network
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range n.Policies {
			if !yield(k) {
				return
			}
		}
	})
	n.Use = names // load every defined policy, used or not
	loaded := daemon.LoadLists(context.Background(), e.listCache(), n, false)
	var out []policyInfo
	for _, name := range names {
		p := n.Policies[name]
		pi := policyInfo{Name: name, Rules: len(p.Allow) + len(p.Block), Source: lists.Redact(p.Source), File: p.File}
		if p.Source != "" {
			pi.Refresh = shortDuration(p.Refresh)
		}
		if l := loaded[name]; l != nil {
			pi.Rules += l.Parsed.Entries()
			pi.Fetched, pi.Warnings = l.Fetched, l.Warnings
		}
		out = append(out, pi)
	}
	return out, loaded
}

func newPolicyListCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List the named policies a config can use, with their lists' state",
		Long: `List the named policies a configuration can use (default and none, built in,
and those your files define), with the number of rules, their list's source,
when it was fetched and how many of its lines could not be used.`,
		Example: `  moat policy list
  moat policy list --json`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			cfg, err := e.policyConfig()
			if err != nil {
				return err
			}
			infos, _ := e.policyInfos(cfg)
			out := c.OutOrStdout()
			if asJSON {
				builtin := []policyInfo{{Name: "default", Rules: len(policy.Builtin())}, {Name: "none"}}
				return json.NewEncoder(out).Encode(map[string]any{"schema": control.Schema, "policies": append(builtin, infos...)})
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tRULES\tSOURCE\tFETCHED\tWARNINGS")
			fmt.Fprintf(tw, "default\t%d+\tbuilt in: AI model APIs, code hosts, package registries, this host's repositories\t-\t-\n", len(policy.Builtin()))
			fmt.Fprintf(tw, "none\t0\tbuilt in: nothing, only your own allow rules\t-\t-\n")
			for _, p := range infos {
				src, fetched := "inline ("+p.File+")", "-"
				if p.Source != "" {
					src = p.Source + " every " + p.Refresh
				}
				if !p.Fetched.IsZero() {
					fetched = p.Fetched.Local().Format("2006-01-02 15:04")
				} else if lists.IsURL(p.Source) {
					fetched = "never"
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\n", p.Name, p.Rules, src, fetched, len(p.Warnings))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, p := range infos {
				for _, w := range p.Warnings {
					fmt.Fprintf(out, "warning: %s\n", w)
				}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newPolicyShowCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "show NAME",
		Short: "Show every entry of a named policy, and the lines its list could not use",
		Long: `Show every entry of a named policy with where it came from, and the lines of
its list that were rejected or could not be used.`,
		Example: `  moat policy show default
  moat policy show ads --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			var rules []policy.Rule
			var l *lists.Loaded
			switch args[0] {
			case "default":
				rules = append(policy.Builtin(), policy.Discover("/", hostRun, os.Getenv)...)
			case "none":
			default:
				e, err := newEnv()
				if err != nil {
					return err
				}
				cfg, err := e.policyConfig()
				if err != nil {
					return err
				}
				n := cfg.Network
				if _, ok := n.Policies[args[0]]; !ok {
					return codef(ExitNotFound, "no policy named %q here; define it with [policies.%s] in %s or moat.toml (see: moat policy list)", args[0], args[0], e.dirs.UserConfig())
				}
				n.Use = []string{args[0]}
				loaded := daemon.LoadLists(context.Background(), e.listCache(), n, false)
				l = loaded[args[0]]
				if rules, err = daemon.Rules(daemon.RuleSources{Network: config.Network{Use: n.Use, Policies: n.Policies}, Loaded: loaded}); err != nil {
					return withCode(ExitUsage, err)
				}
			}
			out := c.OutOrStdout()
			if asJSON {
				v := struct {
					control.Rules
					Rejected    []lists.Line `json:"rejected,omitempty"`
					Unsupported []lists.Line `json:"unsupported,omitempty"`
					Warnings    []string     `json:"warnings,omitempty"`
				}{Rules: control.Rules{Schema: control.Schema, Rules: control.RulesOf(rules)}}
				if l != nil {
					v.Rejected, v.Unsupported, v.Warnings = l.Parsed.Rejected, l.Parsed.Unsupported, l.Warnings
				}
				return json.NewEncoder(out).Encode(v)
			}
			if err := printRules(out, control.RulesOf(rules)); err != nil {
				return err
			}
			if l != nil {
				printLines(out, "rejected", l.Parsed.RejectedCount, l.Parsed.Rejected)
				printLines(out, "unsupported", l.Parsed.UnsupportedCount, l.Parsed.Unsupported)
				for _, w := range l.Warnings {
					fmt.Fprintf(out, "warning: %s\n", w)
				}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func printLines(out io.Writer, what string, n int, lines []lists.Line) {
	if n == 0 {
		return
	}
	fmt.Fprintf(out, "\n%d %s lines:\n", n, what)
	for _, l := range lines {
		fmt.Fprintf(out, "  %s\n", l)
	}
	if n > len(lines) {
		fmt.Fprintf(out, "  ... and %d more\n", n-len(lines))
	}
}

func newPolicyRefreshCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "refresh [NAME]",
		Short: "Fetch named policies' lists now, and apply them in running sandboxes",
		Long: `Fetch the list of NAME (or of every named policy with a URL source) now, with a
conditional request when a copy is cached, then tell every running sandbox to read
its lists again. Sandboxes also refresh on their own at each policy's interval.`,
		Example: `  moat policy refresh
  moat policy refresh ads`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			cfg, err := e.policyConfig()
			if err != nil {
				return err
			}
			var names []string
			for name, p := range cfg.Network.Policies {
				if len(args) == 0 || args[0] == name {
					if lists.IsURL(p.Source) {
						names = append(names, name)
					} else if len(args) == 1 {
						return codef(ExitUsage, "policy %q has no URL source to fetch (a file source is read as it is)", name)
					}
				}
			}
			if len(args) == 1 && len(names) == 0 {
				return codef(ExitNotFound, "no policy named %q here; see: moat policy list", args[0])
			}
			slices.Sort(names)
			cache := e.listCache()
			var failed []string
			for _, name := range names {
				src := cfg.Network.Policies[name].Source
				ctx, cancel := context.WithTimeout(context.Background(), lists.FetchTimeout)
				changed, err := cache.Refresh(ctx, src)
				cancel()
				switch {
				case err != nil:
					fmt.Fprintf(os.Stderr, "moat: %s: %v\n", name, err)
					failed = append(failed, name)
				case changed:
					fmt.Fprintf(os.Stderr, "moat: %s: fetched %s\n", name, lists.Redact(src))
				default:
					fmt.Fprintf(os.Stderr, "moat: %s: not modified since the cached copy\n", name)
				}
			}
			e.reloadRunning()
			if len(failed) > 0 {
				return codef(ExitError, "could not fetch %s; running sandboxes keep their last good copy; check the source, then try again", strings.Join(failed, ", "))
			}
			return nil
		},
	}
}

// reloadRunning asks every running sandbox to read its lists again.
func (e *env) reloadRunning() {
	recs, err := state.List(e.dirs)
	if err != nil {
		return
	}
	for _, r := range recs {
		s := sandboxAt(e.dirs.Sandbox(r.Name))
		if !s.alive() {
			continue
		}
		err := s.call(30*time.Second, func(ctx context.Context, c *control.Client) error {
			_, err := c.ReloadPolicies(ctx)
			return err
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "moat: %s did not reload its lists (%v); it will at its next refresh\n", r.Name, err)
		}
	}
}

func newPolicyRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Delete the cached copy of a named policy's list",
		Long: `Delete the cached copy of NAME's list. Running sandboxes keep the copy they
loaded until their next refresh; a sandbox started before the list is fetched again
starts with the policy empty, and says so in moat status.`,
		Example: `  moat policy rm ads`,
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			cfg, err := e.policyConfig()
			if err != nil {
				return err
			}
			p, ok := cfg.Network.Policies[args[0]]
			if !ok {
				return codef(ExitNotFound, "no policy named %q here; see: moat policy list", args[0])
			}
			if !lists.IsURL(p.Source) {
				return codef(ExitUsage, "policy %q has no cached list (only URL sources are cached)", args[0])
			}
			if err := e.listCache().Remove(p.Source); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "moat: removed the cached list of %s\n", args[0])
			return nil
		},
	}
}

// shortDuration writes d as a person would: 24h, 1h30m, 90s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
