package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/keys"
	"moat.dev/moat/internal/roles"
	"moat.dev/moat/internal/secret"
	"moat.dev/moat/internal/session"
	"moat.dev/moat/internal/state"
)

// runtimeDocker is [sandbox] runtime = "docker" and --runtime docker: the
// sandbox as containers through the Docker engine (internal/dockerrt),
// whose operations moat-docker, next to moat, runs (dockerrt.Helper).
const runtimeDocker = "docker"

// dockerEgressEnv names the egress network's subnet (a test serves its
// positive control there); unset: Docker chooses.
const dockerEgressEnv = "MOAT_DOCKER_EGRESS_SUBNET"

// sandboxRuntime is the runtime a new sandbox gets: the flag, else the
// configuration, else gVisor.
func sandboxRuntime(flag string, cfg config.Config) (string, error) {
	rt := cfg.Sandbox.Runtime
	if flag != "" {
		rt = flag
	}
	switch rt {
	case "", "gvisor":
		return "gvisor", nil
	case runtimeDocker, runtimeKube:
		return rt, nil
	}
	where := "--runtime"
	if flag == "" {
		where = "[sandbox] runtime"
	}
	return "", codef(ExitUsage, "%s %q: write gvisor (moat's own sandbox), docker (containers through the Docker engine) or kubernetes (a claim on a cluster)", where, rt)
}

// dockerHelper is moat-docker, which holds the Docker SDK that moat does
// not link; its warnings go to stderr as it makes them.
func dockerHelper() (dockerrt.Helper, error) {
	p, err := sibling(dockerBinary)
	if err != nil {
		return dockerrt.Helper{}, err
	}
	return dockerrt.Helper{Path: p, Stderr: os.Stderr}, nil
}

// fromHelper gives moat-docker's errors moat's exit codes: an engine moat
// cannot reach or use (moat-docker's one class for ErrUnreachable and
// ErrNotLocal) is the host's, a missing image is not found.
func fromHelper(err error) error {
	switch {
	case errors.Is(err, dockerrt.ErrUnreachable):
		return withCode(ExitHost, err)
	case errors.Is(err, dockerrt.ErrNoImage):
		return withCode(ExitNotFound, err)
	}
	return err
}

// dockerPrepare records a new Docker sandbox's image digest and runtime.
func dockerPrepare(dir, name, image string) error {
	if image == "" || image == "host" {
		return codef(ExitUsage, "runtime docker needs an image from Docker's store: set [sandbox] image in moat.toml (e.g. image = \"debian:bookworm\", imported or built locally)")
	}
	h, err := dockerHelper()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := h.Prepare(ctx, dir, name, image); err != nil {
		if errors.Is(err, dockerrt.ErrUnreachable) {
			return fromHelper(err)
		}
		return withCode(ExitNotFound, err)
	}
	return nil
}

// dockerConnect starts the Docker sandbox at dir unless it runs, and
// connects to its guest agent over the internal bridge.
func (e *env) dockerConnect(ctx context.Context, dir string, rec *state.Record) (*ssh.Client, error) {
	h, err := dockerHelper()
	if err != nil {
		return nil, err
	}
	gate, err := sibling(gateBinary)
	if err != nil {
		return nil, err
	}
	guestInit, err := sandboxExe() // the container's init, as gVisor's guest's
	if err != nil {
		return nil, err
	}
	g, err := dockerGuest(dir, rec)
	if err != nil {
		return nil, err
	}
	upstream, err := roles.UpstreamDNS(os.Getenv("MOAT_UPSTREAM_DNS"))
	if err != nil {
		return nil, withCode(ExitUsage, err)
	}
	var egress netip.Prefix
	if v := os.Getenv(dockerEgressEnv); v != "" {
		if egress, err = netip.ParsePrefix(v); err != nil {
			return nil, codef(ExitUsage, "%s=%q: write a subnet, e.g. 198.51.100.0/24", dockerEgressEnv, v)
		}
	}
	policy := []string{e.dirs.UserConfig(), filepath.Join(rec.Workspace, "moat.toml")}
	secrets, err := dockerSecrets(ctx, policy, rec.Presets)
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: reading secrets on the host: %w", rec.Name, err)
	}
	// One start at a time, as for gVisor (startSession): two sessions
	// starting a cold sandbox would each remove what the other made.
	// Held through the hooks too: a session never races its set-up.
	unlock, err := state.Lock(filepath.Join(dir, "start.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	r, err := h.Up(ctx, dockerrt.Options{
		Dir: dir, Moat: guestInit, Gate: gate, Workspace: rec.Workspace, Guest: g,
		Policy: policy, Upstream: upstream, EgressSubnet: egress, Secrets: secrets,
		Presets: rec.Presets,
	})
	if err != nil {
		return nil, fromHelper(fmt.Errorf("starting sandbox %q on Docker: %w", rec.Name, err))
	}
	if err := keepDockerPlaceholders(dir, rec); err != nil {
		return nil, err
	}
	signer, err := keys.Client(dir)
	if err != nil {
		return nil, err
	}
	hostKey, err := keys.HostPublic(dir)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", netip.AddrPortFrom(r.WorkloadIP, 22).String())
	if err != nil {
		return nil, fmt.Errorf("connecting to the guest agent of %q: %w", rec.Name, err)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	cc, chans, reqs, err := ssh.NewClientConn(conn, "guest", session.ClientConfig(signer, hostKey))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("connecting to the guest agent of %q: %w", rec.Name, err)
	}
	conn.SetDeadline(time.Time{})
	c := ssh.NewClient(cc, chans, reqs)
	if err := dockerHooks(ctx, dir, rec, c, r.WorkStarted); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// dockerHooksFile holds, in a Docker sandbox's state directory, the
