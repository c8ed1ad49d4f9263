package runtime

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/userns"
)

// ShimFD is the fd on which the shim sends the TAP fd to the daemon and
// then waits for ShimGo.
const ShimFD = 3

// ShimGo is the daemon's word to start the guest, once its gate runs.
const ShimGo = 'g'

// The fds after ShimFD of a shim that removes its daemon's groups
// (Plan.Reap, resources.Handover): a pidfd of the daemon, and the group
// lock, which it holds until the groups are gone.
const (
	ShimDaemonFD = 4
	ShimLockFD   = 5
)

// errDaemonGone is how a shim ends whose daemon died.
var errDaemonGone = errors.New("the daemon is gone: the guest is stopped")

// Shim runs in the fresh namespaces: it mounts the root filesystem,
// creates tap0, hands its fd to the daemon over ShimFD and runs the
// sandbox. It returns when the sandbox has exited, with an error unless it
// exited cleanly.
func Shim(planPath string) (err error) {
	// Started by an ordinary user's daemon in a user namespace: until
	// its maps are written this process's uid is unmapped and can do
	// nothing, not even read the plan.
	rootless := os.Getenv(userns.SyncEnv) != ""
	if rootless {
		if err := userns.Wait(syscall.SIGKILL); err != nil {
			return err
		}
	}
	p, err := ReadPlan(planPath)
	if err != nil {
		return err
	}
	p.Rootless = rootless
	// With the groups to remove, this shim outlives a killed daemon and
	// stops the guest itself (watchDaemon); the reap runs on every way
	// out once the daemon is gone.
	h := watchDaemon(p)
	defer func() {
		if h.isGone() {
			err = h.reap(p)
		}
	}()
	if rootless {
		// runsc's state of an earlier start belongs to the namespace's
		// root (a subordinate id): the daemon, as the user, could not
		// clear it, and a stale one makes `runsc run` fail.
		os.RemoveAll(RunscRoot(p.StateDir))
		if err := os.MkdirAll(RunscRoot(p.StateDir), 0o700); err != nil {
			return fmt.Errorf("creating runsc's root: %w", err)
		}
	}
	// Into the sandbox's cgroup before anything else, so that runsc's
	// sandbox and gofer are born inside it.
	if len(p.Cgroup) > 0 {
		if err := resources.Enter(p.Cgroup); err != nil {
			return err
		}
	}
	// A /proc of this PID namespace, so runsc's view of pids is its own.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	// tap0 while the root filesystem is mounted: neither needs the
	// other, and the disk image's mount made the shim's part of every
	// start longer by about as much as tap0 takes.
	type tap struct {
		fd  int
		err error
	}
	tapc := make(chan tap, 1)
	go func() {
		fd, err := CreateTAP()
		tapc <- tap{fd, err}
	}()
	rootPath, mounts, err := p.mountRootfs()
	t := <-tapc
	if err != nil {
		if t.err == nil {
			unix.Close(t.fd)
		}
		return fmt.Errorf("mounting root filesystem: %w", err)
	}
	tapFD, err := t.fd, t.err
	if err != nil {
		return fmt.Errorf("creating tap device: %w", err)
	}
	sendTap := func() error {
		defer unix.Close(tapFD)
		if err := unix.Sendmsg(ShimFD, []byte("tap"), unix.UnixRights(tapFD), nil, 0); err != nil {
			return fmt.Errorf("sending tap fd to the daemon: %w", err)
		}
		return nil
	}
	if !p.Standby {
		if err := sendTap(); err != nil {
			return err
		}
	}

	spec := p.ociSpec(rootPath, mounts)
	bundle := BundleDir(p.StateDir)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return fmt.Errorf("creating bundle: %w", err)
	}
	if err := writeSpec(filepath.Join(bundle, "config.json"), spec); err != nil {
		return err
	}
	if p.Standby {
		// runsc's sandbox made now, its restore left for the word; tap0
		// is sent after, which tells the daemon the shim is ready.
		if err := p.createSandbox(bundle); err != nil {
			unix.Close(tapFD)
			return err
		}
		if err := sendTap(); err != nil {
			return err
		}
	}
	// No guest before the daemon's gate runs: its word, or nothing when
	// it gave up (and its parent-death signal then ends this shim).
	word := make([]byte, 1)
	if n, err := unix.Read(ShimFD, word); n != 1 || word[0] != ShimGo {
		return fmt.Errorf("the daemon did not start the guest (%v)", err)
	}
	// The socket stays open for the daemon's later words (ShimSuspend),
	// but no runsc process may inherit it.
	unix.CloseOnExec(ShimFD)
	p.noteGuestBinary() // suspend_linux.go
	return superviseRunsc(p, bundle, h)
}

