//go:build linux

package rootless

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/userns"
)

// The test binary plays two more roles, chosen by roleEnv: the parent
// (the daemon's part: run as the unprivileged user, or as root for the
// comparison) and the child (the shim's part, inside the namespaces).
const (
	roleEnv  = "ROOTLESS_ROLE"
	modeEnv  = "ROOTLESS_MODE" // "rootless" or "root"
	stateEnv = "ROOTLESS_STATE"
	wsEnv    = "ROOTLESS_WS"
	runscEnv = "ROOTLESS_RUNSC"
	uidEnv   = "ROOTLESS_GUEST_UID" // a second file is written as this guest uid
	debugEnv = "ROOTLESS_DEBUG"
	keepEnv  = "ROOTLESS_KEEP_IDS" // userns.KeepIDs instead of RootIsUser
	// For finding out by hand what breaks (see /work/notes/rootless.md):
	// runsc flags to drop from runtime.RunscArgs, and flags to add.
	dropEnv  = "ROOTLESS_RUNSC_DROP"
	extraEnv = "ROOTLESS_RUNSC_EXTRA"
	probeEnv = "ROOTLESS_GUEST_PROBE" // shell run in the guest first, output on stderr
	layerEnv = "ROOTLESS_LAYER"       // a user-owned lower layer, mounted at /opt
)

// udpPort and payload: what the guest sends to the gateway over tap0,
// which the parent must read from the TAP fd.
const (
	udpPort = 9 // discard
	payload = "moat-rootless"
)

// report is what the parent prints on stdout for the test.
type report struct {
	MappedMS float64 `json:"mapped_ms"` // Start returned (rootless: maps written)
	TapMS    float64 `json:"tap_ms"`    // the TAP fd arrived
	FrameMS  float64 `json:"frame_ms"`  // the guest's datagram was read from the TAP fd
	ExitMS   float64 `json:"exit_ms"`   // the child (and runsc) exited
	Frame    string  `json:"frame"`     // what was read
}

func roleMain(role string) int {
	var err error
	switch role {
	case "parent":
		err = parentMain()
	case "child":
		err = childMain()
	case "check":
		err = json.NewEncoder(os.Stdout).Encode(userns.Check(userns.KeepIDs))
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
		return 1
	}
	return 0
}

// parentMain starts the child in new PID, mount and network namespaces
// (and, rootless, a user namespace through userns.Start), receives tap0's
// fd as the daemon does, lets the guest start and reads its datagram
// from the TAP fd.
func parentMain() error {
	t0 := time.Now()
	ms := func() float64 { return float64(time.Since(t0).Microseconds()) / 1000 }
	rootless := os.Getenv(modeEnv) == "rootless"

	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	ours := os.NewFile(uintptr(pair[0]), "shim-ours")
	theirs := os.NewFile(uintptr(pair[1]), "shim-theirs")
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// The parent-death signal follows the thread that forked the child.
	goruntime.LockOSThread()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"=child")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{theirs} // fd 3: runtime.ShimFD
	// As daemon.startShim sets them: userns.Start adds CLONE_NEWUSER to
	// the clone, so the PID namespace and the two unshared ones belong to
	// the new user namespace.
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:   syscall.CLONE_NEWPID,
		Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET,
		Pdeathsig:    syscall.SIGKILL,
	}
	if rootless {
		layout := userns.RootIsUser
		if os.Getenv(keepEnv) != "" {
			layout = userns.KeepIDs
		}
		cfg, err := userns.Current(layout)
		if err != nil {
			return err
		}
		err = cfg.Start(cmd)
	} else {
		err = cmd.Start()
	}
	theirs.Close()
	if err != nil {
		return err
	}
	var r report
	r.MappedMS = ms()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	tapFD, err := recvTAP(ours)
	if err != nil {
		cmd.Process.Kill()
		return fmt.Errorf("receiving the TAP fd: %w (child: %v)", err, <-exited)
	}
	defer unix.Close(tapFD)
	r.TapMS = ms()
	if _, err := ours.Write([]byte{runtime.ShimGo}); err != nil {
		return err
	}
	frame, err := readDatagram(tapFD, 60*time.Second, exited)
	if err != nil {
		cmd.Process.Kill()
		return fmt.Errorf("reading the guest's datagram from the TAP fd: %w", err)
	}
	r.FrameMS, r.Frame = ms(), frame
	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("child: %w", err)
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		return fmt.Errorf("the child did not exit within 60 s of the guest's datagram")
	}
	r.ExitMS = ms()
	return json.NewEncoder(os.Stdout).Encode(r)
}

