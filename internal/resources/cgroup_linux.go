package resources

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/runsc/cgroup"
)

// GroupFile is the group's record in the sandbox's state directory: what a
// later daemon (or `moat up`) needs to remove a group that a killed daemon
// left. On disk: frozen.
const GroupFile = "cgroup.json"

// DaemonGroupFile is the daemon group's record beside GroupFile, for the
// same reason. On disk: frozen.
const DaemonGroupFile = "cgroup-daemon.json"

// Group is a sandbox's cgroup, and its daemon's beside it.
type Group struct {
	cg   cgroup.Cgroup
	v2   bool
	path string   // what runsc gets as linux.cgroupsPath
	lock *os.File // the group lock (reaper_linux.go), held from Create to Release

	daemon    cgroup.Cgroup // the daemon group; nil in a group loaded from an old record
	leave     func()        // moves the daemon back to where it came from (JoinDaemon)
	origin    cgroup.Cgroup // where the daemon came from, for its shim (Handover)
	originErr error         // why there is no origin
}

// groupID names the group: the sandbox's name, for a person reading
// /sys/fs/cgroup, and a hash of its state dir, so that two MOAT_HOMEs with
// a sandbox of the same name never share one.
func groupID(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return filepath.Base(stateDir) + "-" + hex.EncodeToString(sum[:4])
}

// HostPids is the host's pids.max for a sandbox whose guest may have
// pidsMax processes (its RLIMIT_NPROC). The guest's limit must be the one
// that bites: under systrap each guest process costs host tasks too (its
// stub), and a sentry that cannot make a thread dies with the whole
// sandbox, as a fork bomb showed. So the host's is a backstop: twice the
// guest's plus 512 for the sentry's, the gofer's and the shim's threads.
func HostPids(pidsMax int) int64 { return int64(pidsMax)*2 + 512 }

func (l Limits) spec(softBytes uint64) *specs.LinuxResources {
	quota := int64(l.CPUs) * cpuPeriodUs
	period := uint64(cpuPeriodUs)
	limit := int64(l.CeilingBytes)
	res := &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
		Memory: &specs.LinuxMemory{Limit: &limit},
		Pids:   &specs.LinuxPids{Limit: HostPids(l.PidsMax)},
	}
	// Reservation is memory.soft_limit_in_bytes on v1 (the soft limit)
	// and memory.low on v2 (the baseline's protection); v2's soft limit,
	// memory.high, is set by SetSoft.
	r := int64(softBytes)
	res.Memory.Reservation = &r
	return res
}

// Create makes the sandbox's group with its limits, removing first any
// group a killed daemon of the same sandbox left, and records it in
// stateDir. The soft limit starts at the ceiling. It takes the group lock
// first, which waits for the shim of a killed daemon to finish, and holds
// it until Remove.
func Create(stateDir string, l Limits) (g *Group, err error) {
	lock, ok, err := lockGroup(stateDir, lockWait)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("the shim of this sandbox's previous daemon has held its cgroup lock (%s) for %s; see daemon.log in %s, or remove the lock file if no moat process of this sandbox is left",
			filepath.Join(stateDir, lockFile), lockWait, stateDir)
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	removeStaleLocked(stateDir)
	id := groupID(stateDir)
	v2 := cgroup.IsOnlyV2()
	path := filepath.Join("moat", id) // v1: under the daemon's own group in each hierarchy
	if v2 {
		path = "/moat/" + id
	}
	// The daemon's group first: the sandbox's is made relative to the
	// daemon's own groups on v1, so neither may be made after the daemon
	// moved (JoinDaemon).
	daemonLimit := l.DaemonBytes
	if daemonLimit == 0 {
		daemonLimit = DaemonLimit(l.CeilingBytes)
	}
	dg, err := createDaemonGroup(stateDir, path+daemonSuffix, daemonLimit)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			removeDaemonGroup(stateDir, dg)
		}
	}()
	cg, err := cgroup.NewFromPath(path, false)
	if err != nil {
		return nil, fmt.Errorf("finding the cgroup hierarchy: %w", err)
	}
	res := l.spec(l.CeilingBytes)
	if v2 {
		r := int64(l.BaselineBytes)
		res.Memory.Reservation = &r
	}
	if err := cg.Install(res); err != nil {
		cg.Uninstall()
		return nil, fmt.Errorf("creating the sandbox's cgroup (are the cpu, memory and pids controllers enabled? see /proc/cgroups): %w", err)
	}
	g = &Group{cg: cg, v2: v2, path: path, lock: lock, daemon: dg}
	if v2 {
		// Install writes nothing when the directory already exists.
		if err := g.set(res); err != nil {
			g.Remove(stateDir)
			return nil, err
		}
	} else {
		// runsc, started inside the group, resolves a relative path
		// against its own groups: "." is the group itself.
		g.path = "."
	}
	if err := g.SetSoft(l.CeilingBytes); err != nil {
		g.Remove(stateDir)
		return nil, err
	}
	b, err := g.JSON()
	if err == nil {
		err = os.WriteFile(filepath.Join(stateDir, GroupFile), b, 0o600)
	}
	if err != nil {
		g.Remove(stateDir)
		return nil, fmt.Errorf("recording the sandbox's cgroup: %w", err)
	}
	return g, nil
}

