// Command moat-gate is moat's egress gate as a service for clients that
// are not moat's own sandboxes (internal/gateserve; docs/gate-service.md):
// `moat-gate serve --config FILE`, which `moat gate serve` runs. It is a
// binary of its own so that moat does not link the service's Prometheus
// client, whose package init every moat process would pay
// (docs/architecture.md, "Moat's binaries").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"moat.dev/moat/internal/gateserve"
)

// version is set by scripts/setup.sh (-X main.version=...).
var version = "dev"

// Exit codes, as moat's (`moat help exit-codes`) for the same errors.
const (
	exitError = 1
	exitUsage = 2
)

const usage = `Usage: moat-gate serve --config FILE
       moat-gate audit-follow FILE
       moat-gate version

Run the gate service described by FILE (TOML; see docs/gate-service.md) until
SIGTERM or SIGINT, which stop it accepting and give the HTTP and TLS
connections it holds up to 5 s to finish. It must start as root: it binds its
ports, reads its CA, policies and secrets, then drops to service.uid in a jail.
SIGHUP reloads each tenant's rules and secrets without dropping open
connections.

The CA's certificate (public part) is written to service.ca_cert for clients
to trust. Logs go to stderr as JSON lines; decisions go to each tenant's audit
log.

audit-follow prints the records of the audit log FILE as JSON lines, from
the start of its current file, then each new one: the gate pod's "audit"
container on Kubernetes, whose log moat network audit reads.

Examples:
  sudo moat-gate serve --config /etc/moat-gate/gate.toml
  sudo kill -HUP $(pidof moat-gate)   # reload the tenants' rules and secrets
`

func main() { os.Exit(run(os.Args, os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	if len(args) < 2 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[1] {
	case "version", "--version":
		fmt.Println(version)
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(os.Stdout, usage)
		return 0
	case "audit-follow":
		// The gate pod's "audit" container (gateserve.FollowAudit).
		if len(args) != 3 {
			fmt.Fprintln(stderr, "moat-gate: audit-follow FILE; see: moat-gate --help")
			return exitUsage
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := gateserve.FollowAudit(ctx, args[2], os.Stdout); err != nil {
			fmt.Fprintln(stderr, "moat-gate:", err)
			return exitError
		}
		return 0
	case "serve":
	default:
		fmt.Fprintf(stderr, "moat-gate: unknown command %q; see: moat-gate --help\n", args[1])
		return exitUsage
	}
	fs := flag.NewFlagSet("moat-gate serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	path := fs.String("config", "", "the service's configuration file (TOML)")
	if err := fs.Parse(args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if *path == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "moat-gate: --config FILE is required, and nothing else; see: moat-gate --help")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "gate-service")
	if err := gateserve.Run(ctx, *path, log); err != nil {
		fmt.Fprintln(stderr, "moat-gate:", err)
		return exitError
	}
	return 0
}
