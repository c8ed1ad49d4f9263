package roles

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/image"
	"moat.dev/moat/internal/keys"
	"moat.dev/moat/internal/logfile"
	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/userns"
)

// UpstreamDNS parses MOAT_UPSTREAM_DNS: the resolvers the gate asks
// instead of the host's /etc/resolv.conf, as comma-separated ip[:port].
// Tests point it at their own DNS server; a site whose resolv.conf points
// at a local stub can point it at the real one.
func UpstreamDNS(v string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if ip, err := netip.ParseAddr(f); err == nil {
			out = append(out, netip.AddrPortFrom(ip, 53))
			continue
		}
		ap, err := netip.ParseAddrPort(f)
		if err != nil {
			return nil, fmt.Errorf("MOAT_UPSTREAM_DNS: %q is not ip or ip:port; write e.g. MOAT_UPSTREAM_DNS=10.0.0.53:53", f)
		}
		out = append(out, ap)
	}
	return out, nil
}

// KeeperEnviron is the environment moat starts the keeper with: environ
// and, unless the user set GOMAXPROCS, one processor. The keeper mostly
// waits (on the shim, the gate process, the control socket), and each
// processor the Go runtime starts with holds memory of its own for the
// sandbox's life, about 0.3 MiB (docs/benchmarks.md); setting it once
// running does not give that back, so it is set before the keeper starts.
// keeperProcsEnv marks it as moat's, and daemonMain takes it out of what
// the keeper's children inherit (the gate process, hooks, host tools).
func KeeperEnviron(environ []string) []string {
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return environ
		}
	}
	return append(environ, "GOMAXPROCS=1", keeperProcsEnv+"=1")
}

// keeperProcsEnv says that the keeper's GOMAXPROCS is KeeperEnviron's.
const keeperProcsEnv = "MOAT_KEEPER_PROCS"

// daemonMain is DaemonRole, started detached by `moat up`: the daemon's
// privileged process, the keeper (see daemon/keeper.go).
func daemonMain(dir string) int {
	startEnv := os.Environ()
	standby := os.Getenv(daemon.StandbyEnv) == "1"
	os.Unsetenv(daemon.StandbyEnv)
	if os.Getenv(keeperProcsEnv) != "" {
		os.Unsetenv("GOMAXPROCS")
		os.Unsetenv(keeperProcsEnv)
	}
	// The log, and the hooks' output, rotate within a bound (a guest
	// controls how much they write); stdout and stderr follow each new
	// file, for what reaches them directly (a panic).
	var logOut io.Writer = os.Stderr
	if w, err := logfile.Open(filepath.Join(dir, "daemon.log"), logfile.DaemonMaxBytes, logfile.Options{Redirect: []int{1, 2}}); err == nil {
		logOut = w
	}
	log := slog.New(slog.NewTextHandler(logOut, nil)).With("component", "daemon", "sandbox", filepath.Base(dir))
	var ready *os.File
	if os.Getenv("MOAT_READY_FD") == "3" {
		ready = os.NewFile(3, "ready")
	}
	fail := func(err error) int {
		log.Error("cannot start", "err", err)
		if ready != nil {
			fmt.Fprintf(ready, "error: %v\n", err)
			ready.Close()
		}
		return exitError
	}
	if err := SameBuild(os.Getenv(BuildEnv)); err != nil {
		return fail(err)
	}
	secretEnv, err := daemon.ReadHandover()
	if err != nil {
		return fail(err)
	}
	opts, err := daemonOptions(dir, log, logOut)
	if err != nil {
		return fail(err)
	}
	opts.SecretEnv = secretEnv
	opts.Standby, opts.StartEnv = standby, startEnv
	if ready != nil {
		opts.Ready = ready
	}
	err = daemon.Run(opts)
	saveAgentState(dir, log) // the agents' conversations into the project's (shares.go)
	if err != nil {
		log.Error("daemon stopped", "err", err)
		return exitError
	}
	return exitOK
}