func (g *Group) set(res *specs.LinuxResources) error {
	if err := g.cg.Update(res); err != nil {
		return fmt.Errorf("setting the sandbox's cgroup limits: %w", err)
	}
	return nil
}

// daemonSuffix makes the daemon group's name from the sandbox group's: a
// sandbox name has no dot (config.ValidName), so no sandbox's own group
// can be called that.
const daemonSuffix = ".daemon"

// createDaemonGroup makes the daemon group at path (relative to the
// calling process's groups on v1, like the sandbox's) with a memory limit
// of limitBytes, and records it in stateDir. Only memory is limited: it is
// what a guest can make the daemon hold (buffers of the gate's
// connections); CPU and tasks stay the daemon's own group's.
func createDaemonGroup(stateDir, path string, limitBytes uint64) (cgroup.Cgroup, error) {
	cg, err := cgroup.NewFromPath(path, false)
	if err != nil {
		return nil, fmt.Errorf("finding the cgroup hierarchy: %w", err)
	}
	limit := int64(limitBytes)
	res := &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}
	if err := cg.Install(res); err != nil {
		cg.Uninstall()
		return nil, fmt.Errorf("creating the daemon's cgroup (is the memory controller enabled? see /proc/cgroups): %w", err)
	}
	// Install sets limits only where it made the directory; a group a
	// killed daemon left without a record gets them here.
	if err := cg.Update(res); err != nil {
		cg.Uninstall()
		return nil, fmt.Errorf("setting the daemon's cgroup memory limit: %w", err)
	}
	b, err := json.Marshal(&cgroup.CgroupJSON{Cgroup: cg})
	if err == nil {
		err = os.WriteFile(filepath.Join(stateDir, DaemonGroupFile), b, 0o600)
	}
	if err != nil {
		cg.Uninstall()
		return nil, fmt.Errorf("recording the daemon's cgroup: %w", err)
	}
	return cg, nil
}

// removeDaemonGroup removes the daemon group (nothing may be inside) and
// its record.
func removeDaemonGroup(stateDir string, cg cgroup.Cgroup) error {
	if err := cg.Uninstall(); err != nil {
		return fmt.Errorf("removing the daemon's cgroup: %w", err)
	}
	os.Remove(filepath.Join(stateDir, DaemonGroupFile))
	return nil
}

// JoinDaemon moves the calling process, the daemon, into the daemon
// group, from where LeaveDaemon takes it back. Call it before the shim
// starts: every child the daemon starts from then on is born inside; the
// shim leaves for the sandbox's group first thing.
func (g *Group) JoinDaemon() error {
	if g.daemon == nil {
		return nil
	}
	// Without its origin, the shim cannot remove the groups (Handover
	// says so); the daemon is bounded all the same.
	g.origin, g.originErr = selfGroup()
	leave, err := g.daemon.Join()
	if err != nil {
		return fmt.Errorf("joining the daemon's cgroup: %w", err)
	}
	g.leave = leave
	return nil
}

// selfGroup is the calling process's own group, in a form whose Join
// moves a process into it: where the shim of a killed daemon goes to
// remove the sandbox's group (Reap), as the daemon's LeaveDaemon would.
func selfGroup() (cgroup.Cgroup, error) {
	if !cgroup.IsOnlyV2() {
		// v1: no name, the process's own path as the parent in each
		// hierarchy.
		return cgroup.NewFromPid(os.Getpid(), false)
	}
	// v2: NewFromPid would give the parent of the process's group (a
	// group for runsc to make children in); the path itself is wanted.
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok && strings.HasPrefix(p, "/") {
			return cgroup.NewFromPath(p, false)
		}
	}
	return nil, fmt.Errorf("no cgroup v2 path in /proc/self/cgroup: %q", b)
}

// LeaveDaemon moves the daemon back to the groups it came from, so that
// RemoveDaemon can remove its group.
func (g *Group) LeaveDaemon() {
	if g.leave != nil {
		g.leave()
		g.leave = nil
	}
}

