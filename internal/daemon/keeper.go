package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/forward"
	"moat.dev/moat/internal/gate"
	"moat.dev/moat/internal/lists"
	"moat.dev/moat/internal/lockdown"
	"moat.dev/moat/internal/logfile"
	"moat.dev/moat/internal/policy"
	"moat.dev/moat/internal/preset"
	"moat.dev/moat/internal/secret"
	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/userns"
)

// The keeper is the daemon's privileged process: it holds the lock, the
// cgroups, the shim and the record, and never reads a byte the guest
// sent. Everything that does (the netstack on tap0, the gate, sessions,
// forwards, the ssh-agent filter) runs in the gate process it starts,
// jailed (internal/lockdown) under a uid of its own, which asks the
// keeper over their link for the few things a jail cannot do. See
// docs/architecture.md, "Privilege separation".

// GateRole is the moat binary's hidden role for the gate process.
const GateRole = "__gate"

// Fds the keeper hands the gate process at its start; tap0 follows on
// the link, in the answer to "go".
const (
	gateLinkFD  = 3
	gateReadyFD = 4
)

// gateReadyEnv tells the gate process it has the CLI's ready pipe.
const gateReadyEnv = "MOAT_GATE_READY"

// gateIDs are the uid and gid the gate process runs as.
type gateIDs struct{ UID, GID int }

// Gate process uids come from a range no distribution hands out (they
// allocate below 65536, and subordinate ranges from 100000 up by 65536 a
// user): one uid per sandbox, so that one sandbox's gate process cannot
// signal or trace another's.
const (
	gateUIDBase  = 0x6d6f0000 // "mo"
	gateUIDCount = 1 << 16
)

// allocGateIDs is the sandbox's gate uid, allocated once and kept in the
// record: the lowest uid of the range that no other sandbox holds and that
// the host's passwd, group and subordinate ranges do not name.
func (d *daemon) allocGateIDs() (gateIDs, error) {
	// Rootless, the invoking user: the only ids it may become.
	if os.Geteuid() != 0 {
		uid := os.Getuid()
		err := d.updateRecord(func(r *state.Record) error { r.GateUID = uid; return nil })
		return gateIDs{uid, os.Getgid()}, err
	}
	rec, err := state.Load(d.o.Dir)
	if err != nil {
		return gateIDs{}, err
	}
	taken := hostIDs()
	if rec.GateUID != 0 && !taken[rec.GateUID] {
		return gateIDs{rec.GateUID, rec.GateUID}, nil
	}
	others, _ := filepath.Glob(filepath.Join(filepath.Dir(d.o.Dir), "*", "record.json"))
	for _, f := range others {
		if filepath.Dir(f) == d.o.Dir {
			continue
		}
		if r, err := state.Load(filepath.Dir(f)); err == nil && r.GateUID != 0 {
			taken[r.GateUID] = true
		}
	}
	for uid := gateUIDBase; uid < gateUIDBase+gateUIDCount; uid++ {
		if taken[uid] {
			continue
		}
		err := d.updateRecord(func(r *state.Record) error { r.GateUID = uid; return nil })
		return gateIDs{uid, uid}, err
	}
	return gateIDs{}, fmt.Errorf("no free gate uid in %d-%d; destroy sandboxes you no longer use", gateUIDBase, gateUIDBase+gateUIDCount-1)
}

// hostIDs are the ids the host's passwd and group files name and every id
// of the subordinate ranges: a gate uid must own nothing of the host's.
func hostIDs() map[int]bool {
	out := map[int]bool{}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		b, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(b), "\n") {
			fs := strings.Split(line, ":")
			if len(fs) > 2 {
				if id, err := strconv.Atoi(fs[2]); err == nil {
					out[id] = true
				}
			}
		}
	}
	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		b, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(b), "\n") {
			fs := strings.Split(strings.TrimSpace(line), ":")
			if len(fs) != 3 {
				continue
			}
			start, err1 := strconv.Atoi(fs[1])
			n, err2 := strconv.Atoi(fs[2])
			if err1 != nil || err2 != nil || n <= 0 {
				continue
			}
			// Only the part of the range that meets ours matters.
			lo, hi := max(start, gateUIDBase), min(start+n, gateUIDBase+gateUIDCount)
			for id := lo; id < hi; id++ {
				out[id] = true
			}
		}
	}
	return out
}