// workload's start (Record.WorkStarted) whose hooks have run.
const dockerHooksFile = "docker-hooks-started"

// dockerHookTimeout bounds all hooks of one start, as a gVisor daemon's.
const dockerHookTimeout = 30 * time.Minute

// dockerHooks runs a Docker sandbox's set-up hooks once per start of its
// workload container, as a gVisor daemon does at each start
// (internal/daemon/hooks.go): on_create until it has succeeded once (a
// failure stops the session; the next one runs it again), then on_up (a
// failure is reported and the session goes on). Through the guest agent,
// as the session's own user, with the session's environment; output on
// stderr. A start is the workload's (Docker's StartedAt), so a workload
// Docker restarted runs on_up again too.
func dockerHooks(ctx context.Context, dir string, rec *state.Record, c *ssh.Client, started string) error {
	cfg, err := rec.Snapshot()
	if err != nil {
		return err
	}
	hooks := cfg.Hooks
	if len(hooks.OnCreate) == 0 && len(hooks.OnUp) == 0 {
		return nil
	}
	marker := filepath.Join(dir, dockerHooksFile)
	if b, err := os.ReadFile(marker); err == nil && started != "" && string(b) == started {
		return nil
	}
	env, err := withConfigEnv(rec, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, dockerHookTimeout)
	defer cancel()
	run := func(phase, cmd string) error {
		fmt.Fprintf(os.Stderr, "moat: %s: %s\n", phase, cmd)
		code, err := session.Run(ctx, c, session.Options{Argv: []string{"/bin/sh", "-c", cmd}, Env: env,
			Stdin: strings.NewReader(""), Stdout: os.Stderr, Stderr: os.Stderr})
		if err == nil && code != 0 {
			err = fmt.Errorf("exit status %d", code)
		}
		return err
	}
	if !rec.SetUp {
		for _, cmd := range hooks.OnCreate {
			if err := run("on_create", cmd); err != nil {
				return fmt.Errorf("sandbox %q: on_create %q failed (%v); the sandbox is not set up, and its next session runs on_create again from the start", rec.Name, cmd, err)
			}
		}
		if err := state.Update(dir, func(r *state.Record) error { r.SetUp = true; return nil }); err != nil {
			return err
		}
	}
	for _, cmd := range hooks.OnUp {
		if err := run("on_up", cmd); err != nil {
			fmt.Fprintf(os.Stderr, "moat: on_up %q failed (%v); the sandbox runs anyway\n", cmd, err)
			break
		}
	}
	return state.WriteAtomic(marker, []byte(started), 0o644)
}

// dockerSecrets reads, on the host, the values of the secrets a Docker
// sandbox's gate takes over its control socket (dockerrt.Policy.Pushed:
// env: from moat's own environment, command: run here, as a gVisor
// sandbox's keeper reads them; and the credentials of its presets that
// this environment has). They go to moat-docker on its stdin,
// which pushes them to the gate: never into a container's environment,
// an argument or a file.
func dockerSecrets(ctx context.Context, policy []string, presets []string) (map[string]string, error) {
	pol, err := dockerrt.ReadPolicy(policy, func(p string) (string, error) { return p, nil })
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range pol.PushedNames() {
		from := pol.Pushed[name]
		if v, ok := strings.CutPrefix(from, "env:"); ok {
			val, ok := os.LookupEnv(v)
			if !ok {
				return nil, fmt.Errorf("secret %s: %s is not set on the host; export %s, or remove [secrets.%s]", name, from, v, name)
			}
			out[name] = val
			continue
		}
		b, err := secret.ReadOne(ctx, name, config.Secret{Name: name, From: from})
		if err != nil {
			return nil, err
		}
		out[name] = string(b)
	}
	dockerPresetValues(out, presets, pol.Defined)
	return out, nil
}