// RemoveDaemon leaves and removes the daemon group and its record.
func (g *Group) RemoveDaemon(stateDir string) error {
	if g.daemon == nil {
		return nil
	}
	g.LeaveDaemon()
	return removeDaemonGroup(stateDir, g.daemon)
}

// DaemonStats is what the daemon group's files say now.
type DaemonStats struct {
	UsageBytes uint64 // memory charged to the group now
	LimitBytes uint64 // its limit
	OOMKills   uint64 // processes the kernel's OOM killer took in it
}

// DaemonStats reads the daemon group's counters.
func (g *Group) DaemonStats() (DaemonStats, error) {
	if g.daemon == nil {
		return DaemonStats{}, errors.New("the sandbox has no daemon group")
	}
	return daemonStats(g.daemon, g.v2)
}

func daemonStats(cg cgroup.Cgroup, v2 bool) (DaemonStats, error) {
	var s DaemonStats
	lim, err := cg.MemoryLimit()
	if err != nil {
		return s, fmt.Errorf("reading the daemon's memory limit: %w", err)
	}
	s.LimitBytes = lim
	mem := cg.MakePath("memory")
	if v2 {
		s.UsageBytes = readUint(mem, "memory.current")
		s.OOMKills = readKeyed(mem, "memory.events")["oom_kill"]
	} else {
		s.UsageBytes = readUint(mem, "memory.usage_in_bytes")
		s.OOMKills = readKeyed(mem, "memory.oom_control")["oom_kill"]
	}
	return s, nil
}

// RunscPath is the linux.cgroupsPath that makes runsc, started inside the
// group, use this very group.
func (g *Group) RunscPath() string { return g.path }

// JSON is the group for the shim, which joins it with Enter.
func (g *Group) JSON() ([]byte, error) {
	return json.Marshal(&cgroup.CgroupJSON{Cgroup: g.cg})
}

// Enter moves the calling process into the group described by b (JSON).
// The shim calls it before it starts anything, so that runsc's sandbox
// and gofer are born inside.
func Enter(b []byte) error {
	var j cgroup.CgroupJSON
	if err := json.Unmarshal(b, &j); err != nil || j.Cgroup == nil {
		return fmt.Errorf("reading the sandbox's cgroup: %v", err)
	}
	if _, err := j.Cgroup.Join(); err != nil {
		return fmt.Errorf("joining the sandbox's cgroup: %w", err)
	}
	return nil
}

// Remove deletes the group (its processes must be gone; it retries for a
// few seconds while they exit) and its record. The group lock stays held
// (by this process and its shim) until Release.
func (g *Group) Remove(stateDir string) error {
	err := g.cg.Uninstall()
	if err == nil {
		os.Remove(filepath.Join(stateDir, GroupFile))
	}
	return err
}

// Release lets go of the group lock. Call it after Remove and after the
// shim has exited.
func (g *Group) Release() {
	if g.lock != nil {
		g.lock.Close()
		g.lock = nil
	}
}

// loadGroup is a group from its record (JSON).
func loadGroup(b []byte) (*Group, error) {
	var j cgroup.CgroupJSON
	if err := json.Unmarshal(b, &j); err != nil || j.Cgroup == nil {
		return nil, fmt.Errorf("reading the sandbox's cgroup record: %v", err)
	}
	return &Group{cg: j.Cgroup, v2: cgroup.IsOnlyV2()}, nil
}

// RemoveStale removes the group recorded in stateDir, if any: one a killed
// daemon could not remove. Callers make sure no daemon of the sandbox is
// alive. When the group lock is held, a killed daemon's shim is removing
// the group right now, and RemoveStale leaves it to it.
func RemoveStale(stateDir string) error { return removeStale(stateDir, 0) }

// RemoveStaleWait is RemoveStale for a sandbox about to be deleted: it
// waits (bounded) for a killed daemon's shim to finish rather than leave
// the group to it, since the state directory the shim works from is
// about to go.
func RemoveStaleWait(stateDir string) error { return removeStale(stateDir, lockWait) }

// removeStale takes the group lock, waiting up to wait; a lock still held
// after a wait is an error, one held without waiting is the shim's.
func removeStale(stateDir string, wait time.Duration) error {
	lock, ok, err := lockGroup(stateDir, wait)
	if err != nil {
		return err
	}
	if !ok {
		if wait == 0 {
			return nil
		}
		return fmt.Errorf("the cgroup lock %s is still held after %s: a moat process of this sandbox is still working; try again",
			filepath.Join(stateDir, lockFile), wait)
	}
	defer lock.Close()
	return removeStaleLocked(stateDir)
}