// prepareAuditDir makes the directory the gate process writes its audit
// log in, the one directory of the host it may write: owned by its uid,
// with an older start's files (and the log of a moat that kept it beside
// the record) moved in and handed over.
func prepareAuditDir(dir string, ids gateIDs) error {
	ad := state.AuditDir(dir)
	if err := os.MkdirAll(ad, 0o700); err != nil {
		return fmt.Errorf("creating the audit directory: %w", err)
	}
	old, _ := filepath.Glob(filepath.Join(dir, "audit*.jsonl*"))
	for _, f := range old {
		os.Rename(f, filepath.Join(ad, filepath.Base(f)))
	}
	ents, err := os.ReadDir(ad)
	if err != nil {
		return fmt.Errorf("reading the audit directory: %w", err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			if err := os.Lchown(filepath.Join(ad, e.Name()), ids.UID, ids.GID); err != nil {
				return fmt.Errorf("handing the audit log to the gate process: %w", err)
			}
		}
	}
	if err := os.Lchown(ad, ids.UID, ids.GID); err != nil {
		return fmt.Errorf("handing the audit directory to the gate process: %w", err)
	}
	return nil
}

// gateProc is the keeper's handle on its gate process.
type gateProc struct {
	pid  int
	link *link
	done chan struct{} // closed once it has exited
	err  error         // how it exited; read once done is closed
}

// gateStopWait is how long the gate process has, once its link is
// closed, to flush its audit log and exit before it is killed.
const gateStopWait = 5 * time.Second

// stop ends the gate process: its link closed, it flushes and exits; if
// it has not within gateStopWait, it is killed.
func (g *gateProc) stop() error {
	g.link.Close()
	select {
	case <-g.done:
		return nil
	case <-time.After(gateStopWait):
	}
	unix.Kill(g.pid, unix.SIGKILL)
	<-g.done
	return fmt.Errorf("the gate process (pid %d) did not exit within %v of its link closing; killed it", g.pid, gateStopWait)
}

// startGate starts the gate process in a mount namespace of its own,
// with the link, tap0 and the CLI's ready pipe, its output copied into
// daemon.log, and a parent-death signal: a keeper that dies takes it
// along.
func (d *daemon) startGate(ids gateIDs) (*gateProc, error) {
	ours, theirs, err := linkPair()
	if err != nil {
		return nil, err
	}
	out, outW, err := os.Pipe()
	if err != nil {
		ours.Close()
		theirs.Close()
		return nil, err
	}
	files := []*os.File{theirs}
	env := gateEnviron(os.Environ())
	if f, ok := d.o.Ready.(*os.File); ok && f != nil {
		files = append(files, f)
		env = append(env, gateReadyEnv+"=1")
	}
	g := &gateProc{done: make(chan struct{})}
	started := make(chan error, 1)
	d.tasks.Go("gate process: waiting", func() {
		// Pdeathsig fires when the thread that forked the child exits:
		// this goroutine keeps its thread for the child's whole life.
		goruntime.LockOSThread()
		cmd := exec.Command(d.o.Moat, GateRole, d.o.Dir)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = outW, outW
		cmd.ExtraFiles = files
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS,
			Pdeathsig:  syscall.SIGKILL,
		}
		// Rootless: lockdown needs capabilities over its mount
		// namespace, which a user namespace gives; one that maps only
		// the user's own ids, so the gate process stays the user
		// throughout and drops the capabilities in lockdown.
		var err error
		if os.Geteuid() != 0 {
			var cfg *userns.Config
			if cfg, err = userns.Current(userns.KeepIDs); err == nil {
				err = cfg.Gate(uint32(ids.UID), uint32(ids.GID)).Start(cmd)
			}
		} else {
			err = cmd.Start()
		}
		theirs.Close()
		outW.Close()
		if err != nil {
			started <- err
			close(g.done)
			return
		}
		g.pid = cmd.Process.Pid
		started <- nil
		g.err = cmd.Wait()
		close(g.done)
	})
	// The gate process's log lines, as they are, into daemon.log: copied,
	// never parsed. Until its last writer, the gate process, is gone.
	d.tasks.Go("gate process: copying its log", func() {
		logfile.Drain(d.logOut(), bufio.NewReaderSize(out, 64<<10))
		out.Close()
	})
	if err := <-started; err != nil {
		ours.Close()
		return nil, fmt.Errorf("starting the gate process: %w", err)
	}
	d.gatePID, d.gateIDs = g.pid, ids // before the link serves "go", which checks them
	l, err := newLink(ours, maxLinkRequest, d.serveGate, &d.tasks)
	if err != nil {
		unix.Kill(g.pid, unix.SIGKILL)
		<-g.done
		return nil, err
	}
	g.link = l
	return g, nil
}

