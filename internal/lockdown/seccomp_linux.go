//go:build amd64 || arm64

package lockdown

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
	"gvisor.dev/gvisor/pkg/bpf"
	"gvisor.dev/gvisor/pkg/seccomp"
)

// allow is one row of the seccomp allowlist: system calls permitted for one
// reason, with an argument rule or nil for any arguments.
type allow struct {
	why   string
	calls []uintptr
	rule  seccomp.SyscallRule
}

// allowTable is everything the jailed process may ask of the kernel: what a
// Go network server needs (runtime, netpoller, sockets, files in its binds),
// nothing that changes who it is or what it sees. Anything not here fails
// with EPERM. Rows for one architecture's legacy calls are in
// archAllowTable.
//
// Notable absences, each reached by default deny: execve/execveat and
// fork-like clone (no new programs or processes); mount, pivot_root, chroot,
// unshare, setns, the new mount API (no new view); set*id, setgroups,
// capset (no new identity); ptrace, process_vm_*, pidfd_*, kcmp (no
// reaching into other processes); bpf, perf_event_open, io_uring_*,
// userfaultfd, keyctl/add_key/request_key, *_module, kexec_*, reboot
// (kernel attack surface no server needs); open_by_handle_at (escapes a
// bind by inode handle); symlinkat, linkat, mknodat (would plant links or
// nodes in a writable bind that a privileged reader outside could follow);
// memfd_create, mlock, chown; socketpair and unix sockets (unix sockets
// arrive as fds from the parent).
func allowTable(pid int) []allow {
	return append([]allow{
		{"I/O on fds it holds: TAP, sockets, files, pipes",
			calls(unix.SYS_READ, unix.SYS_WRITE, unix.SYS_READV, unix.SYS_WRITEV,
				unix.SYS_PREAD64, unix.SYS_PWRITE64, unix.SYS_PREADV, unix.SYS_PWRITEV,
				unix.SYS_CLOSE, unix.SYS_LSEEK, unix.SYS_DUP, unix.SYS_DUP3), nil},
		{"fd flags and file locks; no leases, owners or dnotify, which reach other processes",
			calls(unix.SYS_FCNTL), fcntlRule()},
		{"ioctl only to ask whether an fd is a terminal and how many bytes wait on it; none that configures a device (the TAP)",
			calls(unix.SYS_IOCTL), anyOf(1, unix.TCGETS, unix.TIOCINQ)},
		{"Go's netpoller and gVisor's fd reader",
			calls(unix.SYS_EPOLL_CREATE1, unix.SYS_EPOLL_CTL, unix.SYS_EPOLL_PWAIT, unix.SYS_EPOLL_PWAIT2,
				unix.SYS_PPOLL, unix.SYS_PSELECT6, unix.SYS_EVENTFD2, unix.SYS_PIPE2), nil},
		{"new sockets: IPv4 and IPv6 TCP and UDP only (no unix, raw, packet, netlink, MPTCP)",
			calls(unix.SYS_SOCKET), inetSocketRule()},
		{"use of sockets it holds, including unix ones passed in",
			calls(unix.SYS_CONNECT, unix.SYS_BIND, unix.SYS_LISTEN, unix.SYS_ACCEPT4,
				unix.SYS_GETSOCKNAME, unix.SYS_GETPEERNAME, unix.SYS_GETSOCKOPT, unix.SYS_SETSOCKOPT,
				unix.SYS_SHUTDOWN, unix.SYS_SENDTO, unix.SYS_RECVFROM, unix.SYS_SENDMSG, unix.SYS_RECVMSG,
				unix.SYS_SENDMMSG, unix.SYS_RECVMMSG), nil},
		{"zero-copy paths Go's io.Copy takes between sockets and files",
			calls(unix.SYS_SPLICE, unix.SYS_SENDFILE, unix.SYS_COPY_FILE_RANGE), nil},
		{"files inside its binds (the mount namespace decides which exist)",
			calls(unix.SYS_OPENAT, unix.SYS_FSTAT, unix.SYS_NEWFSTATAT, unix.SYS_STATX, unix.SYS_STATFS,
				unix.SYS_FSTATFS, unix.SYS_GETDENTS64, unix.SYS_READLINKAT, unix.SYS_FACCESSAT,
				unix.SYS_FACCESSAT2, unix.SYS_MKDIRAT, unix.SYS_UNLINKAT, unix.SYS_RENAMEAT,
				unix.SYS_RENAMEAT2, unix.SYS_TRUNCATE, unix.SYS_FTRUNCATE, unix.SYS_FALLOCATE,
				unix.SYS_FSYNC, unix.SYS_FDATASYNC, unix.SYS_FCHMOD, unix.SYS_FCHMODAT,
				unix.SYS_UTIMENSAT, unix.SYS_FLOCK, unix.SYS_GETCWD, unix.SYS_CHDIR,
				unix.SYS_FCHDIR, unix.SYS_UMASK), nil},
		{"memory for the Go heap and stacks, never executable",
			calls(unix.SYS_MMAP, unix.SYS_MPROTECT), noExecRule()},
		{"memory release and the runtime's probes",
			calls(unix.SYS_MUNMAP, unix.SYS_MADVISE, unix.SYS_MINCORE, unix.SYS_BRK), nil},
		{"the runtime names its mappings (prctl PR_SET_VMA); no other prctl",
			calls(unix.SYS_PRCTL), seccomp.PerArg{seccomp.EqualTo(unix.PR_SET_VMA), seccomp.EqualTo(unix.PR_SET_VMA_ANON_NAME)}},
		{"threads for the Go runtime: clone with CLONE_THREAD and no namespace flags",
			calls(unix.SYS_CLONE), threadCloneRule()},
		{"thread and scheduler bookkeeping",
			calls(unix.SYS_FUTEX, unix.SYS_SCHED_YIELD, unix.SYS_SCHED_GETAFFINITY, unix.SYS_RSEQ,
				unix.SYS_SET_ROBUST_LIST, unix.SYS_RESTART_SYSCALL, unix.SYS_EXIT, unix.SYS_EXIT_GROUP), nil},
		{"signals the runtime uses for preemption and crashes, handled within the process",
			calls(unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK, unix.SYS_RT_SIGRETURN,
				unix.SYS_SIGALTSTACK, unix.SYS_RT_SIGPENDING), nil},
		{"signals sent only to itself",
			calls(unix.SYS_KILL, unix.SYS_TGKILL), seccomp.PerArg{seccomp.EqualTo(pid)}},
		{"clocks, sleeps and timers (profiling uses timer_create and setitimer)",
			calls(unix.SYS_CLOCK_GETTIME, unix.SYS_CLOCK_GETRES, unix.SYS_GETTIMEOFDAY,
				unix.SYS_CLOCK_NANOSLEEP, unix.SYS_NANOSLEEP, unix.SYS_TIMER_CREATE,
				unix.SYS_TIMER_SETTIME, unix.SYS_TIMER_GETTIME, unix.SYS_TIMER_DELETE,
				unix.SYS_SETITIMER, unix.SYS_GETITIMER, unix.SYS_TIMERFD_CREATE,
				unix.SYS_TIMERFD_SETTIME, unix.SYS_TIMERFD_GETTIME), nil},
		{"reading its own identity and the machine's",
			calls(unix.SYS_GETPID, unix.SYS_GETTID, unix.SYS_GETPPID, unix.SYS_GETUID,
				unix.SYS_GETEUID, unix.SYS_GETGID, unix.SYS_GETEGID, unix.SYS_GETGROUPS,
				unix.SYS_GETRESUID, unix.SYS_GETRESGID, unix.SYS_UNAME, unix.SYS_SYSINFO,
				unix.SYS_GETRUSAGE, unix.SYS_GETRANDOM, unix.SYS_GETCPU), nil},
		{"its own resource limits (they can only go down without privilege)",
			calls(unix.SYS_GETRLIMIT), nil},
		{"its own resource limits, not another process's",
			calls(unix.SYS_PRLIMIT64), seccomp.PerArg{seccomp.EqualTo(0)}},
	}, archAllowTable()...)
}