// gvisorOnly refuses, for a Docker sandbox, what only moat's own runtime
// does yet: a daemon of its own (moat up, ssh-config, resume).
func gvisorOnly(dir string) error {
	if r, err := state.Load(dir); err == nil && r.Runtime == runtimeKube {
		return kubeNoDaemon(r)
	} else if err == nil && r.Runtime == runtimeDocker {
		return codef(ExitUsage, "sandbox %q runs on Docker, which starts with its first session and has no daemon; use: moat run (see docs/docker.md)", r.Name)
	}
	return nil
}

// dockerGuest is the guest configuration of a Docker sandbox: the same
// user and environment as a gVisor sandbox's (daemonmain.go); dockerrt
// adds the addresses and the CA.
func dockerGuest(dir string, rec *state.Record) (*guestspec.Spec, error) {
	if err := keys.Ensure(dir); err != nil {
		return nil, err
	}
	client, err := keys.Client(dir)
	if err != nil {
		return nil, err
	}
	user, home := roles.GuestUser(rec.GuestUID)
	env := []string{"HOME=" + home, "USER=" + user, "LOGNAME=" + user, "LANG=C.UTF-8",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return &guestspec.Spec{
		Schema: guestspec.Schema, Hostname: rec.Name, User: user, UID: rec.GuestUID, GID: rec.GuestGID,
		Home: home, Workspace: rec.Workspace,
		AuthorizedKey: string(ssh.MarshalAuthorizedKey(client.PublicKey())),
		HostKey:       guestspec.Dir + "/host_key", Env: env,
	}, nil
}

// dockerDown removes a Docker sandbox's containers and networks.
func dockerDown(dir string) error { return onDocker(dir, dockerrt.Helper.Down) }

// dockerStop is moat down for a Docker sandbox: its containers stop and
// are kept.
func dockerStop(dir string) error { return onDocker(dir, dockerrt.Helper.Stop) }

// onDocker applies op, through moat-docker, to the sandbox in dir. A
// sandbox made before its image was recorded has nothing in Docker.
func onDocker(dir string, op func(dockerrt.Helper, context.Context, string) error) error {
	h, err := dockerHelper()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := op(h, ctx, dir); !errors.Is(err, dockerrt.ErrNoRecord) {
		return fromHelper(err)
	}
	return nil
}

// dockerNotes are doctor's lines about Docker: never failures, since
// only runtime = "docker" needs it.
func dockerNotes(w io.Writer, runsc string) {
	h, err := dockerHelper()
	if err != nil {
		fmt.Fprintf(w, "note Docker (only for runtime = \"docker\"): %v\n", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := h.Info(ctx)
	if err != nil {
		fmt.Fprintf(w, "note Docker (only for runtime = \"docker\"): %v\n", err)
		return
	}
	fmt.Fprintf(w, "note Docker (only for runtime = \"docker\"): engine %s (API %s) reachable\n", info.Version, info.API)
	if info.Runsc {
		fmt.Fprintln(w, "note Docker runtime runsc: registered; Docker sandboxes run on gVisor")
		return
	}
	abs, _ := filepath.Abs(runsc)
	fmt.Fprintf(w, "note Docker runtime runsc: not registered; Docker sandboxes run on runc and share the host's kernel. Register the runsc moat builds with:\n"+
		"       sudo %s install --runtime=runsc -- --overlay2=none && sudo systemctl restart docker\n"+
		"     (runsc install adds {\"runtimes\": {\"runsc\": {\"path\": %q, \"runtimeArgs\": [\"--overlay2=none\"]}}} to /etc/docker/daemon.json;\n"+
		"     --overlay2=none keeps what the workload writes in Docker's layer, so it outlives moat down as on runc)\n", abs, abs)
}

// runtimeFlagHelp is --runtime's help.
var runtimeFlagHelp = "runtime of a new sandbox: " + "gvisor, " + runtimeDocker + " or " + runtimeKube + " (default: [sandbox] runtime, else gvisor)"
