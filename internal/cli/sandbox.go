package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/image"
	"moat.dev/moat/internal/keys"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/roles"
	"moat.dev/moat/internal/session"
	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/userns"
)

// env is what every sandbox command needs: moat's directories and the
// binaries it runs.
type env struct {
	dirs  state.Dirs
	exe   string // this binary: moat, or in a sandbox's daemon moat-sandbox
	runsc string
	// trustProject accepts what a project file asks for beyond the
	// sandbox (secrets, trusted roots) without asking: --trust-project.
	trustProject bool
	// runtime is --runtime: a new sandbox's runtime ("": the config's).
	runtime string
}

// needRoot explains why moat without sudo cannot run here (cause: what
// userns found missing) and what to type instead.
func needRoot(cause error) error {
	return withCode(ExitHost, fmt.Errorf("moat needs root, or a user namespace of its own for this user, which it cannot have: %w; "+
		"fix that (moat doctor lists every check), or run it again with sudo (your user's uid/gid are kept for the sandbox's \"agent\" user)", cause))
}

func newEnv() (*env, error) {
	// Without root, the sandbox runs in user namespaces that map the
	// user's subordinate ids; refuse only when that cannot work.
	// (Not in the gate process, which runs in one already, where the
	// setuid helpers' owner is unmapped.)
	if rootless() && !userns.Inside() {
		if _, err := userns.Current(userns.KeepIDs); err != nil {
			return nil, needRoot(err)
		}
	}
	dirs, err := state.Resolve()
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the moat binary: %w", err)
	}
	exe, _ = filepath.EvalSymlinks(exe)
	return &env{dirs: dirs, exe: exe, runsc: roles.RunscPath(exe)}, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// findWorkspace is the nearest directory at or above dir holding moat.toml,
// else dir itself.
func findWorkspace(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if fileExists(filepath.Join(d, "moat.toml")) {
			return d
		}
		if d == filepath.Dir(d) {
			return dir
		}
	}
}

func cwd() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the current directory: %w", err)
	}
	if r, err := filepath.EvalSymlinks(d); err == nil {
		d = r
	}
	return d, nil
}

// byName loads a sandbox by its name.
func (e *env) byName(name string) (string, *state.Record, error) {
	if err := config.ValidName(name); err != nil {
		return "", nil, withCode(ExitUsage, err)
	}
	dir := e.dirs.Sandbox(name)
	r, err := state.Load(dir)
	if errors.Is(err, state.ErrNoSandbox) {
		return "", nil, codef(ExitNotFound, "no sandbox named %q; see the list with: moat list", name)
	}
	return dir, r, err
}

// forWorkspace finds the sandbox whose workspace is ws.
func (e *env) forWorkspace(ws string) (string, *state.Record, error) {
	recs, err := state.List(e.dirs)
	if err != nil {
		return "", nil, err
	}
	for _, r := range recs {
		if r.Workspace == ws {
			return e.dirs.Sandbox(r.Name), r, nil
		}
	}
	return "", nil, nil
}

// resolve finds the sandbox named by args[0], or the current directory's.
func (e *env) resolve(args []string) (string, *state.Record, error) {
	if len(args) > 0 {
		return e.byName(args[0])
	}
	d, err := cwd()
	if err != nil {
		return "", nil, err
	}
	ws := findWorkspace(d)
	dir, r, err := e.forWorkspace(ws)
	if err != nil {
		return "", nil, err
	}
	if r == nil {
		return "", nil, codef(ExitNotFound, "no sandbox for %s; create one with: moat up (or name one: moat list)", ws)
	}
	return dir, r, nil
}

var nameJunk = regexp.MustCompile(`[^a-z0-9-]+`)

// deriveName turns a directory into a valid, unused sandbox name.
func (e *env) deriveName(ws string) string {
	base := nameJunk.ReplaceAllString(strings.ToLower(filepath.Base(ws)), "-")
	base = strings.Trim(base, "-")
	if len(base) > 32 {
		base = strings.Trim(base[:32], "-")
	}
	if base == "" {
		base = "sandbox"
	}
	name := base
	for i := 2; i < 1000 && fileExists(e.dirs.Sandbox(name)); i++ {
		name = base + "-" + strconv.Itoa(i)
	}
	return name
}