// runscEnv is the environment of the runsc processes the shim starts.
var runscEnv = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}

// StopGrace is how long the guest gets between SIGTERM and SIGKILL.
const StopGrace = 10 * time.Second

// sandboxPidFile is where runsc writes the sandbox's pid, in its bundle.
func sandboxPidFile(bundle string) string { return filepath.Join(bundle, "sandbox.pid") }

// superviseRunsc starts the sandbox with `runsc run --detach` and stays
// until it exits. The shim is PID 1 of its own PID namespace, so when it
// dies — also when the daemon dies and the parent-death signal kills it —
// the kernel kills every process in the namespace: runsc's sandbox and
// gofer; a shim with groups to remove (h) kills them itself when the
// daemon dies, and returns. runsc run alone would not do: it outlives a
// killed parent.
//
// Detached, runsc returns once the sandbox runs, and its sandbox and gofer
// are re-parented to the shim, which reaps them: the long-lived `runsc run`
// that would otherwise only wait costs about 7 MiB (PSS) per sandbox for
// nothing. SIGTERM asks the guest to stop (runsc kill TERM, run from inside
// this namespace, where runsc's recorded pids mean what they say), then
// kills it after StopGrace.
func superviseRunsc(p *Plan, bundle string, h *heir) error {
	env := runscEnv
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	pidFile := sandboxPidFile(bundle)
	verb := "run"
	args := []string{"run", "--detach", "--pid-file=" + pidFile, "--bundle=" + bundle, p.ID}
	if p.Restore != "" {
		verb = "restore"
		args = restoreArgs(p, pidFile, bundle)
	}
	run := exec.Command(p.Runsc, append(p.runscArgs(p.Debug), args...)...)
	run.Stdout, run.Stderr, run.Env = os.Stdout, os.Stderr, env
	t0 := time.Now()
	err := h.start(run)
	if err == nil {
		err = run.Wait()
	}
	if err == nil && p.Restore != "" {
		// Also for a daemon that died meanwhile: the guest ran, so its
		// image no longer matches its files.
		restored(p, time.Since(t0))
	}
	if h.isGone() {
		return errDaemonGone
	}
	if err != nil {
		if p.Restore != "" {
			return restoreFailed(p, err)
		}
		return fmt.Errorf("runsc %s: %w", verb, err)
	}
	b, err := os.ReadFile(pidFile)
	sandbox, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || sandbox <= 0 {
		return fmt.Errorf("reading the sandbox pid from %s: %v", pidFile, err)
	}
	words := readWords()
	checkpointed, released := false, false
	for {
		if ws, exited := reap(sandbox); exited {
			if checkpointed {
				// The daemon ends the shim as for a stop, once it has
				// recorded the suspend; its SIGTERM may have come first.
				if !released {
					waitRelease(sigs, words)
				}
				return nil
			}
			return sandboxExit(ws)
		}
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGTERM, syscall.SIGINT:
				if checkpointed {
					released = true // the guest is gone already: nothing to ask
					continue
				}
				kill := exec.Command(p.Runsc, append(p.runscArgs(false), "kill", p.ID, "TERM")...)
				kill.Stdout, kill.Stderr, kill.Env = os.Stdout, os.Stderr, env
				kill.Run()
				time.AfterFunc(StopGrace, func() { unix.Kill(-1, unix.SIGKILL) })
			}
		case <-h.done():
			return errDaemonGone
		case w, ok := <-words:
			if !ok {
				// The daemon closed its end: it stops us by signal, or
				// it is gone, which the heir sees too.
				words = nil
				continue
			}
			// Run here, not in a goroutine: reap must not take the
			// checkpoint's runsc from its Wait.
			checkpointed = answerWord(p, w, env) || checkpointed
		}
	}
}

// reap reaps every exited child (the sandbox, the gofer, runsc kill) and
// reports whether the sandbox was one of them.
func reap(sandbox int) (unix.WaitStatus, bool) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return 0, false
		}
		if pid == sandbox {
			return ws, true
		}
	}
}

