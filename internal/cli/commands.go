package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/kubert"
	"moat.dev/moat/internal/preset"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/sentinel"
	"moat.dev/moat/internal/session"
	"moat.dev/moat/internal/state"
)

// attach runs argv (nil: a shell) in the sandbox at dir, starting it first,
// in workdir ("": the workspace).
func (e *env) attach(dir string, argv []string, workdir string) error {
	return e.attachEnv(dir, argv, workdir, nil)
}

// attachEnv is attach with extra session environment (secrets'
// placeholders, a preset's variables).
func (e *env) attachEnv(dir string, argv []string, workdir string, sessEnv map[string]string) error {
	rec, err := state.Load(dir)
	if err != nil {
		return err
	}
	if rec.Runtime == runtimeKube {
		return e.kubeAttach(dir, rec, argv) // kube.go: the pod's own directory and environment
	}
	sessEnv, err = withConfigEnv(rec, sessEnv)
	if err != nil {
		return err
	}
	if err := usableWorkspace(rec); err != nil {
		return withCode(ExitRun, err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), unix.SIGPIPE)
	defer cancel()
	c, err := e.connect(ctx, dir)
	if err != nil {
		return withCode(ExitRun, err)
	}
	defer c.Close()
	if rec.Runtime == runtimeDocker {
		sessEnv = withDockerPlaceholders(dir, sessEnv)
	}
	tty := sessionTTY(argv)
	// The ledger's times are the daemon's, on this host's clock.
	start := time.Now()
	code, err := session.Run(ctx, c, session.Options{
		Argv: argv, TTY: tty, Dir: workdir, Env: sessEnv,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
	})
	if err != nil {
		return withCode(ExitRun, sessionEndedBySuspend(dir, err))
	}
	if code != 0 {
		printRefusals(os.Stderr, dir, start)
		return commandExit(code)
	}
	return nil
}

// sessionTTY reports whether a session of argv (nil: a shell) gets a
// terminal: when moat's stdin is one and, for a command, its stdout too,
// so that a command's output piped on the host stays plain.
func sessionTTY(argv []string) bool {
	return term.IsTerminal(int(os.Stdin.Fd())) && (len(argv) == 0 || term.IsTerminal(int(os.Stdout.Fd())))
}

// sessionDir is where a session started from the host's cwd begins: the
// same path when it is inside the workspace, else the workspace. The
// workspace itself is "": the agent starts sessions there by default, and
// naming it would cost a request and its round trip to the guest.
func sessionDir(ws string) string {
	d, err := cwd()
	if err != nil || d == ws || !strings.HasPrefix(d, ws+"/") {
		return ""
	}
	return d
}

