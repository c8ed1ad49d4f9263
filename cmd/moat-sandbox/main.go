// Command moat-sandbox holds the processes moat starts for a sandbox:
// the daemon (its keeper and jailed gate process), the shim beside
// runsc, and the guest's init, agent and helpers, which run from
// this file mounted into the guest. It is a binary of its own, without
// moat's command line, because each of those processes maps the file it
// runs from, and the command line's code and data are pages that none of
// them uses (docs/architecture.md, "Moat's binaries"); for the same reason
// it links internal/roles, never internal/cli.
package main

import (
	"os"

	"moat.dev/moat/internal/roles"
)

func main() { os.Exit(roles.RoleMain(os.Args)) }