func sandboxExit(ws unix.WaitStatus) error {
	switch {
	case ws.Signaled():
		return fmt.Errorf("runsc sandbox killed by %v", ws.Signal())
	case ws.ExitStatus() != 0:
		return fmt.Errorf("runsc sandbox exited with status %d", ws.ExitStatus())
	}
	return nil
}

// hostDirs are the host's system directories a host-image sandbox sees,
// each as the read-only lower layer of its own overlay. /var as a whole is
// fresh; only the package manager's state comes from the host, so that
// `sudo apt-get install` works inside and changes nothing outside.
var hostDirs = []string{"usr", "etc", "opt", "var/lib/dpkg", "var/lib/apt"}

// hostLinks are top-level entries that are symlinks on merged-/usr hosts
// (bin -> usr/bin); they are copied as symlinks, or overlaid when the host
// has real directories there.
var hostLinks = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// hiddenEtc are host files that hold secrets; the guest's /etc overlay
// hides them with whiteouts.
var hiddenEtc = []string{
	"shadow", "shadow-", "gshadow", "gshadow-", "security/opasswd",
	"ssl/private", "krb5.keytab", "sudoers.d/moat-host",
}

type bindMount struct {
	Source, Target string
	RW             bool
}

// mountRootfs builds the root filesystem in this (private) mount namespace
// and returns the root path and the bind mounts to place on it.
func (p *Plan) mountRootfs() (string, []bindMount, error) {
	if p.Disk {
		if err := p.mountDisk(); err != nil {
			return "", nil, err
		}
	}
	for _, d := range []string{p.upper(), p.work(), p.merged()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", nil, err
		}
	}
	if len(p.Layers) > 0 {
		root := filepath.Join(p.merged(), "root")
		lower := make([]string, len(p.Layers))
		for i, l := range p.Layers {
			lower[len(p.Layers)-1-i] = l
		}
		if err := overlay(strings.Join(lower, ":"), filepath.Join(p.upper(), "root"), filepath.Join(p.work(), "root"), root, p.Rootless); err != nil {
			return "", nil, err
		}
		for _, d := range []string{"proc", "sys", "dev", "tmp", "run", ".moat", "home"} {
			os.MkdirAll(filepath.Join(root, d), 0o755)
		}
		return root, nil, nil
	}

	root := p.rootDir()
	for _, d := range []string{"proc", "sys", "dev", "run", ".moat", "home", "var/lib/dpkg", "var/lib/apt", "var/cache", "var/log", "var/tmp", "usr", "etc", "opt", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", nil, err
		}
	}
	os.MkdirAll(filepath.Join(root, "tmp"), 0o1777)
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.Chmod(filepath.Join(root, "var/tmp"), 0o1777)
	os.Chmod(filepath.Join(root, "root"), 0o700)

	if p.Rootless {
		if err := copyUpForGuest("/", p.upper(), guestWrites); err != nil {
			return "", nil, err
		}
	}
	var mounts []bindMount
	dirs := append([]string{}, hostDirs...)
	for _, l := range hostLinks {
		fi, err := os.Lstat("/" + l)
		if err != nil {
			continue
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink("/" + l)
			if err != nil {
				return "", nil, err
			}
			dst := filepath.Join(root, l)
			if cur, err := os.Readlink(dst); err != nil || cur != target {
				os.Remove(dst)
				if err := os.Symlink(target, dst); err != nil {
					return "", nil, err
				}
			}
			continue
		}
		os.MkdirAll(filepath.Join(root, l), 0o755)
		dirs = append(dirs, l)
	}
	for _, d := range dirs {
		if fi, err := os.Stat("/" + d); err != nil || !fi.IsDir() {
			continue
		}
		upper := filepath.Join(p.upper(), d)
		if d == "etc" {
			if err := hideSecrets(upper); err != nil {
				return "", nil, err
			}
		}
		merged := filepath.Join(p.merged(), d)
		if err := overlay("/"+d, upper, filepath.Join(p.work(), d), merged, p.Rootless); err != nil {
			return "", nil, err
		}
		mounts = append(mounts, bindMount{Source: merged, Target: "/" + d, RW: true})
	}
	return root, mounts, nil
}