// create makes the sandbox for workspace ws, snapshotting its configuration.
func (e *env) create(ws, name string) (string, *state.Record, error) {
	cfg, err := config.Load(e.dirs.UserConfig(), filepath.Join(ws, "moat.toml"))
	if err != nil {
		return "", nil, withCode(ExitUsage, err)
	}
	// Checked again at each start (daemonmain.go); here so that a refused
	// workspace leaves no sandbox behind.
	if err := roles.CheckShares([]config.Share{{Path: ws, Source: roles.WorkspaceSource}}, e.dirs.State); err != nil {
		return "", nil, withCode(ExitUsage, err)
	}
	if err := e.consent(cfg); err != nil {
		return "", nil, err
	}
	if name == "" {
		name = cfg.Sandbox.Name
	}
	if name == "" {
		name = e.deriveName(ws)
	}
	if err := config.ValidName(name); err != nil {
		return "", nil, withCode(ExitUsage, err)
	}
	if r, err := state.Load(e.dirs.Sandbox(name)); err == nil {
		return "", nil, codef(ExitUsage, "the name %q is taken by the sandbox of %s; choose another with --name, or remove it with: moat destroy %s", name, r.Workspace, name)
	}
	rt, err := sandboxRuntime(e.runtime, cfg)
	if err != nil {
		return "", nil, err
	}
	if rt == runtimeKube {
		// Only moat run claims one (kube.go), with its template.
		return "", nil, codef(ExitUsage, "a sandbox on Kubernetes is a claim that moat run makes: moat run --runtime kubernetes --template TEMPLATE -- COMMAND (docs/kubernetes.md)")
	}
	if rt != runtimeDocker && cfg.Sandbox.Image != "" && cfg.Sandbox.Image != "host" {
		store, err := e.images()
		if err != nil {
			return "", nil, err
		}
		if _, err := store.Resolve(cfg.Sandbox.Image); err != nil {
			return "", nil, withCode(ExitNotFound, err)
		}
	}
	snap, err := json.Marshal(cfg)
	if err != nil {
		return "", nil, err
	}
	uid, gid := guestIDs(ws)
	rec := &state.Record{
		Name: name, Workspace: ws, Image: imageName(cfg.Sandbox.Image), Runtime: rt,
		Desired: "stopped", State: state.StateCreated, Created: time.Now().UTC(),
		GuestUID: uid, GuestGID: gid, Config: snap,
	}
	dir := e.dirs.Sandbox(name)
	if err := state.Create(dir, rec); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", nil, codef(ExitUsage, "the name %q is taken; choose another with --name", name)
		}
		return "", nil, err
	}
	if err := baseline(dir, rec.Workspace); err != nil {
		return "", nil, err
	}
	if err := keys.Ensure(dir); err != nil {
		return "", nil, err
	}
	if rt == runtimeDocker {
		if err := dockerPrepare(dir, name, cfg.Sandbox.Image); err != nil {
			e.removeAll(dir)
			return "", nil, err
		}
	}
	fmt.Fprintf(os.Stderr, "moat: created sandbox %q for %s (image %s)\n", name, ws, rec.Image)
	return dir, rec, nil
}

func imageName(s string) string {
	if s == "" {
		return "host"
	}
	return s
}

// guestIDs are the agent user's ids: the invoking user's (through sudo,
// or moat run by that user), else, for root without sudo (a CI job, a
// container, a root shell in a VM), the workspace's owner's, so that what
// the agent writes there belongs to whoever owns the project. A
// workspace owned by root makes the agent root in the guest (gVisor's
// root, not the host's).
func guestIDs(ws string) (int, int) {
	uid, _ := strconv.Atoi(os.Getenv("SUDO_UID"))
	gid, _ := strconv.Atoi(os.Getenv("SUDO_GID"))
	if uid > 0 {
		if gid <= 0 {
			gid = uid
		}
		return uid, gid
	}
	if os.Getuid() != 0 {
		return os.Getuid(), os.Getgid()
	}
	var st syscall.Stat_t
	if err := syscall.Stat(ws, &st); err == nil {
		return int(st.Uid), int(st.Gid)
	}
	return 1000, 1000
}

// images opens the image store; without root, one whose layers are
// unpacked in a user namespace (image.OpenRootless).
func (e *env) images() (*image.Store, error) {
	if rootless() {
		exe, err := sandboxExe() // which holds image.Role
		if err != nil {
			return nil, err
		}
		return image.OpenRootless(e.dirs.Images(), exe)
	}
	return image.Open(e.dirs.Images())
}

// forCwd finds or creates the sandbox for the current directory.
func (e *env) forCwd(name string) (string, *state.Record, error) {
	d, err := cwd()
	if err != nil {
		return "", nil, err
	}
	ws := findWorkspace(d)
	if name != "" {
		if dir, r, err := e.byName(name); err == nil {
			return dir, r, nil
		}
	} else {
		dir, r, err := e.forWorkspace(ws)
		if err != nil || r != nil {
			return dir, r, err
		}
	}
	return e.create(ws, name)
}

