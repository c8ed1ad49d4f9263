package cli

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/spf13/cobra"
)

// newGateCmd is `moat gate`: the egress gate on its own, for clients that
// are not moat's sandboxes.
func newGateCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "gate",
		Short: "Run moat's egress gate as a service for other clients",
		Long: `moat gate serves clients that are not moat's own sandboxes (containers on an
internal network, pods) with the same gate a sandbox has: DNS that never sends a
denied name upstream, HTTP and HTTPS decided by Host and SNI, TLS interception
with the service's CA, credential placeholders, refusal pages and an audit log.
The service is moat-gate, a binary installed next to moat. See
docs/gate-service.md.`,
	}
	c.AddCommand(newGateServeCmd())
	return c
}

func newGateServeCmd() *cobra.Command {
	var path string
	c := &cobra.Command{
		Use:   "serve --config FILE",
		Short: "Run the gate service until stopped",
		Long: `Run the gate service described by FILE (TOML; see docs/gate-service.md) until
SIGTERM or SIGINT, which stop it accepting and give the HTTP and TLS
connections it holds up to 5 s to finish. It must start as root: it binds its
ports, reads its CA, policies and secrets, then drops to service.uid in a jail.
SIGHUP reloads each tenant's rules and secrets without dropping open
connections.

The CA's certificate (public part) is written to service.ca_cert for clients
to trust. Logs go to stderr as JSON lines; decisions go to each tenant's audit
log.

The service is the binary moat-gate, next to moat (scripts/setup.sh builds
both): this command becomes "moat-gate serve --config FILE" in the same
process, so its signals and exit codes are moat-gate's. Run moat-gate
directly where moat itself is not wanted, as in a container image.`,
		Example: `  sudo moat gate serve --config /etc/moat-gate/gate.toml
  sudo kill -HUP $(pidof moat-gate)   # reload the tenants' rules and secrets`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if path == "" {
				return withCode(ExitUsage, errors.New("--config FILE is required; see: moat gate serve --help"))
			}
			gate, err := sibling(gateBinary)
			if err != nil {
				return err
			}
			// Exec, not a child: the process a service manager or a
			// shell's kill signals (SIGHUP to reload) is the service's,
			// and its exit code is moat's.
			err = syscall.Exec(gate, []string{gate, "serve", "--config", path}, os.Environ())
			return withCode(ExitHost, fmt.Errorf("running %s: %w", gate, err))
		},
	}
	c.Flags().StringVar(&path, "config", "", "the service's configuration file (TOML)")
	return c
}