// removeStaleLocked is RemoveStale with the group lock held: the
// sandbox's group, then the daemon's.
func removeStaleLocked(stateDir string) error {
	if err := removeRecorded(stateDir, GroupFile); err != nil {
		return fmt.Errorf("removing the cgroup a stopped sandbox left: %w", err)
	}
	if err := removeRecorded(stateDir, DaemonGroupFile); err != nil {
		return fmt.Errorf("removing the cgroup a stopped sandbox's daemon left: %w", err)
	}
	return nil
}

// removeRecorded removes the group recorded in stateDir's file name, and
// the record; an unreadable record is dropped.
func removeRecorded(stateDir, name string) error {
	b, err := os.ReadFile(filepath.Join(stateDir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var j cgroup.CgroupJSON
	if err != nil || json.Unmarshal(b, &j) != nil || j.Cgroup == nil {
		os.Remove(filepath.Join(stateDir, name))
		return nil
	}
	if err := j.Cgroup.Uninstall(); err != nil {
		return err
	}
	os.Remove(filepath.Join(stateDir, name))
	return nil
}

// SetSoft sets the soft limit: memory.high on v2, memory.soft_limit_in_bytes
// on v1 (through the library's Reservation).
func (g *Group) SetSoft(bytes uint64) error {
	if !g.v2 {
		r := int64(bytes)
		return g.set(&specs.LinuxResources{Memory: &specs.LinuxMemory{Reservation: &r}})
	}
	// The library has no memory.high (runsc itself never sets one), so
	// this is the one value written here directly.
	if err := os.WriteFile(filepath.Join(g.cg.MakePath("memory"), "memory.high"), []byte(strconv.FormatUint(bytes, 10)), 0); err != nil {
		return fmt.Errorf("setting the sandbox's memory.high: %w", err)
	}
	return nil
}

// Stats is what the group's files say now.
type Stats struct {
	CPUNanos     uint64  // CPU time used since the group was made
	UsageBytes   uint64  // memory charged to the group now
	CeilingBytes uint64  // hard limit
	SoftBytes    uint64  // soft limit
	OOMKills     uint64  // processes the kernel's OOM killer took in the group
	LimitHits    uint64  // times usage hit the ceiling (v1 memory.failcnt; v2 memory.events max)
	SomeAvg10    float64 // the group's memory.pressure "some" avg10; -1 where there is none (v1)
	Pids         uint64  // tasks in the group now
}

// Stats reads the group's counters. A counter the kernel does not have is
// left zero.
func (g *Group) Stats() (Stats, error) {
	s := Stats{SomeAvg10: -1}
	s.CPUNanos, _ = g.cg.CPUUsage()
	lim, err := g.cg.MemoryLimit()
	if err != nil {
		return s, fmt.Errorf("reading the sandbox's memory limit: %w", err)
	}
	s.CeilingBytes = lim
	mem := g.cg.MakePath("memory")
	if g.v2 {
		s.UsageBytes = readUint(mem, "memory.current")
		s.SoftBytes = readUint(mem, "memory.high")
		ev := readKeyed(mem, "memory.events")
		s.OOMKills, s.LimitHits = ev["oom_kill"], ev["max"]
		if p, err := os.ReadFile(filepath.Join(mem, "memory.pressure")); err == nil {
			if some, _, err := ParsePressure(string(p)); err == nil {
				s.SomeAvg10 = some
			}
		}
		s.Pids = readUint(g.cg.MakePath("pids"), "pids.current")
		return s, nil
	}
	s.UsageBytes = readUint(mem, "memory.usage_in_bytes")
	s.SoftBytes = readUint(mem, "memory.soft_limit_in_bytes")
	s.LimitHits = readUint(mem, "memory.failcnt")
	s.OOMKills = readKeyed(mem, "memory.oom_control")["oom_kill"]
	s.Pids = readUint(g.cg.MakePath("pids"), "pids.current")
	return s, nil
}

// readUint reads a one-number cgroup file; "max" reads as MaxUint64.
func readUint(dir, name string) uint64 {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return 0
	}
	v := strings.TrimSpace(string(b))
	if v == "max" {
		return ^uint64(0)
	}
	n, _ := strconv.ParseUint(v, 10, 64)
	return n
}

// readKeyed reads a "key value" per line cgroup file.
func readKeyed(dir, name string) map[string]uint64 {
	out := map[string]uint64{}
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err == nil {
			out[k] = n
		}
	}
	return out
}