// start brings the sandbox up unless it is running, and returns when the
// guest agent answers. A start lock makes concurrent callers wait for one
// daemon instead of racing to start two.
func (e *env) start(dir string) error {
	_, err := e.startSession(dir, false)
	return err
}

// startSession is start for a caller about to run a session. When it has to
// start the daemon, it connects to the daemon's session proxy while the
// guest boots (the proxy serves clients from the moment the control socket
// exists), so that the connection and its handshake, about 15 ms of a
// fresh CLI process, are not added to the boot. It returns that client, or
// nil when the caller should connect itself.
func (e *env) startSession(dir string, connect bool) (*ssh.Client, error) {
	if err := gvisorOnly(dir); err != nil {
		return nil, err
	}
	s := sandboxAt(dir)
	// The warm path: a running sandbox needs no lock and no record write
	// (the write is an fsync, the most expensive step of a warm exec).
	if r, err := state.Load(dir); err == nil && r.State == state.StateRunning && r.Desired == "running" && s.alive() {
		return nil, nil
	}
	unlock, err := state.Lock(filepath.Join(dir, "start.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !s.alive() {
		if err := e.checkSaved(dir); err != nil { // suspend.go: before runsc is asked
			return nil, err
		}
	}
	wantRunning := func() error {
		return state.Update(dir, func(r *state.Record) error { r.Desired = "running"; return nil })
	}
	desired := make(chan error, 1)
	if s.alive() {
		if err := wantRunning(); err != nil {
			return nil, err
		}
		again, err := e.waitRunning(dir)
		if err != nil || !again {
			return nil, err
		}
		// Its daemon was finishing a stop: this start makes a new one.
		desired <- nil
	} else {
		// No daemon reads Desired, so its write (an fsync) runs beside
		// the admission and the daemon's start instead of before them.
		go func() { desired <- wantRunning() }()
	}
	c, err := e.spawnChecked(dir, connect)
	if derr := <-desired; derr != nil {
		if err == nil {
			// The sandbox runs; only the warm path above, which
			// needs Desired, is lost until a write succeeds.
			fmt.Fprintf(os.Stderr, "moat: recording that sandbox %q should run: %v\n", filepath.Base(dir), derr)
		}
	}
	return c, err
}

// spawnChecked admits the sandbox and starts its daemon (spawnDaemon).
func (e *env) spawnChecked(dir string, connect bool) (*ssh.Client, error) {
	if _, err := os.Stat(e.runsc); err != nil {
		return nil, codef(ExitHost, "runsc not found at %s; build it with: make (or set MOAT_RUNSC)", e.runsc)
	}
	// Admission: refuse a sandbox that does not fit in RAM; the
	// host-wide lock is held until the new daemon counts as running.
	release, err := e.admit(dir)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	defer close(done)
	go releaseWhenStarted(dir, time.Now(), release, done)
	if c, used, err := e.goStandby(dir, connect); used {
		return c, err
	}
	return e.spawnDaemon(dir, connect, false)
}

// goStandby resumes the sandbox through its standby, when it has one
// (daemon/standby.go; `moat suspend --standby`). used is false when it
// has none, or had one out of date: the caller starts a daemon.
func (e *env) goStandby(dir string, connect bool) (c *ssh.Client, used bool, err error) {
	if !state.StandbyAlive(dir) {
		return nil, false, nil
	}
	rec, err := state.Load(dir)
	if err != nil {
		return nil, true, err
	}
	env, values, err := e.daemonEnv(rec)
	if err != nil {
		return nil, true, err
	}
	name := filepath.Base(dir)
	br, conn, err := daemon.GoStandby(dir, env, values)
	var stale *daemon.StaleError
	switch {
	case err == nil:
		defer conn.Close()
		c, err := e.awaitStart(br, dir, connect)
		return c, true, err
	case errors.Is(err, daemon.ErrNoStandby):
		return nil, false, nil
	case errors.As(err, &stale):
		fmt.Fprintf(os.Stderr, "moat: the standby of %s is out of date (%s); resuming it the usual way\n", name, stale.Why)
	default:
		fmt.Fprintf(os.Stderr, "moat: the standby of %s did not answer (%v); ending it and resuming the usual way\n", name, err)
	}
	if err := daemon.DismissStandby(dir); err != nil {
		return nil, true, err
	}
	return nil, false, nil
}

// spawnDaemon starts the daemon and waits for its word on the ready pipe;
// with connect, it connects to the session proxy meanwhile. A standby
// (daemon/standby.go) is started instead with standby, and its word is
// that it stands by.
func (e *env) spawnDaemon(dir string, connect, standby bool) (*ssh.Client, error) {
	rec, err := state.Load(dir)
	if err != nil {
		return nil, err
	}
	// A ${VAR:?message} in [env] refuses the start too, not only the
	// session: on_up hooks and everything after them would miss VAR.
	if _, err := withConfigEnv(rec, nil); err != nil {
		return nil, err
	}
	// Said before anything else of the start: a sandbox without root
	// may have no limits at all (admission still counts its own).
	if why := resources.NoLimits(); why != "" && !standby {
		fmt.Fprintf(os.Stderr, "moat: no resource limits: %s\n", why)
	}
	exe, err := sandboxExe()
	if err != nil {
		return nil, err
	}
	environ, values, err := e.daemonEnv(rec)
	if err != nil {
		return nil, err
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	logf, err := os.OpenFile(filepath.Join(dir, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		wr.Close()
		return nil, fmt.Errorf("opening daemon log: %w", err)
	}
	defer logf.Close()
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	cmd := exec.Command(exe, roles.DaemonRole, dir)
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	srd, swr, err := os.Pipe()
	if err != nil {
		wr.Close()
		return nil, err
	}
	cmd.ExtraFiles = []*os.File{wr, srd}
	cmd.Env = append(environ, "MOAT_READY_FD=3", daemon.SecretsFDEnv+"=4")
	if standby {
		cmd.Env = append(cmd.Env, daemon.StandbyEnv+"=1")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		wr.Close()
		srd.Close()
		swr.Close()
		return nil, fmt.Errorf("starting daemon: %w", err)
	}
	wr.Close()
	srd.Close()
	// In a goroutine: values beyond the pipe's buffer would block until
	// the daemon reads, which it does first thing.
	go daemon.WriteHandover(swr, values)
	go cmd.Wait() // reap it if it dies while we wait; it outlives us otherwise
	if standby {
		line, _ := bufio.NewReader(rd).ReadString('\n')
		line = strings.TrimSpace(line)
		if line == "standby" {
			return nil, nil
		}
		return nil, daemonWordError(dir, "stand by", line)
	}
	return e.awaitStart(rd, dir, connect)
}

// awaitStart reads a starting daemon's word from rd; with connect, it
// connects to the session proxy meanwhile, and returns that client.
func (e *env) awaitStart(rd io.Reader, dir string, connect bool) (*ssh.Client, error) {
	var early chan *ssh.Client
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if connect {
		early = make(chan *ssh.Client, 1)
		go func() { early <- connectWhileBooting(ctx, dir) }()
	}
	// The daemon's word: "ok" or "error: ...", after any "out: " lines
	// of the set-up hooks' output, which are the user's to see.
	br := bufio.NewReader(rd)
	line, _ := br.ReadString('\n')
	for strings.HasPrefix(line, "out: ") {
		fmt.Fprint(os.Stderr, strings.TrimPrefix(line, "out: "))
		line, _ = br.ReadString('\n')
	}
	line = strings.TrimSpace(line)
	if line == "ok" {
		if early != nil {
			return <-early, nil
		}
		return nil, nil
	}
	cancel()
	if early != nil {
		if c := <-early; c != nil {
			c.Close()
		}
	}
	return nil, daemonWordError(dir, "start", line)
}

// daemonWordError is the error a daemon's word other than the one
// expected says: it did not (what).
func daemonWordError(dir, what, line string) error {
	name := filepath.Base(dir)
	if msg, ok := strings.CutPrefix(line, "error: "); ok {
		return fmt.Errorf("sandbox %q did not %s: %s\nsee the daemon log with: moat logs %s", name, what, msg, name)
	}
	return fmt.Errorf("sandbox %q did not %s: the daemon exited without a word\nsee the daemon log with: moat logs %s", name, what, name)
}

// daemonEnviron is the daemon's environment, a few variables by name
// (daemon.Environ), and the values of the host variables the sandbox
// reads later, which go to the daemon on a pipe instead (see
// daemon.ReadHandover): its secrets' sources, what its [env] entries name,
// what package-mirror discovery reads. Later values come the same way, on
// the control socket: a preset's key with the preset, rotated secrets with
// `moat secrets refresh`.
func daemonEnviron(rec *state.Record) ([]string, map[string]string, error) {
	cfg, err := rec.Snapshot()
	if err != nil {
		return nil, nil, err
	}
	var configVars []string
	record := func(k string) (string, bool) {
		configVars = append(configVars, k)
		return os.LookupEnv(k)
	}
	if _, err := configEnv(cfg, record); err != nil {
		return nil, nil, err
	}
	handed := daemon.HandedVars(daemon.SecretVars(cfg.Secrets, rec.Presets), configVars)
	// A handed-over variable stays out of the environment even when its
	// name is one Environ keeps (a secret read from a MOAT_* variable).
	rest, values := daemon.SplitEnv(os.Environ(), handed)
	return daemon.Environ(rest, len(cfg.SSHAgent.Keys) > 0), values, nil
}

// daemonEnv is the daemon's environment and handover as a start now
// would give them (daemonEnviron), with the variables that say which
// runsc and which moat; the pipes' variables are the start's to add.
func (e *env) daemonEnv(rec *state.Record) ([]string, map[string]string, error) {
	environ, values, err := daemonEnviron(rec)
	if err != nil {
		return nil, nil, err
	}
	return roles.KeeperEnviron(append(environ, "MOAT_RUNSC="+e.runsc, roles.BuildEnv+"="+roles.MoatVersion())), values, nil
}

// connectWhileBooting connects to the session proxy of a daemon that is
// starting, as soon as its control socket exists. It returns nil if that
// fails or ctx ends first: the caller then connects the usual way, and
// reports the usual errors.
func connectWhileBooting(ctx context.Context, dir string) *ssh.Client {
	sock := sandboxAt(dir).socket()
	for {
		if _, err := os.Stat(sock); err == nil {
			c, err := sshClient(ctx, dir)
			if err != nil {
				return nil
			}
			return c
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// waitRunning waits for a daemon that is already starting. again is
// true when that daemon was instead finishing a stop (the record says
// stopping, or stopped for a reason other than a failed start) and is now
// gone: the caller starts the sandbox afresh.
func (e *env) waitRunning(dir string) (again bool, err error) {
	s := sandboxAt(dir)
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		r, err := state.Load(dir)
		if err != nil {
			return false, err
		}
		if r.Hook != "" {
			// Set-up hooks run (a dependency install, say): the daemon
			// bounds them itself.
			deadline = time.Now().Add(90 * time.Second)
		}
		alive := s.alive()
		switch {
		case r.State == state.StateRunning:
			return false, nil
		case r.State == state.StateStopping, r.State == state.StateStopped && r.StopReason != state.StopError,
			r.State == state.StateSuspending, r.State == state.StateSuspended:
			// A stop is in flight, or done and its daemon exiting
			// (its clean-up follows the record's last word).
			if !alive {
				return true, nil
			}
		case !alive:
			return false, fmt.Errorf("sandbox %q stopped while starting: %s", r.Name, r.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false, errors.New("timed out waiting for the sandbox to start")
}

// stop asks the daemon to stop and waits until it is gone.
func (e *env) stop(dir string, reason string) error {
	s := sandboxAt(dir)
	if err := state.Update(dir, func(r *state.Record) error { r.Desired = "stopped"; return nil }); err != nil {
		// A record that cannot be written (a full disk, say) must not
		// keep a sandbox running: it is stopped all the same.
		fmt.Fprintf(os.Stderr, "moat: %v; stopping the sandbox all the same\n", err)
	}
	// A suspended sandbox's standby is ended as a stop would end its
	// daemon; its image stays.
	if err := daemon.DismissStandby(dir); err != nil {
		return err
	}
	if !s.alive() {
		return nil
	}
	err := s.call(5*time.Second, func(ctx context.Context, c *control.Client) error { return c.Stop(ctx, reason) })
	if err != nil {
		// The daemon may be wedged: the signal path stops it too.
		if pid := daemonPID(dir); pid > 0 {
			syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.alive() {
		if time.Now().After(deadline) {
			if pid := daemonPID(dir); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(200 * time.Millisecond)
			if s.alive() {
				return errors.New("the daemon did not stop within 30s")
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func daemonPID(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "daemon.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// sshClient opens an SSH connection to the daemon's session proxy, which
// carries its sessions to the guest agent.
func sshClient(ctx context.Context, dir string) (*ssh.Client, error) {
	signer, err := keys.Client(dir)
	if err != nil {
		return nil, err
	}
	hostKey, err := keys.HostPublic(dir)
	if err != nil {
		return nil, err
	}
	conn, err := sandboxAt(dir).client().DialSSH(ctx)
	if err != nil {
		return nil, err
	}
	// The daemon answers from the host, so 10 s means it is wedged.
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	cc, chans, reqs, err := ssh.NewClientConn(conn, "guest", session.ClientConfig(signer, hostKey))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("connecting to the sandbox through its daemon: %w", err)
	}
	conn.SetDeadline(time.Time{})
	return ssh.NewClient(cc, chans, reqs), nil
}
