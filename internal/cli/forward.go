package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/forward"
	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/state"
)

func newForwardCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "forward",
		Short: "Forward ports between the host and a sandbox",
		Long: `Forward a host port to a port in the sandbox (a dev server, for the host's
browser), or, with --reverse, let the sandbox reach one port of the host's
127.0.0.1 (a database) at the gateway address 10.88.0.1. Changes apply at once
and are kept with the sandbox; [forwards] in moat.toml declares them per project.

  moat forward add api 3000                  host 127.0.0.1:3000 → guest port 3000
  moat forward add api 8080:80               host 127.0.0.1:8080 → guest port 80
  moat forward add --reverse api 15432:5432  guest 10.88.0.1:5432 → host 127.0.0.1:15432
  moat forward list api
  moat forward remove api 8080`,
	}
	c.AddCommand(newForwardChangeCmd("add"), newForwardChangeCmd("remove"), newForwardListCmd())
	return c
}

func newForwardChangeCmd(op string) *cobra.Command {
	var reverse bool
	var address string
	short := map[string]string{
		"add":    "Add a port forward, live and kept with the sandbox",
		"remove": "Remove a port forward added with add, closing its connections",
	}[op]
	c := &cobra.Command{
		Use:   op + " NAME SPEC",
		Short: short,
		Long: short + `.

SPEC is a port (3000: the same port on both sides) or HOST:GUEST (8080:80), ports
1-65535. A host → guest forward listens on 127.0.0.1 only, unless --address names
another host address. With --reverse, a connection from the sandbox to
10.88.0.1:GUEST reaches 127.0.0.1:HOST on the host; every other port of 10.88.0.1
stays refused. To remove, the port that listens is enough (8080, or 5432 with
--reverse).`,
		Example: fmt.Sprintf("  moat forward %s api 8080:80\n  moat forward %s --reverse api 5432", op, op),
		Args:    cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			_, dir, rec, err := sandboxNamed(args[0])
			if err != nil {
				return err
			}
			ch := control.ForwardChange{Op: op, Reverse: reverse, Spec: args[1], Address: address}
			// Checked here too, so a bad spec is a usage error even when
			// the sandbox is stopped.
			fw, _, err := forward.Parse(ch.Spec)
			if err != nil {
				return withCode(ExitUsage, err)
			}
			if op == "add" {
				if fw.Address, err = forward.CheckAddress(address); err != nil {
					return withCode(ExitUsage, err)
				}
			}
			running := false
			err = changeForwards(dir, rec, 10*time.Second, func(ctx context.Context, c *control.Client) error {
				running = true
				_, err := c.ChangeForward(ctx, ch)
				return err
			}, func(r *state.Record) error {
				cfg, err := r.Snapshot()
				if err != nil {
					return err
				}
				if r.Forwards == nil {
					r.Forwards = &state.RuntimeForwards{}
				}
				err = forward.ApplyChange(r.Forwards, cfg, args[0], ch)
				if errors.Is(err, forward.ErrSpec) {
					return withCode(ExitUsage, err)
				}
				return err
			})
			if err != nil {
				return err
			}
			w := forward.Wire(forward.Entry{Reverse: reverse, Forward: fw}, "", "", netstack.Gateway)
			verb := map[string]string{"add": "forwarding", "remove": "removed"}[op]
			fmt.Fprintf(os.Stderr, "moat: %s %s → %s for %s\n", verb, describeListen(w), describeTarget(w), args[0])
			if !running && op == "add" {
				start := "moat up " + args[0]
				if rec.Runtime == runtimeDocker {
					start = "moat exec " + args[0] + " -- true" // it starts with a session
				}
				fmt.Fprintf(os.Stderr, "moat: %s is not running; the forward starts with it: %s\n", args[0], start)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&reverse, "reverse", false, "guest → host: the sandbox reaches the host's 127.0.0.1:HOST at 10.88.0.1:GUEST")
	if op == "add" {
		c.Flags().StringVar(&address, "address", "", "host address to listen on (default 127.0.0.1; 0.0.0.0 exposes the port to the network)")
	}
	return c
}

// describeListen names where a forward listens, saying which side's
// address it is.
func describeListen(w control.Forward) string {
	if w.Direction == control.ToHost {
		return "guest " + w.Listen
	}
	return "host " + w.Listen
}

// describeTarget names where a forward's connections go.
func describeTarget(w control.Forward) string {
	if w.Direction == control.ToHost {
		return "host " + w.Target
	}
	return fmt.Sprintf("guest port %d", w.Guest)
}

func newForwardListCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list NAME",
		Short: "List a sandbox's port forwards, where they listen and where they came from",
		Long: `List a sandbox's port forwards, both directions: where each listens, where
it leads, whether it came from moat.toml or was added at run time, and
whether it is listening now.`,
		Example: `  moat forward list api`,
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			_, dir, rec, err := sandboxNamed(args[0])
			if err != nil {
				return err
			}
			fs, err := forwardsOf(dir, rec)
			if err != nil {
				return err
			}
			out := c.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(control.Forwards{Schema: control.Schema, Forwards: fs})
			}
			return printForwards(out, fs)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// forwardsOf asks the running daemon, or reads the record of a stopped
// sandbox.
func forwardsOf(dir string, rec *state.Record) ([]control.Forward, error) {
	if rec.Runtime == runtimeDocker {
		if fs, ok := dockerForwards(dir); ok {
			return fs, nil
		}
	} else if f, ok := ask(sandboxAt(dir), 10*time.Second, (*control.Client).Forwards); ok {
		return f.Forwards, nil
	}
	cfg, err := rec.Snapshot()
	if err != nil {
		return nil, err
	}
	out := []control.Forward{}
	for _, e := range forward.Entries(cfg.Forwards, rec.Forwards) {
		out = append(out, forward.Wire(e, "stopped", "", netstack.Gateway))
	}
	return out, nil
}

func printForwards(out io.Writer, fs []control.Forward) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DIRECTION\tLISTEN\tTO\tSOURCE\tSTATUS")
	var errs []string
	for _, f := range fs {
		dirn := "host → guest"
		if f.Direction == control.ToHost {
			dirn = "guest → host"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", dirn, describeListen(f), describeTarget(f), f.Source, f.Status)
		if f.Error != "" {
			errs = append(errs, f.Spec+": "+f.Error)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(errs) > 0 {
		fmt.Fprintln(os.Stderr, "moat: "+strings.Join(errs, "\nmoat: "))
	}
	return nil
}
