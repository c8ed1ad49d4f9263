// Package lockdown jails the process that reads what a guest sends.
//
// The gate process parses bytes a hostile guest controls (Ethernet frames
// through gVisor's netstack, DNS, TLS, HTTP, SSH). A parser bug there must
// not become the host's problem, so the process calls [Apply] first thing in
// main, before it reads any untrusted input, and from then on it:
//
//   - sees only a fresh, read-only tmpfs root holding the paths it was given
//     ([Config.Binds]); nothing else of the host's file system, and no /proc,
//     /dev or /sys unless bound. Binds are nosuid, nodev and noexec, and
//     read-only unless [Bind.Writable];
//   - runs as the non-root [Config.UID] and [Config.GID] with no supplementary
//     groups, no capabilities in any set (bounding and ambient included),
//     no_new_privs, and not dumpable;
//   - has RLIMIT_NOFILE set to [Config.NoFile] and RLIMIT_CORE to 0;
//   - runs under a seccomp allowlist (see seccomp_linux.go's table) installed
//     on every thread: IPv4/IPv6 TCP and UDP sockets, files inside its binds,
//     memory, threads, timers and signals to itself. Everything else fails.
//
// A denied system call fails with EPERM; the process is not killed. The gate
// serves many connections and a sandbox's whole network: a library reaching
// for a call the table lacks (say a new Go runtime's) must cost one
// operation an error, not take the sandbox offline, and an attacker who can
// already issue arbitrary system calls can call exit_group anyway, so
// killing buys nothing against them. The only kill is for a system call made
// through another architecture's ABI (int 0x80 from an amd64 process), which
// no Go code does. Every refusal is logged by the kernel (an audit record
// of type 1326 naming the call's number), so a call the table lacks shows
// up in dmesg instead of as a mysterious error.
//
// The caller starts the process in its own mount namespace as root
// (SysProcAttr.Cloneflags = CLONE_NEWNS), built without cgo: Apply changes
// per-thread state (capabilities, no_new_privs, seccomp) on every thread with
// the Go runtime's AllThreadsSyscall, which cgo binaries do not support.
// Apply refuses, before changing anything, a cgo binary or an unsupported
// platform ([ErrUnsupported]), and a bad Config, a process in its parent's
// mount namespace, or one holding an open directory, whose fd would lead
// out of the new root ([ErrConfig]). Any other error leaves the process
// partly jailed: the caller must exit (fail closed). [Supported] answers
// the first question without changing anything, for moat doctor.
//
// After Apply the process cannot load files that Go's standard library reads
// lazily unless they are bound: the system's root certificates
// (x509.SystemCertPool), /etc/resolv.conf and /etc/hosts (the net package's
// resolver), /etc/localtime (time.Local). Load them before Apply, or bind
// them.
//
// [Verify] lets the privileged parent check from outside, through
// /proc/<pid>, that a child really is jailed before handing it anything.
package lockdown

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"syscall"
)

// Bind is a path of the host that stays visible in the jail, at the same
// absolute path. It may name a file or a directory.
type Bind struct {
	Path     string
	Writable bool
}

// Config is what the jailed process keeps.
type Config struct {
	// UID and GID are the ids the process runs as after Apply. Both must
	// be non-zero; the process keeps no supplementary groups.
	UID, GID int

	// Binds are the only paths of the host the process sees.
	Binds []Bind

	// NoFile is RLIMIT_NOFILE, soft and hard. Required: the gate holds a
	// socket per guest connection and this bounds what a guest can make
	// it hold.
	NoFile uint64

	// ParentDeathSignal, if non-zero, is set again as the process's
	// parent-death signal (PR_SET_PDEATHSIG) once it runs as UID: the
	// kernel clears it when the uid changes, so a SysProcAttr.Pdeathsig
	// given at start would otherwise be lost. Pass the same signal.
	ParentDeathSignal syscall.Signal

	// NProc, if non-zero, is RLIMIT_NPROC, soft and hard. Zero leaves it
	// as inherited. The limit counts every thread of every process of
	// the real uid, and seccomp already forbids new processes, so it only
	// caps the Go runtime's threads (one per goroutine blocked in a
	// system call). When the runtime cannot create a thread it crashes
	// the process, so set it only with a uid of its own and with room
	// to spare (hundreds, not tens).
	NProc uint64
}

// ErrUnsupported is returned where the jail cannot be built: it needs
// Linux's mount namespaces and seccomp, on an architecture whose system call
// table the filter knows, in a binary built without cgo.
var ErrUnsupported = errors.New("lockdown is not supported")

// ErrConfig marks a Config, or a process not set up for the jail, that
// Apply refuses before changing anything.
var ErrConfig = errors.New("cannot jail this process as configured")

// validate checks c and returns its binds sorted so that a directory is
// mounted before anything bound inside it.
func (c Config) validate() ([]Bind, error) {
	if c.UID <= 0 || c.GID <= 0 {
		return nil, fmt.Errorf("%w: uid %d and gid %d must both be positive (not root)", ErrConfig, c.UID, c.GID)
	}
	if c.NoFile == 0 {
		return nil, fmt.Errorf("%w: NoFile must be set (RLIMIT_NOFILE)", ErrConfig)
	}
	binds := append([]Bind(nil), c.Binds...)
	seen := make(map[string]bool, len(binds))
	for _, b := range binds {
		if !filepath.IsAbs(b.Path) || filepath.Clean(b.Path) != b.Path || b.Path == "/" {
			return nil, fmt.Errorf("%w: bind %q must be an absolute, clean path other than /", ErrConfig, b.Path)
		}
		if seen[b.Path] {
			return nil, fmt.Errorf("%w: bind %q given twice", ErrConfig, b.Path)
		}
		seen[b.Path] = true
	}
	// A parent sorts before its children ("/a" < "/a/b"), so when "/a/b"
	// is mounted, "/a" is already in place.
	sort.Slice(binds, func(i, j int) bool { return binds[i].Path < binds[j].Path })
	return binds, nil
}