// hideSecrets puts overlay whiteouts (0/0 character devices) in the /etc
// upper layer for host files that hold secrets, unless the guest has
// written its own file there.
func hideSecrets(upper string) error {
	if err := os.MkdirAll(upper, 0o755); err != nil {
		return err
	}
	names := append([]string{}, hiddenEtc...)
	keys, _ := filepath.Glob("/etc/ssh/ssh_host_*_key")
	for _, k := range keys {
		names = append(names, strings.TrimPrefix(k, "/etc/"))
	}
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join("/etc", n)); err != nil {
			continue
		}
		dst := filepath.Join(upper, n)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := unix.Mknod(dst, unix.S_IFCHR|0o000, 0); err != nil {
			return fmt.Errorf("hiding /etc/%s: %w", n, err)
		}
	}
	return nil
}

// overlay mounts an overlay on target. In a user namespace (rootless) it
// needs userxattr: the trusted.* attributes overlayfs keeps its opaque
// directories in are root's only, and without the option removing a
// lower directory fails with EIO.
func overlay(lower, upper, work, target string, rootless bool) error {
	for _, d := range []string{upper, work, target} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// A work dir left over from a killed run can make the mount fail with
	// EBUSY on some kernels; its content is scratch by definition.
	os.RemoveAll(filepath.Join(work, "work"))
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if rootless {
		opts += ",userxattr"
	}
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting overlay on %s (%s): %w", target, opts, err)
	}
	return nil
}

// CreateTAP creates tap0 in this network namespace, configured as the
// guest's interface (the address is taken over by gVisor's netstack inside
// the sandbox), and returns its fd. The shim's; exported for the rootless
// recipe's test.
func CreateTAP() (int, error) {
	// No IPv6 in the sandbox's namespace: otherwise the kernel gives tap0
	// a link-local fe80:: address, gVisor copies it into the guest, and the
	// guest has an IPv6 path the gate never meant to offer (threat model 5).
	// The gate drops IPv6 frames anyway; this keeps the guest from trying.
	for _, k := range []string{"default", "all"} {
		err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return -1, fmt.Errorf("disabling IPv6 in the sandbox's network namespace: %w", err)
		}
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening /dev/net/tun (is the tun module loaded? try: modprobe tun): %w", err)
	}
	ifr, err := unix.NewIfreq("tap0")
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TUNSETIFF: %w", err)
	}
	if err := configureLinks(); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func configureLinks() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	tap, err := netlink.LinkByName("tap0")
	if err != nil {
		return fmt.Errorf("finding tap0: %w", err)
	}
	if err := netlink.LinkSetMTU(tap, netstack.MTU); err != nil {
		return fmt.Errorf("setting tap0 mtu: %w", err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: netstack.Guest.AsSlice(), Mask: net.CIDRMask(netstack.PrefixLen, 32)}}
	if err := netlink.AddrAdd(tap, addr); err != nil {
		return fmt.Errorf("adding tap0 address: %w", err)
	}
	if err := netlink.LinkSetUp(tap); err != nil {
		return fmt.Errorf("bringing tap0 up: %w", err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: tap.Attrs().Index, Gw: netstack.Gateway.AsSlice()}); err != nil {
		return fmt.Errorf("adding default route: %w", err)
	}
	// A permanent neighbour entry is copied into the sandbox by runsc, so
	// the guest never has to ARP for its gateway.
	if err := netlink.NeighAdd(&netlink.Neigh{
		LinkIndex:    tap.Attrs().Index,
		State:        netlink.NUD_PERMANENT,
		IP:           netstack.Gateway.AsSlice(),
		HardwareAddr: net.HardwareAddr(netstack.GatewayMAC),
	}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding gateway neighbour: %w", err)
	}
	return nil
}

// heir is a shim's watch on its daemon when the shim is to remove the
// daemon's groups (Plan.Reap). The daemon then starts it without a
// parent-death signal, so that it outlives a killed daemon, and the shim
// does what that signal's SIGKILL did: it kills every other process of
// its PID namespace the moment the daemon is gone. Two independent ways
// tell it: the daemon's pidfd becomes readable when the daemon has
// exited, however it went, and the daemon's end of the socket, which
// only the daemon holds and closes only after this shim has exited,
// hangs up. (The reaper this replaces checked its parent-death signal
// against a changed parent; the shim, PID 1 of its own namespace, always
// sees 0 as its parent, and a PID 1 would drop a signal that arrived
// before its runtime installed a handler, where a pidfd stays readable.)
// A nil heir does nothing: the shim has the parent-death SIGKILL.
type heir struct {
	daemonFD, sockFD int // the daemon's pidfd and the shim's end of its socket

	mu     sync.Mutex // orders the guest's start with the daemon's death
	gone   bool
	once   sync.Once
	doneCh chan struct{} // closed once gone, the namespace killed
}

