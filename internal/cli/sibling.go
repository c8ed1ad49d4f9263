package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Binaries installed beside moat. Each holds libraries that moat itself
// must not link, because every moat process (the CLI, and a sandbox's
// keeper, gate process, reaper and shim) pays the package init of
// everything moat links (docs/architecture.md, "Three binaries").
const (
	gateBinary   = "moat-gate"   // the gate service: Prometheus's client
	dockerBinary = "moat-docker" // runtime = "docker": the Docker SDK
)

// sibling is the path of the binary called name in moat's own directory,
// moat's symlinks resolved: a moat linked into /usr/local/bin from its
// build directory finds the binaries built with it, never other ones on
// PATH that may be of another version.
func sibling(name string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the moat binary: %w", err)
	}
	if exe, err = filepath.EvalSymlinks(exe); err != nil {
		return "", fmt.Errorf("finding the moat binary: %w", err)
	}
	p := filepath.Join(filepath.Dir(exe), name)
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return "", codef(ExitHost, "%s is missing (expected at %s, beside the moat binary); copy it there from the build moat came from, or build all three binaries into ./bin of moat's source tree with: sudo scripts/setup.sh",
			name, p)
	} else if err != nil {
		return "", withCode(ExitHost, fmt.Errorf("checking for %s: %w", name, err))
	}
	return p, nil
}
