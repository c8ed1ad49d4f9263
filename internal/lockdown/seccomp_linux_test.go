//go:build amd64 || arm64

package lockdown

import (
	"testing"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
	"gvisor.dev/gvisor/pkg/bpf"
	"gvisor.dev/gvisor/pkg/seccomp"
)

const testPID = 4242

// verdict is what the filter answers: "allow", or the errno it returns, or
// "kill".
func verdict(t *testing.T, p bpf.Program, arch uint32, nr uintptr, args ...uint64) string {
	t.Helper()
	d := linux.SeccompData{Nr: int32(nr), Arch: arch}
	copy(d.Args[:], args)
	buf := make([]byte, d.SizeBytes())
	ret, err := bpf.Exec[bpf.NativeEndian](p, seccomp.DataAsBPFInput(&d, buf))
	if err != nil {
		t.Fatalf("running the filter: %v", err)
	}
	a := linux.BPFAction(ret)
	switch a & linux.SECCOMP_RET_ACTION_FULL {
	case linux.SECCOMP_RET_ALLOW:
		return "allow"
	case linux.SECCOMP_RET_ERRNO:
		return unix.ErrnoName(unix.Errno(a.Data()))
	case linux.SECCOMP_RET_KILL_PROCESS:
		return "kill"
	}
	return a.String()
}

func TestFilter(t *testing.T) {
	instrs, err := filterFor(testPID) // what Apply installs
	if err != nil {
		t.Fatal(err)
	}
	p, err := bpf.Compile(instrs, true)
	if err != nil {
		t.Fatal(err)
	}
	arch := uint32(seccomp.LINUX_AUDIT_ARCH)
	const (
		nb   = unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC
		goCl = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
			unix.CLONE_SYSVSEM | unix.CLONE_THREAD | unix.CLONE_SETTLS
	)
	tests := []struct {
		name string
		nr   uintptr
		args []uint64
		want string
	}{
		{"read", unix.SYS_READ, nil, "allow"},
		{"tcp socket", unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM | nb, 0}, "allow"},
		{"tcp6 socket, explicit protocol", unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_TCP}, "allow"},
		{"udp socket", unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_DGRAM | nb, 0}, "allow"},
		{"udp over tcp protocol", unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_TCP}, "EPERM"},
		{"unix socket", unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM | nb, 0}, "EPERM"},
		{"raw socket", unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP}, "EPERM"},
		{"packet socket", unix.SYS_SOCKET, []uint64{unix.AF_PACKET, unix.SOCK_RAW, 0x300}, "EPERM"},
		{"netlink socket", unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, 0}, "EPERM"},
		{"mptcp socket, as a kernel without it answers", unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM | nb, unix.IPPROTO_MPTCP}, "EPROTONOSUPPORT"},
		{"mptcp6 socket", unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, "EPROTONOSUPPORT"},
		{"unix socket claiming mptcp", unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, "EPERM"},
		{"socket type with high bits", unix.SYS_SOCKET, []uint64{unix.AF_INET, 1<<32 | unix.SOCK_STREAM, 0}, "EPERM"},
		{"go thread", unix.SYS_CLONE, []uint64{goCl}, "allow"},
		{"fork", unix.SYS_CLONE, []uint64{uint64(unix.SIGCHLD)}, "EPERM"},
		{"vfork-style clone", unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_VFORK | uint64(unix.SIGCHLD)}, "EPERM"},
		{"thread in a new net namespace", unix.SYS_CLONE, []uint64{goCl | unix.CLONE_NEWNET}, "EPERM"},
		{"clone3 falls back", unix.SYS_CLONE3, nil, "ENOSYS"},
		{"heap mmap", unix.SYS_MMAP, []uint64{0, 4096, unix.PROT_READ | unix.PROT_WRITE}, "allow"},
		{"exec mmap", unix.SYS_MMAP, []uint64{0, 4096, unix.PROT_READ | unix.PROT_EXEC}, "EPERM"},
		{"exec mprotect", unix.SYS_MPROTECT, []uint64{0, 4096, unix.PROT_EXEC}, "EPERM"},
		{"guard mprotect", unix.SYS_MPROTECT, []uint64{0, 4096, unix.PROT_NONE}, "allow"},
		{"kill self", unix.SYS_KILL, []uint64{testPID, uint64(unix.SIGQUIT)}, "allow"},
		{"kill other", unix.SYS_KILL, []uint64{1, uint64(unix.SIGKILL)}, "EPERM"},
		{"tgkill self", unix.SYS_TGKILL, []uint64{testPID, testPID + 1, uint64(unix.SIGURG)}, "allow"},
		{"tgkill other", unix.SYS_TGKILL, []uint64{1, 1, uint64(unix.SIGURG)}, "EPERM"},
		{"prctl vma name", unix.SYS_PRCTL, []uint64{unix.PR_SET_VMA, unix.PR_SET_VMA_ANON_NAME}, "allow"},
		{"prctl dumpable", unix.SYS_PRCTL, []uint64{unix.PR_SET_DUMPABLE, 1}, "EPERM"},
		{"prlimit self", unix.SYS_PRLIMIT64, []uint64{0, unix.RLIMIT_NOFILE}, "allow"},
		{"prlimit other", unix.SYS_PRLIMIT64, []uint64{1, unix.RLIMIT_NOFILE}, "EPERM"},
		{"setsockopt nodelay", unix.SYS_SETSOCKOPT, []uint64{3, unix.SOL_TCP, unix.TCP_NODELAY}, "allow"},
		{"setsockopt attach filter", unix.SYS_SETSOCKOPT, []uint64{3, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER}, "EPERM"},
		{"setsockopt attach bpf", unix.SYS_SETSOCKOPT, []uint64{3, unix.SOL_SOCKET, unix.SO_ATTACH_BPF}, "EPERM"},
		{"setsockopt tcp ulp", unix.SYS_SETSOCKOPT, []uint64{3, unix.SOL_TCP, unix.TCP_ULP}, "EPERM"},
		{"fcntl setfl", unix.SYS_FCNTL, []uint64{3, unix.F_SETFL}, "allow"},
		{"fcntl setown", unix.SYS_FCNTL, []uint64{3, unix.F_SETOWN}, "EPERM"},
		{"fcntl lease", unix.SYS_FCNTL, []uint64{3, unix.F_SETLEASE}, "EPERM"},
		{"ioctl tcgets", unix.SYS_IOCTL, []uint64{2, unix.TCGETS}, "allow"},
		{"ioctl tunsetiff", unix.SYS_IOCTL, []uint64{3, unix.TUNSETIFF}, "EPERM"},
		{"ioctl tiocsti", unix.SYS_IOCTL, []uint64{0, unix.TIOCSTI}, "EPERM"},
		{"execve", unix.SYS_EXECVE, nil, "EPERM"},
		{"ptrace", unix.SYS_PTRACE, nil, "EPERM"},
		{"x32 read", unix.SYS_READ | 0x40000000, nil, "EPERM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := verdict(t, p, arch, tt.nr, tt.args...); got != tt.want {
				t.Errorf("%s%v: got %s, want %s", tt.name, tt.args, got, tt.want)
			}
		})
	}
	t.Run("other architecture", func(t *testing.T) {
		if got := verdict(t, p, unix.AUDIT_ARCH_I386, unix.SYS_READ); got != "kill" {
			t.Errorf("a call through another ABI: got %s, want kill", got)
		}
	})
}

