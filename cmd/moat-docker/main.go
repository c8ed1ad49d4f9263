// Command moat-docker is the Docker engine's side of moat's runtime =
// "docker": moat runs it for each engine operation and reads its result
// as JSON. It is a binary of its own so that moat does not link the
// Docker SDK, whose package init every moat process would pay
// (docs/architecture.md, "Moat's binaries").
package main

import (
	"os"

	"moat.dev/moat/internal/dockerrt/engine"
)

// version is set by scripts/setup.sh (-X main.version=...).
var version = "dev"

func main() { os.Exit(engine.Main(os.Args, version)) }
