// Package cli is moat's command line (Main, the moat binary). The roles
// moat starts for a sandbox (daemon, shim, guest init with the guest agent
// inside) are internal/roles, the moat-sandbox binary, dispatched on argv
// without the command parser so that the guest and the daemon never
// depend on flags meant for people.
package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/roles"
)

// Main runs moat's command line and returns its exit code. The roles
// moat starts for a sandbox are moat-sandbox's (roles.RoleMain), not its own.
func Main(args []string) int {
	root := newRoot()
	root.SetArgs(args[1:])
	err := root.Execute()
	if err == nil {
		return ExitOK
	}
	var ce commandExit
	if errors.As(err, &ce) {
		return int(ce)
	}
	fmt.Fprintln(os.Stderr, "moat:", err)
	return exitCode(err)
}

// exitCode is the exit code an error carries (withCode), else ExitError.
func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return ExitError
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "moat",
		Short: "Run a coding agent or any command in a disposable gVisor sandbox",
		Long: `moat runs a command in its own Linux sandbox (a separate gVisor kernel), with the
project mounted at its host path, as user "agent" with passwordless sudo, and a
network whose only exit is a gate outside the sandbox.

Start here:
  moat run -- make test       run a command in this directory's sandbox
  moat shell                  an interactive shell there
  moat list                   every sandbox and its state`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       roles.Version,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return withCode(ExitUsage, fmt.Errorf("%w; see: %s --help", err, c.CommandPath()))
	})
	root.AddCommand(
		newRunCmd(), newShellCmd(), newExecCmd(),
		newUpCmd(), newDownCmd(), newDestroyCmd(), newSuspendCmd(), newResumeCmd(), newForkCmd(), newSnapshotCmd(),
		newListCmd(), newStatusCmd(), newLogsCmd(),
		newImageCmd(), newDoctorCmd(), newVersionCmd(),
		newNetworkCmd(), newPolicyCmd(), newSecretsCmd(),
	)
	root.AddCommand(newForwardCmd())
	root.AddCommand(newSSHConfigCmd(), newSSHProxyCmd())
	root.AddCommand(newGateCmd())
	root.AddCommand(ticketCommands()...)
	root.AddCommand(newSessionsCmd())
	root.AddCommand(&cobra.Command{
		Use:   "exit-codes",
		Short: "What moat's exit codes mean",
		Long:  `Print what each of moat's exit codes means.`,
		Args:  cobra.NoArgs,
		Run:   func(c *cobra.Command, _ []string) { fmt.Fprint(c.OutOrStdout(), exitCodesHelp) },
	})
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [command | exit-codes]",
		Short: "Help about any command, or exit-codes",
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 1 && args[0] == "exit-codes" {
				fmt.Fprint(c.OutOrStdout(), exitCodesHelp)
				return nil
			}
			// Find gives the deepest command the words name and the words
			// past it: a word it does not know is one of those.
			cmd, rest, err := c.Root().Find(args)
			if cmd == nil || err != nil || len(rest) > 0 {
				return withCode(ExitUsage, fmt.Errorf("unknown help topic %q; see: moat --help", args))
			}
			return cmd.Help()
		},
	})
	usageErrors(root)
	return root
}

// usageErrors makes a wrong number of arguments, or an unknown command,
// exit 2 (bad usage) as `moat help exit-codes` says, not 1: cobra returns
// those as plain errors. A group of commands (moat network) run with an
// unknown word says so instead of printing its help and exiting 0.
func usageErrors(c *cobra.Command) {
	if !c.Runnable() && c.HasSubCommands() {
		c.Args = cobra.NoArgs
		c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	}
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return codef(ExitUsage, "%v; see: %s --help", err, cmd.CommandPath())
			}
			return nil
		}
	}
	for _, s := range c.Commands() {
		usageErrors(s)
	}
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print moat's version",
		Long:  `Print moat's version and the runsc it uses.`,
		Args:  cobra.NoArgs,
		Run:   func(c *cobra.Command, _ []string) { fmt.Fprintln(c.OutOrStdout(), "moat", roles.Version) },
	}
}
