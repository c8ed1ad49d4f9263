//go:build amd64 || arm64

package lockdown

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
)

// Apply jails the calling process as the package doc describes. The process
// must be root, built without cgo, and in a mount namespace of its own. On
// error the process is in an unknown, partly jailed state: exit.
func Apply(c Config) error {
	binds, err := c.validate()
	if err != nil {
		return err
	}
	// AllThreadsSyscall, which the per-thread steps need, cannot see
	// threads that C code started; the runtime refuses it in cgo binaries.
	if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_GETPID, 0, 0, 0); errno == unix.ENOTSUP {
		return fmt.Errorf("%w in a binary built with cgo: build it with CGO_ENABLED=0", ErrUnsupported)
	}
	// Everything below assumes a mount namespace of its own: in the
	// daemon's, pivot_root would swap the root of every process on the
	// host that shares it.
	if err := refuseSharedMountNS(); err != nil {
		return err
	}
	if err := refuseDirFDs(); err != nil {
		return err
	}
	// Made before anything changes, so a bad table costs nothing
	// (precompiled_linux.go).
	filter, err := filterFor(os.Getpid())
	if err != nil {
		return err
	}
	// The mount and chdir calls below act on the whole process, but
	// staying on one thread keeps the steps in order with no thread
	// created half way through.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := enterRoot(binds); err != nil {
		return fmt.Errorf("lockdown: %w", err)
	}
	if err := setLimits(c); err != nil {
		return fmt.Errorf("lockdown: %w", err)
	}
	if err := dropPrivileges(c.UID, c.GID, c.ParentDeathSignal); err != nil {
		return fmt.Errorf("lockdown: %w", err)
	}
	if err := installFilter(filter); err != nil {
		return fmt.Errorf("lockdown: %w", err)
	}
	return nil
}

// refuseSharedMountNS fails if the process is in its parent's mount
// namespace, that is, was not started with CLONE_NEWNS.
func refuseSharedMountNS() error {
	var self, parent unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &self); err != nil {
		return fmt.Errorf("lockdown: reading its mount namespace: %w", err)
	}
	// The parent's pid as /proc numbers it: os.Getppid is 0 in a pid
	// namespace of its own.
	ppid, err := procPPid()
	if err != nil {
		return fmt.Errorf("lockdown: finding its parent: %w", err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/mnt", ppid), &parent); err != nil {
		// A process in a user namespace of its own (rootless moat's gate)
		// may not read the namespaces of its parent outside it. A mount
		// namespace owned by the process's own user namespace is not the
		// parent's then: the parent's belongs to an ancestor.
		if errors.Is(err, unix.EACCES) && ownMountNS() {
			return nil
		}
		return fmt.Errorf("lockdown: reading the mount namespace of parent %d: %w", ppid, err)
	}
	if self.Dev == parent.Dev && self.Ino == parent.Ino {
		return fmt.Errorf("%w: the process shares its parent's mount namespace; start it with SysProcAttr.Cloneflags = CLONE_NEWNS", ErrConfig)
	}
	return nil
}

// ownMountNS reports whether this process's mount namespace belongs to
// its user namespace and that is not the host's (whose uid_map is the
// identity of every id).
func ownMountNS() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil || strings.Join(strings.Fields(string(b)), " ") == "0 0 4294967295" {
		return false
	}
	mnt, err := unix.Open("/proc/self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(mnt)
	owner, err := unix.IoctlRetInt(mnt, unix.NS_GET_USERNS)
	if err != nil {
		return false
	}
	defer unix.Close(owner)
	var o, self unix.Stat_t
	if unix.Fstat(owner, &o) != nil || unix.Stat("/proc/self/ns/user", &self) != nil {
		return false
	}
	return o.Dev == self.Dev && o.Ino == self.Ino
}

// procPPid reads the parent's pid from /proc/self/status.
func procPPid() (int, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no PPid in /proc/self/status")
}

// refuseDirFDs fails if the process holds an open directory: openat(fd,
// "..") from a directory outside the new root walks up the host's tree,
// past pivot_root and the detached old root alike. Closing such fds for the
// caller could break whatever holds them; refusing names the culprit.
func refuseDirFDs() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("lockdown: listing open fds to refuse directories among them: %w", err)
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		// EBADF: the fd ReadDir used, closed since.
		if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		return fmt.Errorf("%w: fd %d is an open directory (%s), from which the jailed process could walk out of its root; close it before Apply", ErrConfig, fd, target)
	}
	return nil
}

// Supported reports whether Apply can work in this binary on this kernel,
// without changing anything: for moat doctor, and for the daemon to refuse
// early with a reason rather than fail in the child.
func Supported() error {
	if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_GETPID, 0, 0, 0); errno == unix.ENOTSUP {
		return fmt.Errorf("%w in a binary built with cgo: build it with CGO_ENABLED=0", ErrUnsupported)
	}
	// An invalid fd gets EBADF (or EINVAL) from a kernel that has the
	// call, ENOSYS from one that does not.
	if _, err := unix.OpenTree(-1, "", 0); err == unix.ENOSYS {
		return fmt.Errorf("%w: the kernel lacks open_tree(2); Linux 5.2 or later is needed", ErrUnsupported)
	}
	for _, action := range []linux.BPFAction{linux.SECCOMP_RET_ERRNO, linux.SECCOMP_RET_KILL_PROCESS} {
		a := uint32(action)
		if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, linux.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&a))); errno != 0 {
			return fmt.Errorf("%w: the kernel's seccomp lacks action %#x (%v); Linux 4.14 or later with CONFIG_SECCOMP_FILTER is needed", ErrUnsupported, action, errno)
		}
	}
	return nil
}