// denyFirst are calls whose row in allowTable would otherwise let these
// arguments through: attaching BPF programs to a socket (the kernel's BPF
// verifier and JIT, a long history of bugs) and kernel TLS or other
// upper-layer protocols (TCP_ULP, same). Go's net package sets neither.
func denyFirst() seccomp.SyscallRules {
	var rules []seccomp.SyscallRule
	for _, opt := range []uintptr{unix.SO_ATTACH_FILTER, unix.SO_ATTACH_BPF,
		unix.SO_ATTACH_REUSEPORT_CBPF, unix.SO_ATTACH_REUSEPORT_EBPF} {
		rules = append(rules, seccomp.PerArg{seccomp.AnyValue{}, seccomp.EqualTo(unix.SOL_SOCKET), seccomp.EqualTo(opt)})
	}
	rules = append(rules, seccomp.PerArg{seccomp.AnyValue{}, seccomp.EqualTo(unix.SOL_TCP), seccomp.EqualTo(unix.TCP_ULP)})
	return seccomp.MakeSyscallRules(map[uintptr]seccomp.SyscallRule{
		unix.SYS_SETSOCKOPT: seccomp.Or(rules),
	})
}

func calls(nrs ...uintptr) []uintptr { return nrs }

// anyOf matches when argument arg is one of values.
func anyOf(arg int, values ...uintptr) seccomp.SyscallRule {
	var or seccomp.Or
	for _, v := range values {
		var pa seccomp.PerArg // nil matchers match anything
		pa[arg] = seccomp.EqualTo(v)
		or = append(or, pa)
	}
	return or
}

