package cli

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
)

// maxRefusalsShown bounds the refusals printed after a failed command: the
// first few say what went wrong; `moat network denials` has the rest.
const maxRefusalsShown = 10

// printRefusals tells, on w (stderr: never mixed into the command's own
// output), which destinations the gate refused the sandbox at dir since
// since, each with what would allow it. A command that failed may have
// failed for want of one, and the agent's own error ("check your internet
// connection") does not say so. Best effort: a daemon that does not answer
// in a second prints nothing.
func printRefusals(w io.Writer, dir string, since time.Time) {
	if !state.DaemonAlive(dir) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := control.New(filepath.Join(dir, "control.sock")).Denials(ctx)
	if err != nil {
		return
	}
	refusals := refusalsSince(d.Entries, since)
	if len(refusals) == 0 {
		return
	}
	name := filepath.Base(dir)
	fmt.Fprintln(w, "moat: the gate refused these while the command ran:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, en := range refusals {
		if i == maxRefusalsShown {
			fmt.Fprintf(tw, "  … and %d more\t\t\n", len(refusals)-i)
			break
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", en.Dest, refusalWhy(en), allowHint(name, en))
	}
	tw.Flush()
	fmt.Fprintf(w, "moat: all of them: moat network denials %s\n", name)
}

// refusalsSince are the ledger's entries last refused at or after since,
// oldest first: the order the command met them.
func refusalsSince(entries []audit.Entry, since time.Time) []audit.Entry {
	var out []audit.Entry
	for i := len(entries) - 1; i >= 0; i-- { // the ledger lists the newest first
		if !entries[i].Last.Before(since) {
			out = append(out, entries[i])
		}
	}
	return out
}

func refusalWhy(en audit.Entry) string {
	if en.Rule != "" {
		return "blocked by rule " + strconv.Quote(en.Rule)
	}
	if en.Reason == "" {
		return "no rule allows it"
	}
	return en.Reason
}

// allowHint is the command that allows en, or what to do instead when no
// allow rule would: a block is removed, not outvoted, and the refusals made
// for the sandbox's safety (private addresses, TLS without a name) have no
// allow rule that a person should type without reading the docs.
func allowHint(name string, en audit.Entry) string {
	switch {
	case en.Rule != "":
		return "remove that block: moat network list " + name
	case en.Proto == "http":
		return "a request rule allows it: moat network suggest " + name
	case en.Reason != "" && !strings.HasPrefix(en.Reason, "no rule"):
		return ""
	}
	entry := allowEntry(en)
	if entry == "" {
		return ""
	}
	return "moat network allow " + name + " " + entry
}

// allowEntry is the allow entry for a ledger destination: the name for the
// web ports (a name rule covers 80 and 443), else name:port or ip:port.
func allowEntry(en audit.Entry) string {
	if en.Proto != "tcp" { // the gate carries no other protocol
		return ""
	}
	if en.Name == "" {
		if _, err := netip.ParseAddrPort(en.Dest); err != nil {
			return ""
		}
		return en.Dest
	}
	web := len(en.Ports) > 0
	for _, p := range en.Ports {
		web = web && (p == 80 || p == 443)
	}
	if web || len(en.Ports) == 0 {
		return en.Name
	}
	return en.Dest
}
