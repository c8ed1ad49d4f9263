package userns

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Config is what Start needs: the two maps and the helpers that write
// them.
type Config struct {
	User           string // for errors
	UIDMap, GIDMap []IDMap
	NewUIDMap      string // path of newuidmap
	NewGIDMap      string // path of newgidmap
}

// Current is the Config for the user this process runs as, with layout,
// from /etc/subuid, /etc/subgid and the helpers on PATH (or in /usr/bin).
func Current(layout Layout) (*Config, error) {
	u, err := user.Current()
	if err != nil {
		return nil, fmt.Errorf("looking up the current user: %w", err)
	}
	// The gid this process runs with (after newgrp, not always the
	// passwd entry's): newgidmap lets it map only its own.
	cu := *u
	cu.Gid = strconv.Itoa(os.Getgid())
	return ConfigFor(&cu, layout, SubUIDFile, SubGIDFile)
}

// ConfigFor is the Config for u with the given subordinate id files.
func ConfigFor(u *user.User, layout Layout, subuidFile, subgidFile string) (*Config, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s has the non-numeric uid %q", u.Username, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s has the non-numeric gid %q", u.Username, u.Gid)
	}
	c := &Config{User: u.Username}
	if c.UIDMap, err = mapFromFile(layout, uint32(uid), subuidFile, u.Username, uint32(uid)); err != nil {
		return nil, err
	}
	// /etc/subgid is keyed by user too (name or uid), not by group.
	if c.GIDMap, err = mapFromFile(layout, uint32(gid), subgidFile, u.Username, uint32(uid)); err != nil {
		return nil, err
	}
	if c.NewUIDMap, err = idMapTool("newuidmap"); err != nil {
		return nil, err
	}
	if c.NewGIDMap, err = idMapTool("newgidmap"); err != nil {
		return nil, err
	}
	return c, nil
}

// Gate is c for a process that needs capabilities over its own mount
// namespace but must run, and create files, as the user (the jailed gate
// process, which then drops them and takes its uid as its gid too): the
// user's uid onto itself, and the user's gid at inside id uid. It maps no
// subordinate uid, so nothing the process does can touch the files of
// the sandbox's namespace, which belong to them. It does map one
// subordinate gid, at nogroup's id: newgidmap denies setgroups(2) in a
// namespace whose map names none (its fix for CVE-2018-7169), and lockdown
// clears the supplementary groups with it.
func (c *Config) Gate(uid, gid uint32) *Config {
	own := *c
	own.UIDMap = []IDMap{{Inside: uid, Outside: uid, Count: 1}}
	own.GIDMap = []IDMap{{Inside: uid, Outside: gid, Count: 1}}
	spare := uint32(65534)
	if uid == spare {
		spare--
	}
	for _, m := range c.GIDMap {
		if m.Outside != gid {
			own.GIDMap = append(own.GIDMap, IDMap{Inside: spare, Outside: m.Outside, Count: 1})
			break
		}
	}
	return &own
}

func mapFromFile(layout Layout, id uint32, file, name string, uid uint32) ([]IDMap, error) {
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist; %s", ErrNoSubIDs, file, fixSubIDs(name))
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	defer f.Close()
	ranges, err := ParseSubIDs(f, file, name, uid)
	if err != nil {
		return nil, err
	}
	if len(ranges) == 0 {
		return nil, fmt.Errorf("%w: %s has no range for user %s; %s", ErrNoSubIDs, file, name, fixSubIDs(name))
	}
	return Maps(layout, id, ranges, file, name)
}

// idMapTool finds newuidmap or newgidmap: on PATH, else where Debian
// installs it (a daemon's PATH may be minimal).
func idMapTool(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		p = "/usr/bin/" + name
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("%w: %s is not installed; as root: apt-get install uidmap", ErrNoIDMapTool, name)
	}
	if !privileged(p, fi) {
		return "", fmt.Errorf("%w: %s is neither setuid root nor has file capabilities, so it cannot write a map; as root: apt-get install --reinstall uidmap (or chmod u+s %s)",
			ErrNoIDMapTool, p, p)
	}
	return p, nil
}