func recvTAP(f *os.File) (int, error) {
	f.SetReadDeadline(time.Now().Add(30 * time.Second))
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	buf := make([]byte, 16)
	oob := make([]byte, unix.CmsgSpace(4))
	var oobn int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		_, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
		return !errors.Is(rerr, unix.EAGAIN)
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return -1, fmt.Errorf("no fd in the message (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return -1, fmt.Errorf("no fd in the message (%v)", err)
	}
	return fds[0], nil
}

// readDatagram reads Ethernet frames from the TAP fd until one carries the
// guest's UDP datagram to the gateway, within limit, or until the child
// exits.
func readDatagram(fd int, limit time.Duration, exited <-chan error) (string, error) {
	deadline := time.Now().Add(limit)
	buf := make([]byte, 65536)
	seen := 0
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return "", fmt.Errorf("the child exited (%v) after %d frames, none the guest's datagram", err, seen)
		default:
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 100)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return "", err
		}
		if n == 0 {
			continue
		}
		n, err = unix.Read(fd, buf)
		if err != nil {
			return "", err
		}
		seen++
		if s, ok := udpTo(buf[:n], netstack.Gateway.AsSlice(), udpPort); ok {
			return s, nil
		}
	}
	return "", fmt.Errorf("no datagram to %s:%d among %d frames", netstack.Gateway, udpPort, seen)
}

// udpTo reports whether frame is an IPv4 UDP datagram to dst:port, and
// describes it.
func udpTo(frame []byte, dst net.IP, port uint16) (string, bool) {
	const eth = 14
	if len(frame) < eth+20+8 || binary.BigEndian.Uint16(frame[12:14]) != 0x0800 {
		return "", false
	}
	ip := frame[eth:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[9] != 17 || !net.IP(ip[16:20]).Equal(dst) || len(ip) < ihl+8 {
		return "", false
	}
	udp := ip[ihl:]
	if binary.BigEndian.Uint16(udp[2:4]) != port {
		return "", false
	}
	return fmt.Sprintf("%s -> %s:%d %q", net.IP(ip[12:16]), dst, port, udp[8:]), true
}

// childMain is the shim's part: in the namespaces, mount /proc and an
// overlay of the host's /usr, create tap0 and hand its fd to the parent,
// then run the guest under runsc with the sandbox network stack.
func childMain() error {
	rootless := os.Getenv(modeEnv) == "rootless"
	if rootless {
		if err := userns.Wait(syscall.SIGKILL); err != nil {
			return err
		}
	}
	state, ws, runsc := os.Getenv(stateEnv), os.Getenv(wsEnv), os.Getenv(runscEnv)
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	tapFD, err := runtime.CreateTAP()
	if err != nil {
		return fmt.Errorf("creating tap device: %w", err)
	}
	root, usr, opt, err := mountRoot(state, os.Getenv(layerEnv), rootless)
	if err != nil {
		return err
	}
	if err := unix.Sendmsg(runtime.ShimFD, []byte("tap"), unix.UnixRights(tapFD), nil, 0); err != nil {
		return fmt.Errorf("sending tap fd: %w", err)
	}
	unix.Close(tapFD)
	word := make([]byte, 1)
	if n, err := unix.Read(runtime.ShimFD, word); n != 1 || word[0] != runtime.ShimGo {
		return fmt.Errorf("the parent did not start the guest (%v)", err)
	}
	unix.Close(runtime.ShimFD)

	guestUID, _ := strconv.Atoi(os.Getenv(uidEnv))
	bundle := runtime.BundleDir(state)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(guestSpec(root, usr, opt, ws, guestUID), "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return err
	}
	var args []string
	for _, a := range runtime.RunscArgs(state, "", os.Getenv(debugEnv) != "") {
		if !slices.Contains(strings.Fields(os.Getenv(dropEnv)), a) {
			args = append(args, a)
		}
	}
	// As the shim does (superviseRunsc): run --detach, then stay as PID 1
	// reaping runsc's sandbox and gofer until the sandbox exits.
	pidFile := filepath.Join(bundle, "sandbox.pid")
	args = append(append(args, strings.Fields(os.Getenv(extraEnv))...), "run", "--detach", "--pid-file="+pidFile, "--bundle="+bundle, "rootless")
	run := exec.Command(runsc, args...)
	run.Stdout, run.Stderr = os.Stderr, os.Stderr
	run.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if err := run.Run(); err != nil {
		return fmt.Errorf("runsc %v: %w", args, err)
	}
	b, err = os.ReadFile(pidFile)
	sandbox, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || sandbox <= 0 {
		return fmt.Errorf("reading the sandbox pid from %s: %v", pidFile, err)
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("waiting for the sandbox: %w", err)
		}
		if pid == sandbox {
			if ws.Signaled() {
				return fmt.Errorf("the sandbox was killed by %v", ws.Signal())
			}
			if ws.ExitStatus() != 0 {
				return fmt.Errorf("the sandbox exited with status %d", ws.ExitStatus())
			}
			return nil
		}
	}
}