// gateMain is the `__gate DIR` role: the daemon's jailed process, which
// reads everything the guest sends (see daemon/gateproc.go). Its log is
// its stderr, which the keeper copies into daemon.log.
func gateMain(dir string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "daemon", "sandbox", filepath.Base(dir))
	opts, err := daemonOptions(dir, log, os.Stderr)
	if err != nil {
		log.Error("cannot start", "err", err)
		return exitError
	}
	if err := daemon.RunGate(opts); err != nil {
		log.Error("gate process stopped", "err", err)
		return exitError
	}
	return exitOK
}

// host is what the daemon's options come from besides the sandbox's
// record: moat's directories, and the binaries it runs.
type host struct {
	dirs  state.Dirs
	exe   string // this binary, moat-sandbox
	runsc string
}

func newHost() (*host, error) {
	// Without root, the sandbox runs in user namespaces that map the
	// user's subordinate ids, which moat checked before it started the
	// daemon; checked again for a daemon started otherwise. (Not in the
	// gate process, which runs in one already, where the setuid helpers'
	// owner is unmapped.)
	if os.Geteuid() != 0 && !userns.Inside() {
		if _, err := userns.Current(userns.KeepIDs); err != nil {
			return nil, fmt.Errorf("moat needs root, or a user namespace of its own for this user, which it cannot have: %w; see: moat doctor", err)
		}
	}
	dirs, err := state.Resolve()
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the moat-sandbox binary: %w", err)
	}
	exe, _ = filepath.EvalSymlinks(exe)
	return &host{dirs: dirs, exe: exe, runsc: RunscPath(exe)}, nil
}

