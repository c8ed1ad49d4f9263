// Command moat runs a command in a disposable gVisor sandbox whose only
// network exit is an egress gate outside it.
package main

import (
	"os"

	"moat.dev/moat/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args)) }