// gateEnviron is the keeper's environment less what only the keeper
// uses: the CLI's pipes, and the agent's socket, which the keeper dials
// for the gate process.
func gateEnviron(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case SecretsFDEnv, "MOAT_READY_FD", "SSH_AUTH_SOCK":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// What the gate process asks of the keeper. Each request is small and
// checked against the sandbox's own configuration (see link).
type (
	stopRequest struct {
		Reason string `json:"reason"`
		Error  string `json:"error,omitempty"`
	}
	// recordEdit is the part of the record the gate process may change:
	// what a running sandbox learns (its placeholders, presets, runtime
	// rules and forwards, its hooks' progress) and its own state. Never
	// the configuration snapshot, whose mounts and image decide what the
	// next start exposes.
	recordEdit struct {
		State        string                 `json:"state,omitempty"`
		Hook         *string                `json:"hook,omitempty"`
		SetUp        bool                   `json:"set_up,omitempty"`
		Placeholders map[string]string      `json:"placeholders,omitempty"`
		Presets      []string               `json:"presets,omitempty"`
		Rules        *state.RuntimeRules    `json:"rules,omitempty"`
		RulesSet     bool                   `json:"rules_set,omitempty"`
		Forwards     *state.RuntimeForwards `json:"forwards,omitempty"`
		ForwardsSet  bool                   `json:"forwards_set,omitempty"`
	}
	listRequest struct {
		Name   string        `json:"name"`
		MaxAge time.Duration `json:"max_age"`
		Fetch  bool          `json:"fetch"`
	}
	secretRequest struct {
		Name string `json:"name"`
	}
	secretAnswer struct {
		Value []byte `json:"value"`
	}
	discoveredRule struct {
		Entry  string `json:"entry"`
		Source string `json:"source"`
	}
)

// serveGate answers the gate process's calls.
func (d *daemon) serveGate(ctx context.Context, method string, body json.RawMessage) (any, []*os.File, error) {
	switch method {
	case "handover":
		// The gate process reads the record next, so not before it
		// says the sandbox starts (run writes it after this process's
		// start, then closes shimReady).
		select {
		case <-d.shimReady:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		// Once: the values stay in the keeper only as long as it takes.
		env := d.o.SecretEnv
		d.o.SecretEnv = nil
		return env, nil, nil
	case "go":
		// Checked from outside before any guest exists: a gate process
		// that did not lock itself down gets no guest (fail closed).
		if err := lockdown.Verify(d.gatePID, lockdown.Config{UID: d.gateIDs.UID, GID: d.gateIDs.GID}); err != nil {
			return nil, nil, err
		}
		select {
		case <-d.shimReady:
		case <-d.stopCh:
			return nil, nil, errors.New("the sandbox is stopping")
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(bootTimeout):
			return nil, nil, errors.New("the shim did not start")
		}
		var tap *os.File
		var rec *state.Record
		var err error
		d.goOnce.Do(func() {
			// The shim has mounted the root filesystem meanwhile.
			var fd int
			if fd, err = d.shim.tap(); err != nil {
				return
			}
			tap = os.NewFile(uintptr(fd), "tap0")
			if d.sb != nil {
				// A standby waits here for its word (standby.go).
				close(d.parked)
				select {
				case <-d.standbyGo:
				case <-d.stopCh:
					err = errors.New("the sandbox is stopping")
				case <-ctx.Done():
					err = ctx.Err()
				}
			}
			// A standby's gate process gets the record as it is now,
			// written on the word to go, after it took its copy; any
			// other's copy is the start's already.
			if err == nil && d.sb != nil {
				rec, err = state.Load(d.o.Dir)
			}
			if err == nil {
				err = d.shim.startGuest()
			}
			if err != nil {
				tap.Close()
				tap = nil
				return
			}
			close(d.guestGo)
		})
		if tap == nil {
			if err == nil {
				err = errors.New("the guest was started already")
			}
			return nil, nil, err
		}
		// Sent, then closed here: the keeper keeps no guest-facing fd.
		return rec, []*os.File{tap}, nil
	case "up":
		d.agentUp.Do(func() { d.tasks.Go("guest OOM guard", func() { d.guardOOM(d.ctx) }) })
		return nil, nil, nil
	case "record":
		var e recordEdit
		if err := json.Unmarshal(body, &e); err != nil {
			return nil, nil, err
		}
		if err := d.applyEdit(e); err != nil {
			return nil, nil, err
		}
		if e.State == state.StateRunning {
			d.bootOnce.Do(func() { close(d.booted) })
		}
		return nil, nil, nil
	case "stop":
		var r stopRequest
		if err := json.Unmarshal(body, &r); err != nil {
			return nil, nil, err
		}
		switch r.Reason {
		case state.StopIdle, state.StopHost, state.StopUser, state.StopError:
		default:
			return nil, nil, fmt.Errorf("unknown stop reason %q", r.Reason)
		}
		var cause error
		if r.Error != "" {
			cause = errors.New(truncate(r.Error, 4096))
		}
		d.requestStop(r.Reason, cause)
		return nil, nil, nil
	case "suspend":
		return d.serveSuspend(body)
	case "host":
		return d.hostStatus(), nil, nil
	case "addrs":
		return gate.HostAddrs(), nil, nil
	case "agent":
		f, err := d.dialAgent()
		if err != nil {
			return nil, nil, err
		}
		return nil, []*os.File{f}, nil
	case "list":
		var r listRequest
		if err := json.Unmarshal(body, &r); err != nil {
			return nil, nil, err
		}
		return d.loadList(ctx, r)
	case "discover":
		return d.discover(ctx), nil, nil
	case "hurry":
		d.tools.hurry()
		return nil, nil, nil
	case "secret":
		var r secretRequest
		if err := json.Unmarshal(body, &r); err != nil {
			return nil, nil, err
		}
		v, err := d.readSecretSource(ctx, r.Name)
		if err != nil {
			return nil, nil, err
		}
		if d.sb != nil {
			d.sb.readSecret(r.Name, v)
		}
		return secretAnswer{Value: v}, nil, nil
	}
	return nil, nil, fmt.Errorf("no call %q", method)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Bounds of what a record edit may hold.
const (
	maxEditEntries = 10000
	maxHookText    = 256
)

// applyEdit checks a record edit against the sandbox's configuration and
// writes it.
func (d *daemon) applyEdit(e recordEdit) error {
	switch e.State {
	case "", state.StateRunning, state.StateStopping:
	default:
		return fmt.Errorf("the gate process may not set the state %q", e.State)
	}
	if e.Hook != nil && len(*e.Hook) > maxHookText {
		return errors.New("hook text too long")
	}
	for _, name := range e.Presets {
		if _, err := preset.Lookup(name); err != nil {
			return err
		}
	}
	if len(e.Placeholders) > 0 {
		allowed := map[string]bool{}
		for name := range d.o.Secrets {
			allowed[name] = true
		}
		for _, name := range preset.Names() {
			p, _ := preset.Lookup(name)
			for _, s := range p.Secrets {
				allowed[s.Env] = true
			}
		}
		for name, ph := range e.Placeholders {
			if !allowed[name] || !secret.ValidPlaceholder(ph) {
				return fmt.Errorf("placeholder for %q refused", name)
			}
		}
	}
	if e.Rules != nil {
		all := append(slices.Clone(e.Rules.Allow), e.Rules.Block...)
		if len(all) > maxEditEntries {
			return errors.New("too many runtime rules")
		}
		for _, en := range all {
			if _, err := policy.ParseEntry(en); err != nil {
				return err
			}
		}
	}
	if e.Forwards != nil {
		fs := append(slices.Clone(e.Forwards.Ports), e.Forwards.Reverse...)
		if len(fs) > maxEditEntries {
			return errors.New("too many forwards")
		}
		for _, f := range fs {
			if f.Host == 0 || f.Guest == 0 {
				return errors.New("a forward without its ports")
			}
			if f.Address != "" {
				if _, err := forward.CheckAddress(f.Address); err != nil {
					return err
				}
			}
		}
	}
	return d.updateRecord(func(r *state.Record) error {
		if e.State != "" {
			r.State = e.State
		}
		if e.Hook != nil {
			r.Hook = *e.Hook
		}
		if e.SetUp {
			r.SetUp = true
		}
		if e.Placeholders != nil {
			r.Placeholders = e.Placeholders
		}
		if e.Presets != nil {
			r.Presets = e.Presets
		}
		if e.RulesSet {
			r.Rules = e.Rules
		}
		if e.ForwardsSet {
			r.Forwards = e.Forwards
		}
		return nil
	})
}

// dialAgent connects to the host's ssh-agent for the gate process, whose
// jail cannot reach the socket: only for a sandbox whose configuration
// lets the guest use it.
func (d *daemon) dialAgent() (*os.File, error) {
	if len(d.o.SSHAgentKeys) == 0 {
		return nil, errors.New("this sandbox uses no ssh-agent")
	}
	sock := os.Getenv("SSH_AUTH_SOCK")
	if sock == "" {
		return nil, errors.New("the host has no ssh-agent (SSH_AUTH_SOCK was not set when the sandbox started)")
	}
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("reaching the host's ssh-agent: %w", err)
	}
	defer c.Close()
	return c.(*net.UnixConn).File()
}

// loadList loads a named policy's list for the gate process: by the
// policy's name, from the source the sandbox's configuration gives it.
func (d *daemon) loadList(ctx context.Context, r listRequest) (*lists.Loaded, []*os.File, error) {
	p, ok := d.o.Network.Config.Policies[r.Name]
	if !ok || p.Source == "" || !slices.Contains(d.o.Network.Config.Use, r.Name) {
		return nil, nil, fmt.Errorf("this sandbox uses no list %q", r.Name)
	}
	cache, err := CacheFor()
	if err != nil {
		return nil, nil, err
	}
	return cache.Load(ctx, r.Name, p.Source, r.MaxAge, r.Fetch), nil, nil
}

// discover asks the host's tools which package repositories they use
// (policy.Discover), for the gate process's discovered layer.
func (d *daemon) discover(ctx context.Context) []discoveredRule {
	if !d.o.Network.DiscoverHost {
		return nil
	}
	var out []discoveredRule
	for _, r := range d.tools.discover(ctx) {
		out = append(out, discoveredRule{Entry: r.Entry, Source: r.Source})
	}
	return out
}

// readSecretSource reads a secret's file: or command: source for the
// gate process: only a secret of the sandbox's configuration, from the
// source the configuration gives it.
func (d *daemon) readSecretSource(ctx context.Context, name string) ([]byte, error) {
	c, ok := d.o.Secrets[name]
	if !ok || strings.HasPrefix(c.From, "env:") {
		return nil, fmt.Errorf("no secret %q of this sandbox is read from a file or a command", name)
	}
	ctx, cancel := context.WithTimeout(ctx, secretsTimeout)
	defer cancel()
	return secret.ReadOne(ctx, name, c)
}

// hostStatus is what the keeper knows of the sandbox for status and the
// idle watch: its cgroup's figures, its disk, its CPU time.
type hostStatus struct {
	Resources *control.Resources `json:"resources,omitempty"`
	Disk      *control.Disk      `json:"disk,omitempty"`
	CPU       time.Duration      `json:"cpu_ns"`
	CPUOK     bool               `json:"cpu_ok"`
}

func (d *daemon) hostStatus() hostStatus {
	cpu, ok := d.sandboxCPU()
	return hostStatus{Resources: d.resourceStatus(), Disk: DiskStatus(d.o.Dir, int(d.shimPID.Load())), CPU: cpu, CPUOK: ok}
}
