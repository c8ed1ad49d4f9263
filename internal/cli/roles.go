package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"

	"github.com/pkg/sftp"

	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/guest"
	"moat.dev/moat/internal/image"
	"moat.dev/moat/internal/preset"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/userns"
)

// buildEnv carries the build of the moat that starts a daemon
// (moatVersion) to it: the daemon's moat-sandbox must be of the same build,
// since the two hand each other pipes, environment and state files in
// forms that only one build is sure to agree on.
const buildEnv = "MOAT_BUILD"

// sameBuild refuses a daemon whose moat was another build (cliBuild, from
// buildEnv; "" when it was not started by moat): a moat-sandbox left from
// an older install beside a new moat, say.
func sameBuild(cliBuild string) error {
	own := moatVersion()
	if cliBuild == own {
		return nil
	}
	exe, _ := os.Executable()
	if cliBuild == "" {
		return fmt.Errorf("%s __daemon is started by moat (moat up), never by hand", exe)
	}
	return fmt.Errorf("%s is build %s, but the moat that started it is build %s; moat and moat-sandbox must come from one build: install them together (sudo scripts/setup.sh builds all of moat's binaries into ./bin of its source tree)", exe, own, cliBuild)
}

// RoleMain runs one of the roles moat starts for a sandbox, named by
// args[1], and returns its exit code: the moat-sandbox binary's main
// (sandboxBinary). It never builds the command line, so the linker leaves
// moat's commands out of moat-sandbox, whose file every process of a
// sandbox maps: the daemon's keeper and gate process, the shim, and in
// the guest the init, agent and helpers.
func RoleMain(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "moat-sandbox runs the processes moat starts for a sandbox, never by hand; see: moat --help")
		return ExitUsage
	}
	switch args[1] {
	case "version", "--version":
		// Which build this is, for a person checking that it matches
		// moat's (`moat version`).
		fmt.Println("moat-sandbox", moatVersion())
		return ExitOK
	case "__init":
		return guest.Init()
	case "__shim":
		if len(args) < 3 {
			return ExitUsage
		}
		if err := runtime.Shim(args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "moat shim:", err)
			return ExitError
		}
		return ExitOK
	case "__sftp":
		// In the guest, as the session's user: the sftp subsystem
		// (scp, editors) on stdin and stdout.
		srv, err := sftp.NewServer(struct {
			io.Reader
			io.WriteCloser
		}{os.Stdin, os.Stdout})
		if err != nil {
			fmt.Fprintln(os.Stderr, "moat sftp:", err)
			return ExitError
		}
		if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintln(os.Stderr, "moat sftp:", err)
			return ExitError
		}
		return ExitOK
	case "__sockowner":
		// In the guest: which process owns a connection the gate holds.
		if len(args) < 3 {
			return ExitUsage
		}
		port, err := strconv.ParseUint(args[2], 10, 16)
		if err != nil {
			return ExitUsage
		}
		owner, err := guest.SockOwner(uint16(port))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return ExitError
		}
		fmt.Println(owner)
		return ExitOK
	case preset.SeedRole:
		// In the guest, as the session's user, in front of a preset's
		// agent: its first-run settings, then exec.
		return preset.SeedMain(args[2:], os.Stderr)
	case "__daemon":
		if len(args) < 3 {
			return ExitUsage
		}
		return daemonMain(args[2])
	case daemon.GateRole:
		if len(args) < 3 {
			return ExitUsage
		}
		// Rootless, the keeper starts it in a user namespace
		// (keeper.go): its maps first.
		if os.Getenv(userns.SyncEnv) != "" {
			if err := userns.Wait(syscall.SIGKILL); err != nil {
				fmt.Fprintln(os.Stderr, "moat gate:", err)
				return ExitError
			}
		}
		return gateMain(args[2])
	case removeRole:
		if len(args) < 3 {
			return ExitUsage
		}
		return removeMain(args[2])
	case image.Role:
		// A rootless image store's unpacking and removal.
		return image.RoleMain(args[2:])
	}
	fmt.Fprintf(os.Stderr, "moat-sandbox: %q is not a role of it; moat starts moat-sandbox for a sandbox, never by hand; see: moat --help\n", args[1])
	return ExitUsage
}
