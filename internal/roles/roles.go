// Package roles is the moat-sandbox binary: the processes moat starts for
// a sandbox, each named by its first argument (RoleMain). They are the
// daemon's keeper and its jailed gate process, the shim beside runsc, and
// in the guest the init with its agent, sftp and helpers, run from this
// file mounted into the guest.
//
// It is a package of its own, which never imports internal/cli, because
// every one of those processes maps the binary it runs from and runs the
// package initialisation of everything that binary links: moat's command
// line (cobra, its terminal UI, its tables) would be code, data and heap
// that none of them uses (docs/architecture.md, "Moat's binaries").
// cmd/moat's TestRolesSplit fails if moat-sandbox links internal/cli.
package roles

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
	"moat.dev/moat/internal/statefs"
	"moat.dev/moat/internal/userns"
)

// Exit codes of the roles: moat's own (internal/cli/exit.go, which
// documents them), the few a role can end with.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// DaemonRole is the daemon's keeper: `moat-sandbox __daemon DIR`, which
// moat up starts detached.
const DaemonRole = "__daemon"

// RoleMain runs one of the roles moat starts for a sandbox, named by
// args[1], and returns its exit code: the moat-sandbox binary's main.
func RoleMain(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "moat-sandbox runs the processes moat starts for a sandbox, never by hand; see: moat --help")
		return exitUsage
	}
	switch args[1] {
	case "version", "--version":
		// Which build this is, for a person checking that it matches
		// moat's (`moat version`).
		fmt.Println("moat-sandbox", MoatVersion())
		return exitOK
	case "__init":
		return guest.Init()
	case "__shim":
		if len(args) < 3 {
			return exitUsage
		}
		if err := runtime.Shim(args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "moat shim:", err)
			return exitError
		}
		return exitOK
	case "__sftp":
		// In the guest, as the session's user: the sftp subsystem
		// (scp, editors) on stdin and stdout.
		srv, err := sftp.NewServer(struct {
			io.Reader
			io.WriteCloser
		}{os.Stdin, os.Stdout})
		if err != nil {
			fmt.Fprintln(os.Stderr, "moat sftp:", err)
			return exitError
		}
		if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintln(os.Stderr, "moat sftp:", err)
			return exitError
		}
		return exitOK
	case "__sockowner":
		// In the guest: which process owns a connection the gate holds.
		if len(args) < 3 {
			return exitUsage
		}
		port, err := strconv.ParseUint(args[2], 10, 16)
		if err != nil {
			return exitUsage
		}
		owner, err := guest.SockOwner(uint16(port))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return exitError
		}
		fmt.Println(owner)
		return exitOK
	case preset.SeedRole:
		// In the guest, as the session's user, in front of a preset's
		// agent: its first-run settings, then exec.
		return preset.SeedMain(args[2:], os.Stderr)
	case DaemonRole:
		if len(args) < 3 {
			return exitUsage
		}
		return daemonMain(args[2])
	case daemon.GateRole:
		if len(args) < 3 {
			return exitUsage
		}
		// Rootless, the keeper starts it in a user namespace
		// (keeper.go): its maps first.
		if os.Getenv(userns.SyncEnv) != "" {
			if err := userns.Wait(syscall.SIGKILL); err != nil {
				fmt.Fprintln(os.Stderr, "moat gate:", err)
				return exitError
			}
		}
		return gateMain(args[2])
	case RemoveRole:
		if len(args) < 3 {
			return exitUsage
		}
		return removeMain(args[2])
	case statefs.Role:
		// Rootless, a fork's or a snapshot's files (internal/cli,
		// rootless.go): the namespace's maps first.
		if err := userns.Wait(syscall.SIGKILL); err != nil {
			fmt.Fprintln(os.Stderr, "moat:", err)
			return exitError
		}
		return statefs.Main(args[2:])
	case image.Role:
		// A rootless image store's unpacking and removal.
		return image.RoleMain(args[2:])
	}
	fmt.Fprintf(os.Stderr, "moat-sandbox: %q is not a role of it; moat starts moat-sandbox for a sandbox, never by hand; see: moat --help\n", args[1])
	return exitUsage
}

// RemoveRole removes a directory as root of a user namespace with the
// user's subordinate ids (`__userns-rm DIR`): what the shim and runsc
// leave in a rootless sandbox's state dir belongs to those ids, which
// the user can remove only from inside such a namespace.
const RemoveRole = "__userns-rm"

// removeMain is RemoveRole's main: first the namespace's maps, then the
// removal, with root's power over every id the namespace maps.
func removeMain(dir string) int {
	if err := userns.Wait(syscall.SIGKILL); err != nil {
		fmt.Fprintln(os.Stderr, "moat:", err)
		return exitError
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, "moat:", err)
		return exitError
	}
	return exitOK
}
