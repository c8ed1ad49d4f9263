package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
)

func newSecretsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "secrets",
		Short: "Read a running sandbox's secrets again",
		Long: `Secrets ([secrets.NAME] in config.toml or moat.toml, and the credentials of the
presets a sandbox uses) are read on the host when the sandbox starts and held only
in its daemon's memory; the guest sees placeholders. After a token rotates, a
password manager answers differently or a secret's file changes:

  moat secrets refresh api`,
	}
	c.AddCommand(newSecretsRefreshCmd())
	return c
}

func newSecretsRefreshCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "refresh [NAME]",
		Short: "Read every secret of a running sandbox again, without restarting it",
		Long: `Read every secret of a running sandbox again and swap the new values in together:
env: sources from this command's environment (else the values the sandbox started
with), file: and command: sources on the host. The placeholders stay the same, and
the values replaced stay scrubbed from what the bound hosts answer. If any value
cannot be read, nothing changes and the error names the secret and its source.`,
		Example: `  moat secrets refresh
  moat secrets refresh api`,
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
			s := sandboxAt(dir)
			if rec.State != state.StateRunning || !s.alive() {
				return codef(ExitError, "sandbox %q is not running: its secrets are read when it starts (moat up %s)", rec.Name, rec.Name)
			}
			// The values a start would hand over.
			_, vals, err := daemonEnviron(rec)
			if err != nil {
				return err
			}
			var a *control.SecretsRefreshAnswer
			err = s.call(60*time.Second, func(ctx context.Context, c *control.Client) (err error) {
				a, err = c.RefreshSecrets(ctx, control.SecretsRefreshRequest{Env: vals})
				return err
			})
			if err != nil {
				return withCode(ExitError, fmt.Errorf("refreshing the secrets of %s: %w", rec.Name, err))
			}
			if len(a.Refreshed) == 0 {
				fmt.Fprintf(c.OutOrStdout(), "%s has no secrets\n", rec.Name)
				return nil
			}
			changed := "none changed"
			if len(a.Changed) > 0 {
				changed = "changed: " + strings.Join(a.Changed, ", ")
			}
			fmt.Fprintf(c.OutOrStdout(), "read again: %s (%s)\n", strings.Join(a.Refreshed, ", "), changed)
			return nil
		},
	}
}