func fcntlRule() seccomp.SyscallRule {
	return anyOf(1, unix.F_DUPFD, unix.F_DUPFD_CLOEXEC, unix.F_GETFD, unix.F_SETFD,
		unix.F_GETFL, unix.F_SETFL, unix.F_GETLK, unix.F_SETLK, unix.F_SETLKW,
		unix.F_OFD_GETLK, unix.F_OFD_SETLK, unix.F_OFD_SETLKW,
		unix.F_GETPIPE_SZ, unix.F_SETPIPE_SZ)
}

// inetSocketRule admits socket(AF_INET or AF_INET6, SOCK_STREAM or
// SOCK_DGRAM with any of SOCK_NONBLOCK|SOCK_CLOEXEC, protocol 0 or the
// matching TCP/UDP). Unix sockets are refused so a compromised gate cannot
// reach another sandbox's control socket or the daemon's even if a path
// leaked into its view; raw and packet sockets would see or forge host
// traffic; netlink would talk to the kernel's network configuration.
func inetSocketRule() seccomp.SyscallRule {
	typeMask := ^uintptr(unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC)
	var or seccomp.Or
	for _, domain := range []uintptr{unix.AF_INET, unix.AF_INET6} {
		for _, tp := range []struct{ typ, proto uintptr }{
			{unix.SOCK_STREAM, 0}, {unix.SOCK_STREAM, unix.IPPROTO_TCP},
			{unix.SOCK_DGRAM, 0}, {unix.SOCK_DGRAM, unix.IPPROTO_UDP},
		} {
			or = append(or, seccomp.PerArg{
				seccomp.EqualTo(domain),
				seccomp.MaskedEqual(typeMask, tp.typ),
				seccomp.EqualTo(tp.proto),
			})
		}
	}
	return or
}

// mptcpSocketRule matches socket(AF_INET or AF_INET6, SOCK_STREAM,
// IPPROTO_MPTCP).
func mptcpSocketRule() seccomp.SyscallRule {
	typeMask := ^uintptr(unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC)
	var or seccomp.Or
	for _, domain := range []uintptr{unix.AF_INET, unix.AF_INET6} {
		or = append(or, seccomp.PerArg{
			seccomp.EqualTo(domain),
			seccomp.MaskedEqual(typeMask, unix.SOCK_STREAM),
			seccomp.EqualTo(unix.IPPROTO_MPTCP),
		})
	}
	return or
}

// noExecRule admits mmap and mprotect without PROT_EXEC: Go never maps
// executable memory after start, so an attacker cannot either.
func noExecRule() seccomp.SyscallRule {
	return seccomp.PerArg{seccomp.AnyValue{}, seccomp.AnyValue{}, seccomp.MaskedEqual(unix.PROT_EXEC, 0)}
}

