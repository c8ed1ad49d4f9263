package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/net/publicsuffix"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/policy"
)

// Learning to a file: `moat network suggest` turns the denials (or, in
// report mode, the would-be denials) of a run into allow rules, grouped
// by registrable domain, ready to paste into moat.toml.

func newSuggestCmd() *cobra.Command {
	var since time.Duration
	c := &cobra.Command{
		Use:   "suggest NAME",
		Short: "Print the allow rules that would have let a sandbox's denied traffic through",
		Long: `Reads the sandbox's audit log and prints a [network] section whose allow rules
cover every connection and request that was denied, or that report mode let through
as would_deny, grouped by registrable domain. Paste it into moat.toml after reading
it: it allows what the agent did, not what it should do.

Refusals that no allow rule can lift are listed as comments, not rules: a name a
block rule denies (remove the block first), and addresses refused for the sandbox's
safety (loopback, private ranges, the host's own addresses).

  mode = "report"            # in moat.toml: learn first
  moat run -- npm ci         # the run to learn from
  moat network suggest api   # then paste, and set mode = "enforce"`,
		Example: `  moat network suggest api
  moat network suggest api --since 1h`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			_, dir, rec, err := sandboxNamed(args[0])
			if err != nil {
				return err
			}
			var recs []audit.Record
			from := time.Time{}
			if since > 0 {
				from = time.Now().Add(-since)
			}
			err = audit.ReadLogs(auditLogs(dir, rec), func(r audit.Record) bool {
				if !r.Time.Before(from) {
					recs = append(recs, r)
				}
				return true
			})
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("reading the audit log: %w", err)
			}
			s := suggest(recs)
			if len(s.groups) == 0 && len(s.notes) == 0 {
				fmt.Fprintf(c.ErrOrStderr(), "nothing was denied in %s's audit log; nothing to suggest\n", args[0])
				return nil
			}
			return s.write(c.OutOrStdout())
		},
	}
	c.Flags().DurationVar(&since, "since", 0, "only records newer than this (e.g. 1h); default: the whole log")
	return c
}

// suggestion is suggest's result: allow entries by registrable domain,
// and refusals no allow rule lifts.
type suggestion struct {
	groups []suggestGroup
	notes  []string
}

type suggestGroup struct {
	domain  string
	entries []string
	count   int64 // connections and requests they cover
}

// suggest turns denied and would_deny records into allow entries. A name
// seen on 443 or 80 only gets the bare name (the two go together); on
// another port, name:port. A request refused by request rules gets a
// request rule for its method and path. A destination without a name gets
// ip:port.
func suggest(recs []audit.Record) suggestion {
	type key struct{ domain, entry, name string }
	counts := map[key]int64{}
	notes := map[string]bool{}
	whole := map[string]bool{} // names whose connections were refused, not only some requests
	for _, r := range recs {
		if r.Verdict != audit.Deny && r.Verdict != audit.WouldDeny || r.Phase == audit.PhaseEnd {
			continue // a carried connection counts once, by its start
		}
		if r.Proto != "tcp" && r.Proto != "http" {
			continue // DNS denials are followed by the connection's record; UDP stays off
		}
		switch {
		case r.Reason == audit.ReasonBlocked && r.Rule != "":
			notes[fmt.Sprintf("%s: blocked by %s rule %q; remove that block to allow it", dest(r), r.Layer, r.Rule)] = true
			continue
		case r.Reason != audit.ReasonNoRule && !r.Reason.Is(audit.ReasonHeld) && r.Reason != audit.ReasonWatcherDenied:
			notes[fmt.Sprintf("%s: %s", dest(r), r.Reason)] = true
			continue
		}
		entry, domain := suggestEntryOf(r)
		if entry == "" {
			continue
		}
		if _, err := policy.ParseEntry(entry); err != nil {
			notes[fmt.Sprintf("%s: no rule can be written for it (%v)", dest(r), err)] = true
			continue
		}
		if entry == r.Name || strings.HasPrefix(entry, r.Name+":") {
			whole[r.Name] = true
		}
		counts[key{domain, entry, r.Name}] += max(r.Count, 1) // an aggregate counts its repeats
	}
	byDomain := map[string]*suggestGroup{}
	for k, n := range counts {
		if whole[k.name] && strings.Contains(k.entry, " ") {
			continue // a request rule under a name allowed whole anyway
		}
		g := byDomain[k.domain]
		if g == nil {
			g = &suggestGroup{domain: k.domain}
			byDomain[k.domain] = g
		}
		g.entries = append(g.entries, k.entry)
		g.count += n
	}
	var s suggestion
	for _, g := range byDomain {
		slices.Sort(g.entries)
		s.groups = append(s.groups, *g)
	}
	slices.SortFunc(s.groups, func(a, b suggestGroup) int { return strings.Compare(a.domain, b.domain) })
	for n := range notes {
		s.notes = append(s.notes, n)
	}
	slices.Sort(s.notes)
	return s
}

func dest(r audit.Record) string {
	if r.Name != "" {
		if ap, err := netip.ParseAddrPort(r.Dst); err == nil {
			return r.Name + ":" + strconv.Itoa(int(ap.Port()))
		}
		return r.Name
	}
	return r.Dst
}

// suggestEntryOf is the allow entry for one refused record and the
// registrable domain it is grouped under.
func suggestEntryOf(r audit.Record) (entry, domain string) {
	ap, err := netip.ParseAddrPort(r.Dst)
	if err != nil {
		return "", ""
	}
	port := ap.Port()
	if r.Name == "" {
		return policy.AllowEntry("", ap.Addr(), port), "addresses"
	}
	domain, err = publicsuffix.EffectiveTLDPlusOne(r.Name)
	if err != nil {
		domain = r.Name
	}
	if r.Proto == "http" && r.Method != "" && r.Path != "" {
		// Refused by request rules on an inspected host.
		return r.Method + " " + r.Name + r.Path, domain
	}
	return policy.AllowEntry(r.Name, ap.Addr(), port), domain
}

func (s suggestion) write(w io.Writer) error {
	var b strings.Builder
	if len(s.groups) > 0 {
		b.WriteString("[network]\nallow = [\n")
		for _, g := range s.groups {
			fmt.Fprintf(&b, "  # %s: %d refused\n", g.domain, g.count)
			for _, e := range g.entries {
				fmt.Fprintf(&b, "  %q,\n", e)
			}
		}
		b.WriteString("]\n")
	}
	if len(s.notes) > 0 {
		b.WriteString("# Not suggested:\n")
		for _, n := range s.notes {
			fmt.Fprintf(&b, "#   %s\n", n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