// RunscPath finds runsc: $MOAT_RUNSC, else next to exe (moat's
// binaries), else on PATH.
func RunscPath(exe string) string {
	if p := os.Getenv("MOAT_RUNSC"); p != "" {
		return p
	}
	if p := filepath.Join(filepath.Dir(exe), "runsc"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	return filepath.Join(filepath.Dir(exe), "runsc")
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// images opens the image store; without root, one whose layers are
// unpacked in a user namespace by this binary (image.Role).
func (h *host) images() (*image.Store, error) {
	if os.Geteuid() != 0 {
		return image.OpenRootless(h.dirs.Images(), h.exe)
	}
	return image.Open(h.dirs.Images())
}

// daemonOptions are the daemon's options, from the sandbox's record and
// the host: the same for both of its processes.
func daemonOptions(dir string, log *slog.Logger, logOut io.Writer) (daemon.Options, error) {
	var none daemon.Options
	h, err := newHost()
	if err != nil {
		return none, err
	}
	rec, err := state.Load(dir)
	if err != nil {
		return none, err
	}
	cfg, err := rec.Snapshot()
	if err != nil {
		return none, err
	}
	if err := keys.Ensure(dir); err != nil {
		return none, err
	}
	client, err := keys.Client(dir)
	if err != nil {
		return none, err
	}
	plan := &runtime.Plan{
		ID: "moat-" + rec.Name, StateDir: dir, Runsc: h.runsc, Moat: h.exe,
		GuestDir: filepath.Join(dir, "guest"), Hostname: rec.Name, Image: rec.Image,
		Workspace: rec.Workspace, Debug: os.Getenv("MOAT_DEBUG_RUNSC") != "",
		DiskLimit: cfg.Sandbox.DiskBytes, DiskUnlimited: cfg.Sandbox.DiskUnlimited, DiskFrom: cfg.Sandbox.DiskFrom,
		DiskTemplates: filepath.Join(h.dirs.Cache, "disk"),
	}
	if plan.Platform, err = runtime.ChoosePlatform(cfg.Sandbox.Platform, runtime.HostKVM()); err != nil {
		return none, (fmt.Errorf("sandbox.platform: %w", err))
	}
	// The workspace is a share like the others, read-write.
	ws := config.Share{Path: rec.Workspace, Source: WorkspaceSource}
	if err := CheckShares(append([]config.Share{ws}, cfg.Shares...), h.dirs.State); err != nil {
		return none, err
	}
	for _, s := range cfg.Shares {
		plan.Shares = append(plan.Shares, runtime.Share{Source: s.Path, Target: s.Target, RW: s.RW})
	}
	tickets, err := ticketShares(h.dirs, rec.Workspace) // a ticket's git mounts (shares.go)
	if err != nil {
		return none, err
	}
	plan.Shares = append(plan.Shares, tickets...)
	agents, err := agentShares(h.dirs, rec, dir, log) // the agents' kept conversations (shares.go)
	if err != nil {
		return none, err
	}
	plan.Shares = append(plan.Shares, agents...)
	var imageEnv []string
	if rec.Image != "host" {
		store, err := h.images()
		if err != nil {
			return none, err
		}
		img, err := store.Resolve(rec.Image)
		if err != nil {
			return none, err
		}
		plan.Layers = img.Layers
		imageEnv = img.Config.Env
		plan.Env = imageEnv
	}
	user, home := GuestUser(rec.GuestUID)
	env := []string{"HOME=" + home, "USER=" + user, "LOGNAME=" + user, "LANG=C.UTF-8",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, kv := range imageEnv {
		if !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	g := &guestspec.Spec{
		Schema: guestspec.Schema, Hostname: rec.Name, User: user, UID: rec.GuestUID, GID: rec.GuestGID,
		Home: home, Workspace: rec.Workspace, Listen: netstack.Guest.String() + ":22",
		AuthorizedKey: string(ssh.MarshalAuthorizedKey(client.PublicKey())),
		HostKey:       guestspec.Dir + "/host_key", Nameserver: netstack.Gateway.String(), Env: env,
	}
	if len(cfg.SSHAgent.Keys) > 0 {
		g.SSHAgentSocket = guestspec.SSHAgentSocket
	}
	upstream, err := UpstreamDNS(os.Getenv("MOAT_UPSTREAM_DNS"))
	if err != nil {
		return none, err
	}
	limits := resources.FromConfig(cfg.Sandbox)
	opts := daemon.Options{Dir: dir, Runsc: h.runsc, Moat: h.exe, MoatVersion: MoatVersion(), Plan: plan, Guest: g, Log: log, LogOut: logOut, ImageRef: rec.Image,
		Secrets: cfg.Secrets, Hooks: cfg.Hooks, Env: cfg.EnvVars, Files: cfg.Files,
		IdleTimeout: idleTimeout(cfg.Sandbox), IdleAction: cfg.Sandbox.IdleAction, SSHAgentKeys: cfg.SSHAgent.Keys, SSHAgentConfirm: cfg.SSHAgent.Confirm,
		Limits: &limits,
		Network: daemon.NetworkOptions{
			Config: cfg.Network, UserConfig: h.dirs.UserConfig(), Upstream: upstream,
			// The host's package repositories always (the host's tools are
			// what the user runs), and the image's own settings.
			DiscoverRoots: append([]string{"/"}, plan.Layers...), DiscoverHost: true,
			Audit: cfg.Audit,
		}}
	return opts, nil
}

// idleTimeout is the daemon's idle stop setting: 0 for "off".
func idleTimeout(s config.Sandbox) time.Duration {
	if s.IdleOff {
		return 0
	}
	return s.IdleTimeout
}

// GuestUser is the agent user's name and home in the guest: "agent", or
// root itself when the agent's uid is 0 (a workspace owned by root, used
// by root without sudo): a second name for uid 0 would confuse every tool
// that maps ids to names.
func GuestUser(uid int) (name, home string) {
	if uid == 0 {
		return "root", "/root"
	}
	return "agent", "/home/agent"
}