func newRunCmd() *cobra.Command {
	var name, runtime string
	var trust bool
	var kf kubeFlags
	c := &cobra.Command{
		Use:   "run [--name N] [PRESET] [-- command or arguments...]",
		Short: "Run a command or a coding agent in this directory's sandbox, creating and starting it if needed",
		Long: `Run a command in the sandbox of the current directory (the nearest directory
with a moat.toml, else the current one). The sandbox is created and started if
needed and keeps running afterwards. With no command: an interactive shell.
moat exits with the command's exit code.

A preset runs a coding agent with its permission prompts off (the sandbox is
the boundary), allows the hosts it needs (shown as the "preset" layer in
moat network list) and turns the credentials it reads into secrets: the agent
sees a placeholder, the gate sends the real value to the agent's API only.
Arguments after -- go to the agent. Presets: ` + strings.Join(preset.Names(), ", ") + `.`,
		Example: `  moat run -- make test
  moat run --name api -- go build ./...
  moat run claude
  moat run claude -- --version
  moat run`,
		RunE: func(c *cobra.Command, args []string) error {
			p, argv, err := presetArgs(args, c.ArgsLenAtDash())
			if err != nil {
				return err
			}
			e, err := newEnv()
			if err != nil {
				return err
			}
			e.trustProject, e.runtime = trust, runtime
			if handled, err := e.kubeRun(name, kf, p != nil, argv); handled {
				return err // kube.go
			}
			dir, rec, err := e.forCwd(name)
			if err != nil {
				return err
			}
			sessEnv := map[string]string{}
			for k, v := range rec.Placeholders {
				sessEnv[k] = v
			}
			if p != nil {
				if err := e.usePreset(dir, rec, p, sessEnv); err != nil {
					return err
				}
				argv = preset.SeedArgv(guestspec.Binary, p, rec.Workspace, argv)
			}
			err = e.attachEnv(dir, argv, sessionDir(rec.Workspace), sessEnv)
			if p != nil && len(p.Command) > 0 && exitCodeOf(err) == 127 {
				fmt.Fprint(os.Stderr, "moat: "+p.MissingHint(rec.Name))
			}
			return err
		},
	}
	c.Flags().StringVar(&name, "name", "", "sandbox name (default: from moat.toml or the directory)")
	c.Flags().BoolVar(&trust, "trust-project", false, "accept the secrets and trusted roots the project's moat.toml asks for (asked on a terminal otherwise)")
	c.Flags().StringVar(&runtime, "runtime", "", runtimeFlagHelp)
	c.Flags().StringVar(&kf.context, "context", "", "runtime kubernetes: the kubeconfig context (default: its current one)")
	c.Flags().StringVar(&kf.namespace, "namespace", "", "runtime kubernetes: the namespace of the template and the claim (default: the context's, else default)")
	c.Flags().StringVar(&kf.template, "template", "", "runtime kubernetes: the SandboxTemplate to claim a sandbox of, from its warm pool")
	c.Flags().StringVar(&kf.secret, "secret", "", "runtime kubernetes: the Secret (labelled moat.dev/gate-secret=true) whose values the gate swaps in for this claim (default: the template's moat.dev/secret)")
	c.Flags().StringVar(&kf.gateNamespace, "gate-namespace", "", "runtime kubernetes: the namespace of moat's gate DaemonSet, whose audit moat network audit reads (default: moat-gate)")
	return c
}

// presetArgs splits run's arguments: a word before "--" names a preset,
// whatever follows "--" is the command (or, with a preset, its arguments).
func presetArgs(args []string, dash int) (*preset.Preset, []string, error) {
	if dash == 0 || len(args) == 0 {
		return nil, args, nil
	}
	words := args
	if dash > 0 {
		words = args[:dash]
	}
	if len(words) > 1 {
		return nil, nil, codef(ExitUsage, "%q: give one preset, then its arguments after --: moat run %s -- %s",
			strings.Join(words, " "), words[0], strings.Join(words[1:], " "))
	}
	p, err := preset.Lookup(words[0])
	if err != nil {
		return nil, nil, withCode(ExitUsage, err)
	}
	return p, p.Argv(args[len(words):]), nil
}

// usePreset makes the sandbox use the preset: a running sandbox is told
// through its daemon, which records the preset, adds its hosts and reads
// its credentials, with the values of its variables from this environment
// (a key exported after the sandbox started, or rotated); a stopped one
// gets the preset in its record, which the next start reads. It fills env
// with what the session needs: the secrets' placeholders and the preset's
// variables. A recorded preset with no value to hand over needs neither a
// write nor a request: rec's placeholders are already in env.
func (e *env) usePreset(dir string, rec *state.Record, p *preset.Preset, env map[string]string) error {
	for k, v := range p.Env {
		env[k] = v
	}
	recorded := slices.Contains(rec.Presets, p.Name)
	vals := map[string]string{}
	for _, s := range p.Secrets {
		if v, ok := os.LookupEnv(s.Env); ok && v != "" {
			vals[s.Env] = v
		}
	}
	var live func(context.Context, *control.Client) error
	if !recorded || len(vals) > 0 {
		live = func(ctx context.Context, c *control.Client) error {
			a, err := c.Preset(ctx, control.PresetRequest{Name: p.Name, Env: vals})
			if err != nil {
				return withCode(ExitRun, fmt.Errorf("adding preset %s to the running sandbox: %w", p.Name, err))
			}
			for k, v := range a.Placeholders {
				env[k] = v
			}
			return nil
		}
	}
	var record func(*state.Record) error
	if !recorded {
		record = func(r *state.Record) error {
			if !slices.Contains(r.Presets, p.Name) {
				r.Presets = append(r.Presets, p.Name)
			}
			return nil
		}
	}
	return sandboxAt(dir).change(15*time.Second, live, record)
}

func newShellCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "shell [NAME]",
		Short: "Open an interactive shell in a sandbox",
		Long: `Open an interactive shell in a sandbox (NAME, else the current directory's),
starting it if needed: a terminal of its own, window resizes and Ctrl-C reach
the guest. Closing the terminal hangs up the session: its processes get
SIGHUP, as a closed terminal delivers.`,
		Example: "  moat shell\n  moat shell api",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			var dir string
			var rec *state.Record
			if len(args) == 1 {
				dir, rec, err = e.byName(args[0])
			} else {
				dir, rec, err = e.forCwd("")
			}
			if err != nil {
				return err
			}
			return e.attach(dir, nil, sessionDir(rec.Workspace))
		},
	}
}

func newExecCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "exec NAME -- command...",
		Short: "Run a command in a named sandbox",
		Long: `Run a command in the sandbox called NAME, from any directory, starting it if
needed. moat exits with the command's exit code; 125 when it could not run
the command at all.`,
		Example: "  moat exec api -- git status",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			e, dir, _, err := anySandboxNamed(args[0]) // a claim on Kubernetes too (kube.go)
			if err != nil {
				return err
			}
			return e.attach(dir, args[1:], "") // the workspace
		},
	}
}

func newUpCmd() *cobra.Command {
	var fresh, trust, reconf bool
	var name string
	c := &cobra.Command{
		Use:   "up [NAME]",
		Short: "Create and start a sandbox (the current directory's by default)",
		Long: `Create the sandbox of the current directory (the nearest one holding a
moat.toml), or start NAME, and return once its guest answers. A project's
moat.toml that asks for more than a sandbox (network rules, secrets, shares)
needs your consent: asked on a terminal, --trust-project elsewhere. A sandbox
keeps the configuration it was made with; --reconfigure takes the files again.`,
		Example: `  moat up
  moat up api --reconfigure
  moat up --fresh`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			e.trustProject = trust
			var dir string
			var rec *state.Record
			if len(args) == 1 {
				dir, rec, err = e.byName(args[0])
			} else {
				dir, rec, err = e.forCwd(name)
			}
			if err != nil {
				return err
			}
			if rec.Runtime == runtimeKube {
				return kubeNoDaemon(rec)
			}
			if reconf {
				if err := e.reconfigure(dir, rec); err != nil {
					return err
				}
			}
			if fresh {
				if err := e.stop(dir, state.StopUser); err != nil {
					return err
				}
				for _, d := range writableLayer {
					if err := e.removeAll(filepath.Join(dir, d)); err != nil {
						return fmt.Errorf("discarding the writable layer: %w", err)
					}
				}
			}
			if err := e.start(dir); err != nil {
				return err
			}
			fmt.Fprintln(c.OutOrStdout(), filepath.Base(dir))
			return nil
		},
	}
	c.Flags().BoolVar(&trust, "trust-project", false, "accept the secrets and trusted roots the project's moat.toml asks for (asked on a terminal otherwise)")
	c.Flags().BoolVar(&fresh, "fresh", false, "discard the sandbox's writable layer first")
	c.Flags().BoolVar(&reconf, "reconfigure", false, "take moat.toml and config.toml again (the sandbox keeps its configuration from when it was made otherwise); restarts a running sandbox")
	c.Flags().StringVar(&name, "name", "", "sandbox name when creating")
	return c
}

func newDownCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "down [NAME]",
		Short: "Stop a sandbox, keeping its files",
		Long: `Stop a sandbox (NAME, else the current directory's). Its writable layer (the
guest's home, /tmp, what was installed) is kept for the next start; the
workspace is your own directory and is never touched.`,
		Example: `  moat down
  moat down api`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			dir, rec, err := e.resolve(args)
			if err != nil {
				return err
			}
			if rec.Runtime == runtimeKube {
				return kubeNoDaemon(rec)
			}
			if rec.Runtime == runtimeDocker {
				return dockerStop(dir)
			}
			if err := e.stop(dir, state.StopUser); err != nil {
				return err
			}
			return discardSuspended(dir)
		},
	}
}

func newDestroyCmd() *cobra.Command {
	var yes, force bool
	c := &cobra.Command{
		Use:   "destroy [NAME]",
		Short: "Stop a sandbox and delete it with its writable layer",
		Long: `Stop a sandbox and delete it: its writable layer, its disk image, its audit
log, keys and record. The workspace is your own directory and is kept. On a
terminal moat asks first; elsewhere --yes is required. A ticket's sandbox (moat
work) is refused while a worktree has uncommitted or unpushed work; --force
destroys it and removes the worktrees, keeping their branches.`,
		Example: `  moat destroy api --yes`,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			tk, err := e.ticketDestroy(args, force) // a ticket's worktrees (ticket.go)
			if err != nil {
				return err
			}
			dir, rec, err := e.resolve(args)
			if err != nil && tk != nil && exitCode(err) == ExitNotFound {
				return tk.remove() // a ticket whose sandbox is gone already
			}
			if err != nil {
				return err
			}
			if !yes && !force {
				if !term.IsTerminal(int(os.Stdin.Fd())) {
					return codef(ExitUsage, "destroy deletes sandbox %q and its files; confirm with: moat destroy %s --yes", rec.Name, rec.Name)
				}
				fmt.Fprintf(os.Stderr, "Destroy sandbox %q (%s) and its files? [y/N] ", rec.Name, rec.Workspace)
				var answer string
				fmt.Scanln(&answer)
				if a := strings.ToLower(answer); a != "y" && a != "yes" {
					return errors.New("not destroyed")
				}
			}
			if rec.Runtime == runtimeKube {
				if err := e.kubeDestroy(dir, rec); err != nil {
					return err
				}
				return tk.remove()
			}
			if rec.Runtime == runtimeDocker {
				if err := dockerDown(dir); err != nil {
					return fmt.Errorf("not destroyed: %w", err)
				}
			}
			if err := e.stop(dir, state.StopUser); err != nil {
				return err
			}
			// A crashed daemon's cgroups: its shim may still be removing
			// them, holding the group lock in the directory about to go,
			// or may have failed or died with the daemon.
			if err := resources.RemoveStaleWait(dir); err != nil {
				return fmt.Errorf("not destroyed: %w", err)
			}
			e.removeAgentState(rec) // its conversations into its project's (sessions.go)
			if err := e.removeAll(dir); err != nil {
				return fmt.Errorf("removing %s: %w", dir, err)
			}
			fmt.Fprintf(os.Stderr, "moat: destroyed %s\n", rec.Name)
			return tk.remove()
		},
	}
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask")
	c.Flags().BoolVar(&force, "force", false, "a ticket's sandbox: remove its worktrees even with uncommitted or unpushed work (implies --yes)")
	return c
}

