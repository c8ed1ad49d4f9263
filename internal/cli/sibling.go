package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Binaries installed beside moat (docs/architecture.md, "Moat's binaries").
// moat-gate and moat-docker hold libraries that no other binary may link,
// because each process pays the package init of everything its binary
// links. moat-sandbox holds the roles moat starts for a sandbox (RoleMain)
// without the command line, whose code and data the sandbox's processes
// would otherwise map: its keeper, gate process and shim, and the guest's
// init and agent.
const (
	gateBinary    = "moat-gate"    // the gate service: Prometheus's client
	dockerBinary  = "moat-docker"  // runtime = "docker": the Docker SDK
	sandboxBinary = "moat-sandbox" // a sandbox's own processes, and the guest's
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
		return "", codef(ExitHost, "%s is missing (expected at %s, beside the moat binary); copy it there from the build moat came from, or build all of moat's binaries into ./bin of its source tree with: sudo scripts/setup.sh",
			name, p)
	} else if err != nil {
		return "", withCode(ExitHost, fmt.Errorf("checking for %s: %w", name, err))
	}
	return p, nil
}

// sandboxExe is moat-sandbox: the binary moat hands to everything that
// runs one of its roles (RoleMain), so that a sandbox's processes, the
// guest's init and a suspended guest's saved binary are all one file. A
// moat-sandbox that moat cannot execute is refused here, with its path
// and the fix, rather than as a daemon that never reports ready.
func sandboxExe() (string, error) {
	p, err := sibling(sandboxBinary)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(p)
	if err == nil && !fi.Mode().IsRegular() {
		err = errors.New("not a regular file")
	}
	if err == nil {
		err = unix.Access(p, unix.X_OK)
	}
	if err != nil {
		return "", codef(ExitHost, "%s cannot be run (%v); it is built with moat: sudo scripts/setup.sh builds all of moat's binaries into ./bin of its source tree", p, err)
	}
	return p, nil
}
