package agent

import (
	"os/exec"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Children lets the agent share its process with PID 1. PID 1 must reap
// every orphan that the kernel re-parents to it, but a blanket wait4(-1)
// would also reap the agent's own session processes, whose exit statuses
// the sessions need (and whose process group ids they keep reserved, by
// not reaping, until the group is killed). Children keeps the set of
// processes the agent started, and Reap reaps every exited child that is
// not one of them.
//
// Why share at all: the agent in a process of its own costs a second exec
// of the moat binary inside gVisor, where every page a Go program touches
// on start-up is a fault the Sentry serves: about a tenth of a second of
// each cold start on a 2-core systrap host, and a second Go heap and
// address space (a systrap stub) for as long as the sandbox lives.
//
// A nil *Children is valid and does nothing: the agent then runs as an
// ordinary process (tests, or beside another init) and never reaps what it
// did not start.
type Children struct {
	// starting is held for reading while the agent starts a child and
	// records it, and for writing by Reap, so Reap never sees a child that
	// exists but is not recorded yet.
	starting sync.RWMutex

	mu    sync.Mutex
	owned map[int]bool // guarded by mu
}

// NewChildren returns an empty set.
func NewChildren() *Children { return &Children{owned: map[int]bool{}} }

// start starts cmd and records its process as the agent's.
func (c *Children) start(cmd *exec.Cmd) error {
	if c == nil {
		return cmd.Start()
	}
	c.starting.RLock()
	defer c.starting.RUnlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	c.mu.Lock()
	c.owned[cmd.Process.Pid] = true
	c.mu.Unlock()
	return nil
}

// done forgets pid once its session has reaped it, and reaps what may have
// queued behind it.
func (c *Children) done(pid int) {
	if c == nil {
		return
	}
	c.mu.Lock()
	delete(c.owned, pid)
	c.mu.Unlock()
	c.Reap()
}

// Reap reaps every exited child that the agent did not start. PID 1 calls
// it on SIGCHLD. It stops at the first exited child that the agent owns:
// waitid keeps returning that one until its session reaps it, and the
// session calls Reap again when it has.
func (c *Children) Reap() {
	c.starting.Lock()
	defer c.starting.Unlock()
	for {
		pid := exitedChild()
		if pid <= 0 {
			return
		}
		c.mu.Lock()
		own := c.owned[pid]
		c.mu.Unlock()
		if own {
			return
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil {
			return
		}
	}
}

// exitedChild returns the pid of an exited, not yet reaped child without
// reaping it, or 0 when there is none.
func exitedChild() int {
	// siginfo_t for SIGCHLD: si_pid follows si_signo, si_errno, si_code
	// and padding to 8 bytes. x/sys/unix's Siginfo keeps the union opaque.
	var info struct {
		signo, errno, code, _ int32
		pid                   int32
		_                     [108]byte
	}
	// Zeroed pid distinguishes "no child has exited" (WNOHANG), as
	// waitid(2) advises.
	_, _, e := unix.Syscall6(unix.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&info)),
		unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, 0, 0)
	if e != 0 {
		return 0
	}
	return int(info.pid)
}