// privileged: setuid root (Debian), or file capabilities (some
// distributions ship newuidmap with cap_setuid instead).
func privileged(path string, fi fs.FileInfo) bool {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 && fi.Mode()&fs.ModeSetuid != 0 {
		return true
	}
	n, err := unix.Getxattr(path, "security.capability", nil)
	return err == nil && n > 0
}

// SyncEnv names, in the child's environment, the fd of its end of the
// socket it waits on.
const SyncEnv = "MOAT_USERNS_SYNC"

// The two words on the sync socket.
const (
	wordMapped = 'm' // parent → child: both maps are written
	wordArmed  = 'a' // child → parent: uid 0, and its parent-death signal is set
)

// readyTimeout bounds the wait for the child's word: a Go binary's start
// on a loaded two-core host, with margin.
const readyTimeout = 30 * time.Second

// Start starts cmd in a new user namespace with c's maps, and in the
// namespaces of cmd.SysProcAttr.Cloneflags and Unshareflags (mount,
// network, PID: they then belong to the new user namespace). It returns
// once the maps are written and the child, which must call Wait first,
// runs as uid 0 of the namespace; on an error it kills the child. The
// child's Pdeathsig, if set, holds: Wait sets it again after its setuid,
// which clears it.
func (c *Config) Start(cmd *exec.Cmd) error {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("creating the user namespace's sync socket: %w", err)
	}
	ours := os.NewFile(uintptr(pair[0]), "userns-sync")
	theirs := os.NewFile(uintptr(pair[1]), "userns-sync-child")
	defer ours.Close()
	fd := 3 + len(cmd.ExtraFiles)
	cmd.ExtraFiles = append(cmd.ExtraFiles, theirs)
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, SyncEnv+"="+strconv.Itoa(fd))
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
	// Until the maps are written the child's uid is unmapped, so its exec
	// would drop every capability the clone gave it in the new namespace;
	// as ambient capabilities they survive the exec.
	caps, err := allCaps()
	if err != nil {
		theirs.Close()
		return err
	}
	cmd.SysProcAttr.AmbientCaps = caps
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		// What clone(CLONE_NEWUSER) returns when the host forbids it:
		// EPERM (a sysctl, an LSM, seccomp), ENOSPC (max_user_namespaces),
		// EUSERS (nesting). An exec that fails says EACCES or ENOENT.
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EUSERS) {
			return fmt.Errorf("%w: starting %s in a user namespace: %v; %s", ErrDisabled, cmd.Path, err, fixDisabled)
		}
		return fmt.Errorf("starting %s in a user namespace: %w", cmd.Path, err)
	}
	if err := c.handshake(ours, cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	return nil
}

// handshake writes the maps of the child pid (which exists from the clone
// on, exec or not), tells it, and waits for its answer.
func (c *Config) handshake(sync *os.File, pid int) error {
	// The two helpers are independent: run together, the second's exec
	// is not added to every start.
	errs := make(chan error, 2)
	for _, m := range []struct {
		tool string
		maps []IDMap
	}{{c.NewUIDMap, c.UIDMap}, {c.NewGIDMap, c.GIDMap}} {
		go func() {
			var stderr bytes.Buffer
			run := exec.Command(m.tool, args(pid, m.maps)...)
			run.Stderr = &stderr
			run.WaitDelay = time.Second
			if err := run.Run(); err != nil {
				errs <- fmt.Errorf("%w: %s %s: %v: %s (it checks the ranges against /etc/subuid and /etc/subgid for user %s)",
					ErrNoIDMapTool, m.tool, strings.Join(run.Args[1:], " "), err, strings.TrimSpace(stderr.String()), c.User)
				return
			}
			errs <- nil
		}()
	}
	if err := cmp.Or(<-errs, <-errs); err != nil {
		return err
	}
	if _, err := sync.Write([]byte{wordMapped}); err != nil {
		return fmt.Errorf("telling the child its maps are written: %w", err)
	}
	sync.SetReadDeadline(time.Now().Add(readyTimeout))
	b := make([]byte, 1)
	if n, err := sync.Read(b); n != 1 || b[0] != wordArmed {
		return fmt.Errorf("the child in the user namespace did not get ready (it must call userns.Wait first; its error is on its stderr): %v", err)
	}
	return nil
}

