// Command moat-kube is the Kubernetes API's side of moat's runtime =
// "kubernetes": moat runs it to claim a sandbox, run a command in it,
// read its audit records and release it (internal/kubert). It is a
// binary of its own so that moat does not link client-go, whose package
// init every moat process would pay (cmd/moat/deps_test.go).
package main

import (
	"os"

	"moat.dev/moat/internal/kubert/engine"
)

// version is set by scripts/setup.sh (-X main.version=...).
var version = "dev"

func main() { os.Exit(engine.Main(os.Args, version)) }
