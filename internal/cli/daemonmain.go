package cli

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/keys"
	"moat.dev/moat/internal/logfile"
	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/resources"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
)

// upstreamDNS parses MOAT_UPSTREAM_DNS: the resolvers the gate asks
// instead of the host's /etc/resolv.conf, as comma-separated ip[:port].
// Tests point it at their own DNS server; a site whose resolv.conf points
// at a local stub can point it at the real one.
func upstreamDNS(v string) ([]netip.AddrPort, error) {
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

// daemonMain is the `__daemon DIR` role, started detached by `moat up`:
// the daemon's privileged process, the keeper (see daemon/keeper.go).
func daemonMain(dir string) int {
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
		return ExitError
	}
	if err := sameBuild(os.Getenv(buildEnv)); err != nil {
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
	if ready != nil {
		opts.Ready = ready
	}
	err = daemon.Run(opts)
	saveAgentState(dir, log) // the agents' conversations into the project's (sessions.go)
	if err != nil {
		log.Error("daemon stopped", "err", err)
		return ExitError
	}
	return ExitOK
}

// gateMain is the `__gate DIR` role: the daemon's jailed process, which
// reads everything the guest sends (see daemon/gateproc.go). Its log is
// its stderr, which the keeper copies into daemon.log.
func gateMain(dir string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "daemon", "sandbox", filepath.Base(dir))
	opts, err := daemonOptions(dir, log, os.Stderr)
	if err != nil {
		log.Error("cannot start", "err", err)
		return ExitError
	}
	if err := daemon.RunGate(opts); err != nil {
		log.Error("gate process stopped", "err", err)
		return ExitError
	}
	return ExitOK
}

// daemonOptions are the daemon's options, from the sandbox's record and
// the host: the same for both of its processes.
func daemonOptions(dir string, log *slog.Logger, logOut io.Writer) (daemon.Options, error) {
	var none daemon.Options
	e, err := newEnv()
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
		ID: "moat-" + rec.Name, StateDir: dir, Runsc: e.runsc, Moat: e.exe,
		GuestDir: filepath.Join(dir, "guest"), Hostname: rec.Name, Image: rec.Image,
		Workspace: rec.Workspace, Debug: os.Getenv("MOAT_DEBUG_RUNSC") != "",
		DiskLimit: cfg.Sandbox.DiskBytes, DiskUnlimited: cfg.Sandbox.DiskUnlimited, DiskFrom: cfg.Sandbox.DiskFrom,
		DiskTemplates: filepath.Join(e.dirs.Cache, "disk"),
	}
	if plan.Platform, err = runtime.ChoosePlatform(cfg.Sandbox.Platform, runtime.HostKVM()); err != nil {
		return none, (fmt.Errorf("sandbox.platform: %w", err))
	}
	// The workspace is a share like the others, read-write.
	ws := config.Share{Path: rec.Workspace, Source: workspaceSource}
	if err := checkShares(append([]config.Share{ws}, cfg.Shares...), e.dirs.State); err != nil {
		return none, err
	}
	for _, s := range cfg.Shares {
		plan.Shares = append(plan.Shares, runtime.Share{Source: s.Path, Target: s.Target, RW: s.RW})
	}
	tickets, err := ticketShares(e.dirs, rec.Workspace) // a ticket's git mounts (ticket.go)
	if err != nil {
		return none, err
	}
	plan.Shares = append(plan.Shares, tickets...)
	agents, err := agentShares(e.dirs, rec, dir, log) // the agents' kept conversations (sessions.go)
	if err != nil {
		return none, err
	}
	plan.Shares = append(plan.Shares, agents...)
	var imageEnv []string
	if rec.Image != "host" {
		store, err := e.images()
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
	user, home := guestUser(rec.GuestUID)
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
	upstream, err := upstreamDNS(os.Getenv("MOAT_UPSTREAM_DNS"))
	if err != nil {
		return none, err
	}
	opts := daemon.Options{Dir: dir, Runsc: e.runsc, Moat: e.exe, MoatVersion: moatVersion(), Plan: plan, Guest: g, Log: log, LogOut: logOut, ImageRef: rec.Image,
		Secrets: cfg.Secrets, Hooks: cfg.Hooks, Env: cfg.EnvVars, Files: cfg.Files,
		IdleTimeout: idleTimeout(cfg.Sandbox), IdleAction: cfg.Sandbox.IdleAction, SSHAgentKeys: cfg.SSHAgent.Keys, SSHAgentConfirm: cfg.SSHAgent.Confirm,
		Limits: limitsPtr(resources.FromConfig(cfg.Sandbox)),
		Network: daemon.NetworkOptions{
			Config: cfg.Network, UserConfig: e.dirs.UserConfig(), Upstream: upstream,
			// The host's package repositories always (the host's tools are
			// what the user runs), and the image's own settings.
			DiscoverRoots: append([]string{"/"}, plan.Layers...), DiscoverHost: true,
			Audit: cfg.Audit,
		}}
	return opts, nil
}

// guestUser is the agent user's name and home in the guest: "agent", or
// root itself when the agent's uid is 0 (a workspace owned by root, used
// by root without sudo): a second name for uid 0 would confuse every tool
// that maps ids to names.
func guestUser(uid int) (name, home string) {
	if uid == 0 {
		return "root", "/root"
	}
	return "agent", "/home/agent"
}