// Wait is the first thing a child started by Start does: it blocks until
// the parent has written the maps, becomes uid 0 and gid 0 of the
// namespace where it maps them (with KeepIDs it starts as the user's ids;
// with Gate it stays the user), sets the
// parent-death signal sig (0: none) and tells the parent. It then has
// every capability in the namespace. It fails, and the child should
// exit, if the parent went away first.
func Wait(sig syscall.Signal) error {
	fd, err := strconv.Atoi(os.Getenv(SyncEnv))
	if err != nil {
		return fmt.Errorf("%s is not set: this process was not started by userns.Start", SyncEnv)
	}
	os.Unsetenv(SyncEnv)
	sync := os.NewFile(uintptr(fd), "userns-sync")
	defer sync.Close()
	b := make([]byte, 1)
	if n, err := sync.Read(b); n != 1 || b[0] != wordMapped {
		return fmt.Errorf("the parent did not write the user namespace's maps (%v)", err)
	}
	// A namespace that maps no id 0 (Gate) keeps the user's ids: its
	// capabilities are the ambient ones the exec kept.
	if mapsZero("/proc/self/gid_map") && (os.Getgid() != 0 || os.Getegid() != 0) {
		if err := syscall.Setresgid(0, 0, 0); err != nil {
			return fmt.Errorf("becoming gid 0 of the user namespace: %w", err)
		}
	}
	if mapsZero("/proc/self/uid_map") && (os.Getuid() != 0 || os.Geteuid() != 0) {
		if err := syscall.Setresuid(0, 0, 0); err != nil {
			return fmt.Errorf("becoming uid 0 of the user namespace: %w", err)
		}
	}
	// The setuid above (KeepIDs) cleared the parent-death signal, as any
	// change of euid does; the exec did not (ambient capabilities do not
	// make it a secure exec). Set it before telling the parent: a parent
	// that died before this never reads the word, and the write fails;
	// one that dies after takes the child with it.
	if sig != 0 {
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(sig), 0, 0, 0); err != nil {
			return fmt.Errorf("setting the parent-death signal: %w", err)
		}
	}
	if _, err := sync.Write([]byte{wordArmed}); err != nil {
		return fmt.Errorf("telling the parent the child is ready (the parent is gone?): %w", err)
	}
	return nil
}

// Inside reports whether this process runs in a user namespace other
// than the host's, whose uid_map is the identity of every id.
func Inside() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false
	}
	return strings.Join(strings.Fields(string(b)), " ") != "0 0 4294967295"
}

// mapsZero reports whether the map file (/proc/self/uid_map) maps
// inside id 0.
func mapsZero(file string) bool {
	b, err := os.ReadFile(file)
	if err != nil {
		return true // as before maps were optional: Setresuid says what is wrong
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "0" {
			return true
		}
	}
	return false
}

// allCaps are the capability numbers this kernel has.
func allCaps() ([]uintptr, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return nil, fmt.Errorf("reading the kernel's last capability: %w", err)
	}
	last, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || last < 0 || last > 63 {
		return nil, fmt.Errorf("/proc/sys/kernel/cap_last_cap holds %q", b)
	}
	caps := make([]uintptr, last+1)
	for i := range caps {
		caps[i] = uintptr(i)
	}
	return caps, nil
}

const fixDisabled = "as root, allow them: sysctl -w user.max_user_namespaces=15000 (and kernel.unprivileged_userns_clone=1 where that setting exists, " +
	"kernel.apparmor_restrict_unprivileged_userns=0 on hosts that restrict them with AppArmor)"