// SetHard sets the hard limit (memory.max / memory.limit_in_bytes).
func (g *Group) SetHard(bytes uint64) error {
	l := int64(bytes)
	return g.set(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &l}})
}

// Usage is the memory charged to the group now: one file read, for the
// OOM guard's frequent samples.
func (g *Group) Usage() uint64 {
	if g.v2 {
		return readUint(g.cg.MakePath("memory"), "memory.current")
	}
	return readUint(g.cg.MakePath("memory"), "memory.usage_in_bytes")
}

// WorkingSet is the group's usage less the file cache on the file LRU
// lists, which the kernel drops before it OOM-kills anything: what the
// guest really holds. gVisor's guest memory is a memfd, i.e. shmem, on the
// anon lists, so it all counts; the gofer's reads of the workspace are file
// cache and do not.
func (g *Group) WorkingSet() uint64 {
	mem := g.cg.MakePath("memory")
	st := readKeyed(mem, "memory.stat")
	file := st["active_file"] + st["inactive_file"]
	if !g.v2 {
		file = st["total_active_file"] + st["total_inactive_file"]
	}
	u := g.Usage()
	if file >= u {
		return 0
	}
	return u - file
}

// Notifier wakes the OOM guard, so that an idle sandbox costs the daemon
// (almost) no samples. On cgroup v1 it is a memory threshold: an eventfd
// registered in cgroup.event_control, which the kernel signals when usage
// crosses it either way. v2 has no usage thresholds; there the notifier
// watches memory.events (inotify), which the kernel rewrites, and reports
// as a file modification, when a counter there moves: "high" when usage
// passes memory.high, which is the soft limit (at the ceiling unless host
// pressure lowered it), "max" and "oom" at the hard limit.
type Notifier struct {
	ev    *os.File
	usage *os.File // v1: the usage file the threshold is on
}

// NotifyAt arms a notifier at threshold bytes on v1; on v2 the notifier
// wakes on memory.events instead, whatever the threshold.
func (g *Group) NotifyAt(threshold uint64) (*Notifier, error) {
	if g.v2 {
		return watchModified(filepath.Join(g.cg.MakePath("memory"), "memory.events"))
	}
	mem := g.cg.MakePath("memory")
	usage, err := os.Open(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return nil, err
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		usage.Close()
		return nil, err
	}
	// Non-blocking, so the runtime's poller serves it and a read deadline
	// bounds each wait.
	ev := os.NewFile(uintptr(efd), "memory-threshold")
	line := fmt.Sprintf("%d %d %d", efd, usage.Fd(), threshold)
	if err := os.WriteFile(filepath.Join(mem, "cgroup.event_control"), []byte(line), 0); err != nil {
		ev.Close()
		usage.Close()
		return nil, fmt.Errorf("arming the memory threshold: %w", err)
	}
	return &Notifier{ev: ev, usage: usage}, nil
}

// watchModified is a notifier that wakes when path is modified (inotify
// IN_MODIFY; cgroup v2 raises it on its event files).
func watchModified(path string) (*Notifier, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	return &Notifier{ev: os.NewFile(uintptr(fd), "memory-events")}, nil
}

// Wait blocks until the notifier fires (true) or timeout passes.
func (n *Notifier) Wait(timeout time.Duration) bool {
	n.ev.SetReadDeadline(time.Now().Add(timeout))
	// An eventfd reads 8 bytes, inotify one or more events of 16 (a file's
	// watch carries no name): one read takes what is pending.
	var b [4096]byte
	_, err := n.ev.Read(b[:])
	return err == nil
}

// Close disarms the notifier (the kernel drops the event or the watch
// with its fd).
func (n *Notifier) Close() {
	n.ev.Close()
	if n.usage != nil {
		n.usage.Close()
	}
}

// MemSample is the part of Stats the elastic loop needs, at a few file
// reads instead of Stats' dozen.
func (g *Group) MemSample() (usage, soft uint64, someAvg10 float64) {
	mem := g.cg.MakePath("memory")
	someAvg10 = -1
	if g.v2 {
		if p, err := os.ReadFile(filepath.Join(mem, "memory.pressure")); err == nil {
			if some, _, err := ParsePressure(string(p)); err == nil {
				someAvg10 = some
			}
		}
		return readUint(mem, "memory.current"), readUint(mem, "memory.high"), someAvg10
	}
	return readUint(mem, "memory.usage_in_bytes"), readUint(mem, "memory.soft_limit_in_bytes"), someAvg10
}

// CPUUsage is the CPU time the group's processes have used, in ns.
func (g *Group) CPUUsage() (uint64, error) { return g.cg.CPUUsage() }
