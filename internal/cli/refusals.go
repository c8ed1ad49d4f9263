package cli

import (
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/policy"
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
	s := sandboxAt(dir)
	d, ok := ask(s, time.Second, (*control.Client).Denials)
	if !ok {
		return
	}
	refusals := refusalsSince(d.Entries, since)
	if len(refusals) == 0 {
		return
	}
	name := s.name
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

// refusalWhy is the reason as `moat network denials` and the audit give it.
func refusalWhy(en audit.Entry) string {
	if why := audit.Why(en.Layer, en.Rule, en.Reason); why != "" {
		return why
	}
	return string(audit.ReasonNoRule)
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
	case en.Reason != "" && !en.Reason.Is(audit.ReasonNoRule):
		return ""
	}
	if en.Proto != "tcp" { // the gate carries no other protocol
		return ""
	}
	var port uint16
	if len(en.Ports) > 0 {
		port = en.Ports[len(en.Ports)-1]
	}
	var addr netip.Addr
	if en.Name == "" {
		ap, err := netip.ParseAddrPort(en.Dest)
		if err != nil {
			return ""
		}
		addr, port = ap.Addr(), ap.Port()
	}
	return "moat network allow " + name + " " + policy.AllowEntry(en.Name, addr, port)
}