// listEntry is one sandbox in `list --json` and `status --json`.
type listEntry struct {
	Schema     int       `json:"schema"`
	Name       string    `json:"name"`
	State      string    `json:"state"`
	StopReason string    `json:"stop_reason,omitempty"`
	Image      string    `json:"image"`
	Workspace  string    `json:"workspace"`
	Runtime    string    `json:"runtime,omitempty"` // gvisor, docker or kubernetes
	Created    time.Time `json:"created"`
	Started    time.Time `json:"started,omitzero"`
	PID        int       `json:"daemon_pid,omitempty"`
	Sessions   int       `json:"sessions"`
	Denials    int64     `json:"denials"`            // connections the gate denied since the daemon started
	Warnings   []string  `json:"warnings,omitempty"` // about the policy: lists never fetched, lines rejected
	Error      string    `json:"error,omitempty"`
	// Resources: CPU, memory and pids of a running sandbox (resources.go).
	Resources *control.Resources `json:"resources,omitempty"`
	// Changed: files in the workspace the host runs (git hooks, editor
	// tasks) that changed since the sandbox was made (status only).
	Changed []sentinel.Change `json:"changed_files,omitempty"`
	// Activity and Gate: traffic, idleness, the gate's mode and watchers
	// (running sandboxes only).
	Activity *control.Activity   `json:"activity,omitempty"`
	Gate     *control.GateStatus `json:"gate,omitempty"`
	// Disk: the writable layer's use and limit (disk.go).
	Disk *control.Disk `json:"disk,omitempty"`
	// Platform: gVisor's platform, of a running sandbox.
	Platform string `json:"platform,omitempty"`
	// NoLimits: why the sandbox has no resource limits (moat without
	// sudo where it cannot write a cgroup: resources.NoLimits).
	NoLimits string `json:"no_limits,omitempty"`
	// SuspendImageBytes: the checkpoint image of a suspended sandbox.
	SuspendImageBytes int64 `json:"suspend_image_bytes,omitempty"`
	// Standby: a suspended sandbox has a standby (moat suspend --standby).
	Standby bool `json:"standby,omitempty"`
	// SnapshotBytes: its named snapshots on disk (moat snapshot list).
	SnapshotBytes int64 `json:"snapshot_bytes,omitempty"`
	// Claim: a Kubernetes sandbox's claim (kube.go).
	Claim *kubert.Record `json:"claim,omitempty"`

	dir        string // its state directory
	imageWhole bool   // its checkpoint image is whole (runtime.ImageSize)
}

func (e *env) entry(r *state.Record) listEntry {
	dir := e.dirs.Sandbox(r.Name)
	if r.Runtime == runtimeKube {
		return kubeEntry(r, dir)
	}
	st, reason := state.Effective(r, dir)
	le := listEntry{Schema: 1, Name: r.Name, State: st, StopReason: reason, Image: r.Image, Runtime: runtimeName(r.Runtime),
		Workspace: r.Workspace, Created: r.Created, Started: r.Started, Error: r.Error, NoLimits: resources.NoLimits(), dir: dir}
	le.SuspendImageBytes, le.imageWhole = runtime.ImageSize(dir)
	le.Standby = st == state.StateSuspended && state.StandbyAlive(dir)
	le.SnapshotBytes = snapshotBytes(dir)
	if st == state.StateRunning || st == state.StateStarting {
		le.PID = r.DaemonPID
		if s, ok := ask(sandboxAt(dir), 2*time.Second, (*control.Client).Status); ok {
			le.Sessions, le.Denials = s.Sessions, s.Denials
			le.Platform = s.Platform
			le.Warnings = s.Warnings
			le.Resources = s.Resources
			le.Activity, le.Gate = s.Activity, s.Gate
			le.Disk = s.Disk
		}
	} else {
		le.Disk = stoppedDisk(dir)
	}
	return le
}

func stateText(le listEntry) string {
	if s, ok := suspendedText(le); ok {
		return s
	}
	if le.StopReason != "" && (le.State == state.StateStopped || le.State == state.StateCrashed) && le.StopReason != state.StopCrash {
		return fmt.Sprintf("%s (%s)", le.State, le.StopReason)
	}
	return le.State
}

func newListCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List sandboxes and their state",
		Long: `List every sandbox with its state (running, stopped and why, crashed), its
CPU quota and use, memory (used, soft limit, ceiling), disk (used, limit),
image and workspace. --json prints one object per sandbox, "schema": 1.`,
		Example: `  moat list
  moat list --json`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			recs, err := state.List(e.dirs)
			if err != nil {
				return err
			}
			out := c.OutOrStdout()
			if asJSON {
				entries := []listEntry{}
				for _, r := range recs {
					entries = append(entries, e.entry(r))
				}
				return json.NewEncoder(out).Encode(map[string]any{"schema": 1, "sandboxes": entries})
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tCPU\tMEMORY\tDISK\tIMAGE\tWORKSPACE\tRUNTIME")
			for _, r := range recs {
				le := e.entry(r)
				cpu, mem := resourceColumns(le.Resources)
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", le.Name, stateText(le), cpu, mem, diskColumn(le.Disk), le.Image, le.Workspace, le.Runtime)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newStatusCmd() *cobra.Command {
	var asJSON, accept bool
	c := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show one sandbox's state",
		Long: `Show one sandbox (NAME, else the current directory's): state and last error,
platform, resources and pressure, disk, network traffic and idleness, the
gate's mode and its audit, warnings about its policy, and files the host runs
(git hooks, editor tasks) the guest changed since the sandbox was made. A
ticket's sandbox (moat work) adds each repository's branch, commits ahead and
behind, uncommitted files and pull request.`,
		Example: `  moat status
  moat status api --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			dir, rec, err := e.resolve(args)
			if err != nil {
				return err
			}
			if accept {
				if err := baseline(dir, rec.Workspace); err != nil {
					return err
				}
			}
			le := e.entry(rec)
			if rec.Runtime == runtimeKube {
				return printKubeStatus(c.OutOrStdout(), le, asJSON) // kube.go: no daemon, no workspace in the pod
			}
			if le.Changed, err = workspaceChanges(dir, rec.Workspace); err != nil {
				le.Warnings = append(le.Warnings, "could not check the workspace's git hooks and editor files: "+err.Error())
			}
			out := c.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(e.withTicket(le))
			}
			fmt.Fprintf(out, "name:       %s\nstate:      %s\nimage:      %s\nworkspace:  %s\nsessions:   %d\ndenials:    %d (see: moat network denials %s)\n",
				le.Name, stateText(le), le.Image, le.Workspace, le.Sessions, le.Denials, le.Name)
			if !le.Started.IsZero() {
				fmt.Fprintf(out, "started:    %s\n", le.Started.Format(time.RFC3339))
			}
			if le.Platform != "" {
				fmt.Fprintf(out, "platform:   gVisor on %s\n", le.Platform)
			}
			printResources(out, le.Resources)
			if le.NoLimits != "" {
				fmt.Fprintf(out, "limits:     none: %s\n", le.NoLimits)
			}
			printDisk(out, le.Disk)
			printActivity(out, le.Activity, le.Gate)
			for _, w := range le.Warnings {
				fmt.Fprintf(out, "warning:    %s\n", w)
			}
			printChanges(out, le.Name, le.Changed)
			if le.Error != "" {
				fmt.Fprintf(out, "last error: %s\n", le.Error)
			}
			e.printTicketStatus(out, le.Name)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().BoolVar(&accept, "accept-changes", false, "accept the changed git hooks and editor files listed (after reviewing them)")
	return c
}

func newLogsCmd() *cobra.Command {
	var follow bool
	c := &cobra.Command{
		Use:   "logs NAME [-f]",
		Short: "Print a sandbox's daemon log",
		Long: `Print the log of a sandbox's daemon: its start and stop, hook output (lines
starting hook|), the gate's warnings. -f follows it, across rotations.`,
		Example: `  moat logs api
  moat logs api -f`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			_, dir, _, err := sandboxNamed(args[0])
			if err != nil {
				return err
			}
			return printLog(c.OutOrStdout(), filepath.Join(dir, "daemon.log"), follow, sandboxAt(dir).alive)
		},
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing until the daemon exits")
	return c
}
