package userns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Prereq is one thing a rootless sandbox needs from the host, as found
// for the user this process runs as (for moat doctor).
type Prereq struct {
	Name   string // "user namespaces", "/etc/subuid", ...
	OK     bool
	Detail string // what was found
	Fix    string // the exact command that fixes it, when not OK
}

// Check tests each prerequisite of Start with layout and of what the
// child does in the namespace (tap0, overlays) for the current user. It
// changes nothing; the two live probes run short children in user
// namespaces of their own.
func Check(layout Layout) []Prereq {
	var out []Prereq
	out = append(out, checkUserns())
	u, err := user.Current()
	if err != nil {
		out = append(out, Prereq{Name: "current user", Detail: err.Error(), Fix: "run moat as a user listed in /etc/passwd"})
		return out
	}
	for _, f := range []string{SubUIDFile, SubGIDFile} {
		p := Prereq{Name: f}
		uid, id := uint32(os.Getuid()), uint32(os.Getuid())
		if f == SubGIDFile {
			id = uint32(os.Getgid())
		}
		if _, err := mapFromFile(layout, id, f, u.Username, uid); err != nil {
			p.Detail, p.Fix = err.Error(), fixSubIDs(u.Username)
		} else {
			p.OK, p.Detail = true, "a range for "+u.Username
		}
		out = append(out, p)
	}
	for _, t := range []string{"newuidmap", "newgidmap"} {
		p := Prereq{Name: t}
		if path, err := idMapTool(t); err != nil {
			p.Detail, p.Fix = err.Error(), "as root: apt-get install uidmap"
		} else {
			p.OK, p.Detail = true, path+" is privileged"
		}
		out = append(out, p)
	}
	out = append(out, checkTun(), checkOverlay())
	return out
}

// checkUserns reads the sysctls that forbid user namespaces, then makes
// one: other limits (seccomp in a container, an LSM) show only then.
func checkUserns() Prereq {
	p := Prereq{Name: "user namespaces", Fix: fixDisabled}
	for _, s := range []struct{ path, bad string }{
		{"/proc/sys/user/max_user_namespaces", "0"},
		{"/proc/sys/kernel/unprivileged_userns_clone", "0"},
		{"/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"},
	} {
		b, err := os.ReadFile(s.path)
		if err == nil && strings.TrimSpace(string(b)) == s.bad {
			p.Detail = s.path + " is " + s.bad
			return p
		}
	}
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET}
	if err := cmd.Run(); err != nil {
		p.Detail = "creating user, mount and network namespaces: " + err.Error()
		return p
	}
	p.OK, p.Detail, p.Fix = true, "allowed for this user", ""
	return p
}

// checkTun: tap0 is made through /dev/net/tun, opened by root of the
// namespace, who is the user on the host: the device node's mode decides
// (udev makes it 0666 on Debian; a host without udev may leave it 0600).
func checkTun() Prereq {
	p := Prereq{Name: "/dev/net/tun"}
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		p.Detail = "cannot be opened by this user: " + err.Error()
		if errors.Is(err, os.ErrNotExist) {
			p.Fix = "as root: modprobe tun"
		} else {
			p.Fix = "as root: chmod 0666 /dev/net/tun (udev's default on Debian)"
		}
		return p
	}
	f.Close()
	p.OK, p.Detail = true, "can be opened by this user"
	return p
}

// checkOverlay mounts an overlay in a user namespace of its own, with
// util-linux's unshare and mount, on scratch directories.
func checkOverlay() Prereq {
	p := Prereq{Name: "overlay in a user namespace", Fix: "use a kernel of 5.11 or later (overlayfs in user namespaces)"}
	dir, err := os.MkdirTemp("", "moat-userns-check-")
	if err != nil {
		p.Detail, p.Fix = err.Error(), "make $TMPDIR writable"
		return p
	}
	defer os.RemoveAll(dir)
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		os.Mkdir(filepath.Join(dir, d), 0o700)
	}
	// userxattr: the option the shim needs in a user namespace (kernel
	// 5.11 on); without it overlayfs cannot record opaque directories.
	opts := fmt.Sprintf("lowerdir=%[1]s/lower,upperdir=%[1]s/upper,workdir=%[1]s/work,userxattr", dir)
	cmd := exec.Command("unshare", "--user", "--map-root-user", "--mount", "mount", "-t", "overlay", "overlay", "-o", opts, filepath.Join(dir, "merged"))
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		p.Detail = fmt.Sprintf("unshare … mount -t overlay: %v: %s", err, strings.TrimSpace(string(out)))
		return p
	}
	p.OK, p.Detail, p.Fix = true, "mountable", ""
	return p
}
