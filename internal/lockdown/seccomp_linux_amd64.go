package lockdown

import (
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/seccomp"
)

// archAllowTable adds amd64's own calls to allowTable.
func archAllowTable() []allow {
	return []allow{
		{"legacy calls x/sys and gVisor still make on amd64",
			calls(unix.SYS_DUP2, unix.SYS_POLL, unix.SYS_EPOLL_WAIT, unix.SYS_TIME), nil},
		{"a new thread sets its own TLS base (the runtime's settls)",
			calls(unix.SYS_ARCH_PRCTL), seccomp.PerArg{seccomp.EqualTo(archSetFS)}},
	}
}

// archSetFS is ARCH_SET_FS from asm/prctl.h, which x/sys/unix lacks.
const archSetFS = 0x1002