// TestTableOmits guards the table against a row that lets one of these in:
// each would undo part of the jail or open kernel surface no server needs.
func TestTableOmits(t *testing.T) {
	forbidden := map[string]uintptr{
		"execve": unix.SYS_EXECVE, "execveat": unix.SYS_EXECVEAT,
		"mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2, "pivot_root": unix.SYS_PIVOT_ROOT,
		"chroot": unix.SYS_CHROOT, "open_tree": unix.SYS_OPEN_TREE, "move_mount": unix.SYS_MOVE_MOUNT,
		"fsopen": unix.SYS_FSOPEN, "fsmount": unix.SYS_FSMOUNT, "mount_setattr": unix.SYS_MOUNT_SETATTR,
		"unshare": unix.SYS_UNSHARE, "setns": unix.SYS_SETNS,
		"ptrace": unix.SYS_PTRACE, "process_vm_readv": unix.SYS_PROCESS_VM_READV,
		"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV, "kcmp": unix.SYS_KCMP,
		"pidfd_open": unix.SYS_PIDFD_OPEN, "pidfd_getfd": unix.SYS_PIDFD_GETFD,
		"pidfd_send_signal": unix.SYS_PIDFD_SEND_SIGNAL,
		"setuid":            unix.SYS_SETUID, "setgid": unix.SYS_SETGID, "setreuid": unix.SYS_SETREUID,
		"setregid": unix.SYS_SETREGID, "setresuid": unix.SYS_SETRESUID, "setresgid": unix.SYS_SETRESGID,
		"setfsuid": unix.SYS_SETFSUID, "setfsgid": unix.SYS_SETFSGID, "setgroups": unix.SYS_SETGROUPS,
		"capset": unix.SYS_CAPSET, "bpf": unix.SYS_BPF, "perf_event_open": unix.SYS_PERF_EVENT_OPEN,
		"io_uring_setup": unix.SYS_IO_URING_SETUP, "io_uring_enter": unix.SYS_IO_URING_ENTER,
		"io_uring_register": unix.SYS_IO_URING_REGISTER, "userfaultfd": unix.SYS_USERFAULTFD,
		"keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY, "request_key": unix.SYS_REQUEST_KEY,
		"init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE,
		"delete_module": unix.SYS_DELETE_MODULE, "kexec_load": unix.SYS_KEXEC_LOAD,
		"kexec_file_load": unix.SYS_KEXEC_FILE_LOAD, "reboot": unix.SYS_REBOOT,
		"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT, "name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT,
		"symlinkat": unix.SYS_SYMLINKAT, "linkat": unix.SYS_LINKAT, "mknodat": unix.SYS_MKNODAT,
		"socketpair": unix.SYS_SOCKETPAIR, "memfd_create": unix.SYS_MEMFD_CREATE,
		"seccomp": unix.SYS_SECCOMP, "personality": unix.SYS_PERSONALITY,
		"fchown": unix.SYS_FCHOWN, "fchownat": unix.SYS_FCHOWNAT, "mlock": unix.SYS_MLOCK,
		"sethostname": unix.SYS_SETHOSTNAME, "swapon": unix.SYS_SWAPON, "acct": unix.SYS_ACCT,
		"quotactl": unix.SYS_QUOTACTL, "syslog": unix.SYS_SYSLOG, "fanotify_init": unix.SYS_FANOTIFY_INIT,
		"landlock_create_ruleset": unix.SYS_LANDLOCK_CREATE_RULESET,
	}
	for _, row := range allowTable(testPID) {
		for _, nr := range row.calls {
			for name, bad := range forbidden {
				if nr == bad {
					t.Errorf("allowTable row %q allows %s", row.why, name)
				}
			}
		}
	}
}