// namespaceFlags are clone flags that would give a thread a new view of the
// system. With CLONE_THREAD the kernel refuses most of them anyway; the
// filter does not rely on that.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// threadCloneRule admits clone only for a thread of this process: a new
// process could exec (were execve allowed) or escape the thread-wide
// filter's assumptions.
func threadCloneRule() seccomp.SyscallRule {
	return seccomp.PerArg{seccomp.MaskedEqual(unix.CLONE_THREAD|namespaceFlags, unix.CLONE_THREAD)}
}

// program builds the filter for a process whose pid is pid.
func program(pid int) seccomp.Program {
	allowed := seccomp.NewSyscallRules()
	for _, row := range allowTable(pid) {
		for _, nr := range row.calls {
			rule := row.rule
			if rule == nil {
				rule = seccomp.MatchAll{}
			}
			// Set panics on a call listed twice: one row per call keeps
			// the table readable as the whole truth.
			allowed.Set(nr, rule)
		}
	}
	return seccomp.Program{
		RuleSets: []seccomp.RuleSet{
			{Rules: denyFirst(), Action: seccomp.ReturnError.Code(uint16(unix.EPERM))},
			// clone3 answers ENOSYS, not EPERM, so code that tries it first
			// (os/exec, which is refused anyway) falls back to clone, whose
			// flags the filter can read; clone3's are behind a pointer.
			{Rules: seccomp.MakeSyscallRules(map[uintptr]seccomp.SyscallRule{unix.SYS_CLONE3: seccomp.MatchAll{}}),
				Action: seccomp.ReturnError.Code(uint16(unix.ENOSYS))},
			// Go's net package probes for MPTCP once and, from Go 1.24,
			// makes every listener MPTCP where it is available. MPTCP
			// is kernel surface the gate does not need; the answer a
			// kernel without it gives (EPROTONOSUPPORT) makes Go stop
			// asking, where EPERM would have it try again at every
			// Listen.
			{Rules: seccomp.MakeSyscallRules(map[uintptr]seccomp.SyscallRule{unix.SYS_SOCKET: mptcpSocketRule()}),
				Action: seccomp.ReturnError.Code(uint16(unix.EPROTONOSUPPORT))},
			{Rules: allowed, Action: seccomp.Allow},
		},
		Options: seccomp.ProgramOptions{
			DefaultAction: seccomp.ReturnError.Code(uint16(unix.EPERM)),
			// A call through another ABI (int 0x80 on amd64) has other
			// numbers; no Go code makes one, so it can only be an attack.
			BadArchAction: seccomp.KillProcess,
		},
	}
}

// buildFilter compiles the filter; it does not touch the process.
func buildFilter(pid int) ([]bpf.Instruction, error) {
	p := program(pid)
	instrs, _, err := p.Build()
	if err != nil {
		return nil, fmt.Errorf("building seccomp filter: %w", err)
	}
	return instrs, nil
}

// installFilter installs the filter on every thread (SECCOMP_FILTER_FLAG_TSYNC).
// It needs no_new_privs, which dropPrivileges has set on every thread.
//
// SECCOMP_FILTER_FLAG_LOG has the kernel log each refusal (an audit record
// of type 1326, SECCOMP, in the kernel log when no audit daemon runs) with
// the system call's number: a refusal is either a call the table lacks or
// an attack, and both should be seen. Kernels before 4.14 lack the flag and
// get the filter without it. gVisor's seccomp.SetFilter takes no flags, so
// the call is made here.
func installFilter(instrs []bpf.Instruction) error {
	prog := linux.SockFprog{
		Len:    uint16(len(instrs)),
		Filter: (*linux.BPFInstruction)(unsafe.Pointer(&instrs[0])),
	}
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_TSYNC | unix.SECCOMP_FILTER_FLAG_LOG)
	tid, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, linux.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&prog)))
	if errno == unix.EINVAL {
		flags &^= unix.SECCOMP_FILTER_FLAG_LOG
		tid, _, errno = unix.RawSyscall(unix.SYS_SECCOMP, linux.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&prog)))
	}
	runtime.KeepAlive(instrs)
	if errno != 0 {
		return fmt.Errorf("installing seccomp filter on all threads: %w", errno)
	}
	// With TSYNC, a positive return is a thread that could not take the
	// filter (seccomp(2)).
	if tid != 0 {
		return fmt.Errorf("installing seccomp filter: thread %d could not be synchronised", tid)
	}
	return nil
}