// mountRoot builds a root like moat's host image, smaller: an empty
// root with merged-/usr links and two overlays, each to be bound into the
// guest: the host's /usr (lower owned by the host's root) at /usr, and a
// layer the user made (as an image layer extracted by the user) at /opt.
func mountRoot(state, layer string, rootless bool) (root, usr, opt string, err error) {
	root = filepath.Join(state, "root")
	for _, d := range []string{"proc", "sys", "dev", "tmp", "usr", "opt", "etc", "ws"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", "", "", err
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(root, l)); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", "", "", err
		}
	}
	usr, opt = filepath.Join(state, "merged", "usr"), filepath.Join(state, "merged", "opt")
	for _, o := range []struct{ lower, name, target string }{{"/usr", "usr", usr}, {layer, "opt", opt}} {
		upper, work := filepath.Join(state, "upper", o.name), filepath.Join(state, "work", o.name)
		for _, d := range []string{upper, work, o.target} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return "", "", "", err
			}
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", o.lower, upper, work)
		if rootless {
			// In a user namespace overlayfs cannot set its trusted.*
			// xattrs: without userxattr, removing a lower directory
			// (whiteout + opaque dir) fails with EIO.
			opts += ",userxattr"
		}
		if err := unix.Mount("overlay", o.target, "overlay", 0, opts); err != nil {
			return "", "", "", fmt.Errorf("mounting overlay on %s (%s): %w", o.target, opts, err)
		}
	}
	return root, usr, opt, nil
}

// guestSpec follows internal/runtime's ociSpec (unexported there) for what
// matters here: the same namespaces, the netns holding tap0, no cgroup.
// The guest replaces a directory of the user's layer (a whiteout and an
// opaque directory in the overlay's upper layer), writes two files in the
// workspace, as root and as guestUID, then sends a datagram to the
// gateway over tap0.
func guestSpec(root, usr, opt, ws string, guestUID int) *specs.Spec {
	script := fmt.Sprintf(`(%[5]s) >&2 2>&1 || true
set -e
rm -r /opt/d
mkdir /opt/d
test ! -e /opt/d/b
echo root > /ws/as-root
setpriv --reuid=%[1]d --regid=%[1]d --clear-groups sh -c 'echo user > /ws/as-guest-user' || echo "guest uid %[1]d cannot write the workspace"
echo %[2]s > /dev/udp/%[3]s/%[4]d
`, guestUID, payload, netstack.Gateway, udpPort, cmp.Or(os.Getenv(probeEnv), ":"))
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: []string{"/usr/bin/bash", "-c", script},
			Env:  []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:  "/",
			// gVisor's capabilities, as moat's spec gives its guest root:
			// setpriv needs CAP_SETUID.
			Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
		},
		Root:     &specs.Root{Path: root},
		Hostname: "rootless",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/usr", Type: "bind", Source: usr, Options: []string{"rbind", "rw"}},
			{Destination: "/opt", Type: "bind", Source: opt, Options: []string{"rbind", "rw"}},
			{Destination: "/ws", Type: "bind", Source: ws, Options: []string{"rbind", "nosuid", "nodev", "rw"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: "/proc/self/ns/net"},
			},
		},
	}
}

var caps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID", "CAP_NET_RAW", "CAP_SYS_ADMIN"}
