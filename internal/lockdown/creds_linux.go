//go:build amd64 || arm64

package lockdown

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setLimits sets the resource limits; it runs while still root so hard
// limits may be raised as well as lowered.
func setLimits(c Config) error {
	// syscall.Setrlimit, not unix's: for NOFILE it also updates the limit
	// the runtime remembers for child processes.
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: c.NoFile, Max: c.NoFile}); err != nil {
		return fmt.Errorf("setting RLIMIT_NOFILE to %d (above the current hard limit needs CAP_SYS_RESOURCE): %w", c.NoFile, err)
	}
	// No core file: it would hold whatever secrets the process had in
	// memory, written wherever the host's core_pattern says.
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("setting RLIMIT_CORE to 0: %w", err)
	}
	if c.NProc != 0 {
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: c.NProc, Max: c.NProc}); err != nil {
			return fmt.Errorf("setting RLIMIT_NPROC to %d: %w", c.NProc, err)
		}
	}
	return nil
}

// maxCaps bounds the probe for the highest capability number the kernel
// knows (40 in 6.x); capabilities are numbered in two 32-bit words.
const maxCaps = 64

// dropPrivileges turns the root process into uid/gid with no capabilities
// at all. Capability sets and no_new_privs are per thread, so each change is
// made on every thread of the Go runtime (AllThreadsSyscall); the set*id
// calls of package syscall already do that.
func dropPrivileges(uid, gid int, deathSig syscall.Signal) error {
	ppid := os.Getppid()
	// The bounding set first, while CAP_SETPCAP is still held: with it
	// empty, nothing (a setuid file, a file capability) can give a
	// capability back.
	for cp := 0; cp < maxCaps; cp++ {
		if _, _, errno := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_READ, uintptr(cp), 0); errno == unix.EINVAL {
			break // past the last capability this kernel knows
		}
		if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(cp), 0); errno != 0 {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", cp, errno)
		}
	}
	if _, _, errno := syscall.AllThreadsSyscall6(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); errno != 0 {
		return fmt.Errorf("clearing ambient capabilities: %w", errno)
	}
	if _, _, errno := syscall.AllThreadsSyscall6(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); errno != 0 {
		return fmt.Errorf("setting no_new_privs: %w", errno)
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("dropping supplementary groups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("setting gid %d: %w", gid, err)
	}
	// Leaving uid 0 for good clears the permitted, effective and ambient
	// sets (SECBIT_KEEP_CAPS is not set); the inheritable set stays.
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setting uid %d: %w", uid, err)
	}
	// The uid change cleared the parent-death signal. It is per thread,
	// and any thread holding it brings the signal, so all get it back.
	if deathSig != 0 {
		if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, uintptr(deathSig), 0); errno != 0 {
			return fmt.Errorf("setting the parent-death signal again: %w", errno)
		}
		// A parent that died while it was cleared sent nothing.
		if os.Getppid() != ppid {
			return fmt.Errorf("the parent (pid %d) exited while the parent-death signal was cleared", ppid)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return fmt.Errorf("clearing inheritable capabilities: %w", errno)
	}
	// Not dumpable: /proc/<pid> belongs to root, so another process of the
	// same uid (another sandbox's gate, if the uid is shared) can neither
	// ptrace this one nor read its memory. The flag is per process.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing the dumpable flag: %w", err)
	}
	return nil
}
