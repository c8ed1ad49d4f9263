package escape

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Targets are what the attempts aim at. Every attempt that needs no target
// is always made.
type Targets struct {
	// ReadFiles must not open for reading: /etc/shadow, another
	// sandbox's files, a world-readable file outside the binds.
	ReadFiles []string
	// WriteDirs must not accept a new file: /usr, the new root.
	WriteDirs []string
	// UnixSockets must not accept a connection: another sandbox's or the
	// daemon's control socket.
	UnixSockets []string
	// PIDs must be neither traced nor signalled: the parent, the shim.
	PIDs []int
	// Execs must not run. Tried last: a success replaces the process.
	Execs []string
}

// Result is one attempt. Err nil means the attempt SUCCEEDED: the jail has
// a hole.
type Result struct {
	Name string
	Err  error
}

// Attempts makes every attempt and reports each.
func Attempts(t Targets) []Result {
	var rs []Result
	try := func(name string, f func() error) {
		rs = append(rs, Result{Name: name, Err: f()})
	}
	for _, p := range t.ReadFiles {
		try("read "+p, func() error { return readFile(p) })
	}
	for _, d := range t.WriteDirs {
		try("create a file in "+d, func() error { return createIn(d) })
	}
	for _, p := range t.UnixSockets {
		try("connect to unix socket "+p, func() error { return dialUnix(p) })
	}
	for _, pid := range t.PIDs {
		s := strconv.Itoa(pid)
		try("ptrace attach pid "+s, func() error { return ptraceAttach(pid) })
		try("signal pid "+s, func() error { return unix.Kill(pid, 0) })
		try("pidfd_open pid "+s, func() error { return pidfdOpen(pid) })
	}
	try("mount a tmpfs", func() error { return unix.Mount("tmpfs", "/", "tmpfs", 0, "") })
	try("unshare a mount namespace", func() error { return unix.Unshare(unix.CLONE_NEWNS) })
	try("chroot", func() error { return unix.Chroot("/") })
	try("setuid 0", func() error { return syscall.Setuid(0) })
	try("setgid 0", func() error { return syscall.Setgid(0) })
	try("become dumpable", becomeDumpable)
	try("packet socket", func() error { return socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))) })
	try("raw IPv4 socket", func() error { return socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP) })
	try("raw IPv6 socket", func() error { return socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6) })
	try("unix socket", func() error { return socket(unix.AF_UNIX, unix.SOCK_STREAM, 0) })
	try("unix socketpair", socketpair)
	try("netlink socket", func() error { return socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE) })
	try("MPTCP socket", func() error { return socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP) })
	try("attach a BPF filter to a socket", attachFilter)
	try("map executable memory", mapExec)
	try("fork a process", fork)
	try("io_uring_setup", ioUringSetup)
	try("perf_event_open", perfEventOpen)
	try("add a key to a keyring", addKey)
	try("userfaultfd", userfaultfd)
	for _, p := range t.Execs {
		try("exec "+p, func() error { return unix.Exec(p, []string{p}, nil) })
	}
	return rs
}

func readFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	return f.Close()
}

func createIn(dir string) error {
	p := filepath.Join(dir, fmt.Sprintf(".moat-escape-%d", os.Getpid()))
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	os.Remove(p)
	return nil
}

func dialUnix(p string) error {
	c, err := net.DialTimeout("unix", p, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// ptraceAttach runs on one thread: the tracer is a thread, and only it can
// detach.
func ptraceAttach(pid int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceAttach(pid); err != nil {
		return err
	}
	var ws unix.WaitStatus
	unix.Wait4(pid, &ws, unix.WALL, nil)
	unix.PtraceDetach(pid)
	return nil
}

func pidfdOpen(pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

func becomeDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err != nil {
		return err
	}
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	return nil
}

func socket(domain, typ, proto int) error {
	fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

func socketpair() error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	unix.Close(fds[0])
	return unix.Close(fds[1])
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// attachFilter attaches an accept-all classic BPF program to a UDP socket,
// which any process may do unless seccomp stops it.
func attachFilter() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("creating the socket to attach to: %w", err)
	}
	defer unix.Close(fd)
	prog := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0xffff}}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]})
}

func mapExec() error {
	b, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	return unix.Munmap(b)
}

// fork makes a new process with clone(SIGCHLD), as fork(2) does. The child
// exits at once without returning to Go code.
func fork() error {
	pid, errno := rawFork()
	if errno != 0 {
		return errno
	}
	var ws unix.WaitStatus
	unix.Wait4(int(pid), &ws, 0, nil)
	return nil
}

//go:nosplit
//go:norace
func rawFork() (uintptr, syscall.Errno) {
	pid, _, errno := syscall.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	if errno == 0 && pid == 0 {
		// The child: a copy of one thread of a Go program, which must not
		// run the scheduler.
		syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	return pid, errno
}

func ioUringSetup() error {
	var params [120]byte // struct io_uring_params, zeroed: defaults
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return errno
	}
	return unix.Close(int(fd))
}

// perfEventOpen counts its own user-space CPU clock, which
// perf_event_paranoid 2 (the usual default) allows any process.
func perfEventOpen() error {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_CPU_CLOCK,
		Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

func addKey() error {
	id, err := unix.AddKey("user", "moat-escape", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
	if err != nil {
		return err
	}
	unix.KeyctlInt(unix.KEYCTL_REVOKE, id, 0, 0, 0)
	return nil
}

// userfaultfd asks for user-mode-only faults, which vm.unprivileged_userfaultfd
// 0 (the default) still allows any process.
func userfaultfd() error {
	const uffdUserModeOnly = 1
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|uffdUserModeOnly, 0, 0)
	if errno != 0 {
		return errno
	}
	return unix.Close(int(fd))
}