// reapWait bounds the wait for the namespace's killed processes.
const reapWait = 5 * time.Second

// watchDaemon starts the shim's watch on its daemon, or returns nil for a
// plan without groups to remove.
func watchDaemon(p *Plan) *heir {
	if len(p.Reap) == 0 {
		return nil
	}
	unix.CloseOnExec(ShimDaemonFD)
	unix.CloseOnExec(ShimLockFD)
	if p.Rootless {
		// userns.Wait set the parent-death SIGKILL again after its
		// setuid; the daemon started this shim without one.
		unix.Prctl(unix.PR_SET_PDEATHSIG, 0, 0, 0, 0)
	}
	return newHeir(ShimDaemonFD, ShimFD)
}

// newHeir watches the daemon whose pidfd is daemonFD, and the socket
// sockFD to it.
func newHeir(daemonFD, sockFD int) *heir {
	h := &heir{daemonFD: daemonFD, sockFD: sockFD, doneCh: make(chan struct{})}
	go func() {
		for !h.poll(-1) {
		}
		h.fire()
	}()
	return h
}

// poll reports whether the daemon is gone, waiting up to timeoutMs for it
// (-1: until it is). A poll that fails for another reason than a signal
// says gone: the guest must not run on without a daemon watching it.
func (h *heir) poll(timeoutMs int) bool {
	fds := []unix.PollFd{
		{Fd: int32(h.daemonFD), Events: unix.POLLIN},
		{Fd: int32(h.sockFD), Events: unix.POLLRDHUP},
	}
	n, err := unix.Poll(fds, timeoutMs)
	if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
		return false
	}
	return err != nil || n > 0
}

// fire acts on the daemon's death, once: every other process of the
// namespace is killed, and the shim's reads of the daemon's words end.
func (h *heir) fire() {
	h.once.Do(func() {
		h.mu.Lock()
		h.gone = true
		// The daemon's end of the log pipe is gone too: a write to
		// stderr must fail, not end the shim before the groups are
		// removed.
		signal.Ignore(syscall.SIGPIPE)
		killNamespace()
		unix.Shutdown(h.sockFD, unix.SHUT_RDWR)
		h.mu.Unlock()
		close(h.doneCh)
	})
}

// isGone reports whether the daemon is gone, acting on it if the watch
// has not yet.
func (h *heir) isGone() bool {
	if h == nil {
		return false
	}
	if h.poll(0) {
		h.fire()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gone
}

// done is closed once the daemon is gone; nil (never) without a heir.
func (h *heir) done() <-chan struct{} {
	if h == nil {
		return nil
	}
	return h.doneCh
}

// start starts the guest's runsc unless the daemon is gone: under the
// lock, so the guest is either refused or started before fire kills it.
func (h *heir) start(cmd *exec.Cmd) error {
	if h == nil {
		return cmd.Start()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone {
		return errDaemonGone
	}
	return cmd.Start()
}

// reap ends a shim whose daemon is gone: it reaps the namespace's killed
// processes (bounded), then removes the groups (resources.Reap), logging
// into the daemon's log, whose pipe has no reader any more.
func (h *heir) reap(p *Plan) error {
	for deadline := time.Now().Add(reapWait); time.Now().Before(deadline); {
		killNamespace()
		pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
		if errors.Is(err, unix.ECHILD) {
			break
		}
		if pid <= 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	w := io.Writer(os.Stderr)
	if f, err := os.OpenFile(filepath.Join(p.StateDir, "daemon.log"), os.O_WRONLY|os.O_APPEND, 0); err == nil {
		defer f.Close()
		w = f
	}
	if err := resources.Reap(p.StateDir, p.Reap, w); err != nil {
		return fmt.Errorf("%w; %v", errDaemonGone, err)
	}
	return errDaemonGone
}

// killNamespace kills every process of the shim's PID namespace but the
// shim. Only as that namespace's PID 1: anywhere else kill(-1) would
// reach every process of the host.
func killNamespace() {
	if os.Getpid() == 1 {
		unix.Kill(-1, unix.SIGKILL)
	}
}
