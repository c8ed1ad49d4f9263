package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"

	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/guestspec"
)

// Prepare writes a new sandbox's record: the image resolved to its digest
// once, and the runtime: runsc when Docker has it registered, else runc,
// unless dockerrt.RuntimeEnv names one.
func Prepare(ctx context.Context, e *Conn, dir, name, image string) (*dockerrt.Record, error) {
	id, err := e.ResolveImage(ctx, image)
	if err != nil {
		return nil, err
	}
	has, err := e.HasRuntime(ctx, "runsc")
	if err != nil {
		return nil, err
	}
	rt, err := dockerrt.ChooseRuntime(os.Getenv(dockerrt.RuntimeEnv), has)
	if err != nil {
		return nil, err
	}
	r := &dockerrt.Record{Schema: dockerrt.Schema, Name: name, Image: image, ImageID: id, Runtime: rt}
	return r, r.Save(dir)
}

// agentWait bounds the wait for the guest agent after the workload starts.
const agentWait = 30 * time.Second

// Up starts the sandbox's containers unless both run, and returns its
// record when the guest agent accepts connections, with when the
// workload started (Record.WorkStarted).
func Up(ctx context.Context, e *Conn, o dockerrt.Options) (*dockerrt.Record, error) {
	r, err := up(ctx, e, o)
	if err != nil {
		return nil, err
	}
	c, err := e.c.ContainerInspect(ctx, r.WorkName())
	if err != nil {
		return nil, err
	}
	if c.State != nil {
		r.WorkStarted = c.State.StartedAt
		// The forwards, whether or not any is configured: `moat forward
		// add` needs something live to ask. A forwarder that cannot start
		// does not stop the session.
		if c.State.Pid > 0 {
			if err := startForwarder(o.Dir, c.State.Pid); err != nil && o.Warn != nil {
				fmt.Fprintf(o.Warn, "moat: sandbox %q: port forwards are not served: %v\n", r.Name, err)
			}
		}
	}
	return r, nil
}

func up(ctx context.Context, e *Conn, o dockerrt.Options) (*dockerrt.Record, error) {
	if o.Warn == nil {
		o.Warn = io.Discard
	}
	r, err := dockerrt.Load(o.Dir)
	if err != nil {
		return nil, err
	}
	gateUp, _, err := e.running(ctx, r.GateName())
	if err != nil {
		return nil, err
	}
	workUp, pid, err := e.running(ctx, r.WorkName())
	if err != nil {
		return nil, err
	}
	netUp, netPid, err := e.running(ctx, r.NetName())
	if err != nil {
		return nil, err
	}
	if workUp && !netUp {
		// A holder that stopped took the namespace's interfaces with it
		// (a sandbox made before the holder has none, and goes on).
		if ok, err := e.exists(ctx, r.NetName()); err != nil {
			return nil, err
		} else if ok {
			e.c.ContainerKill(context.WithoutCancel(ctx), r.WorkName(), "KILL")
			workUp = false
		}
	}
	if workUp && netUp && !sameNetns(pid, netPid) {
		// The holder was restarted behind moat's back (docker restart):
		// the workload is left in a namespace whose interfaces went with
		// the old holder. It starts again in the new one.
		e.c.ContainerKill(context.WithoutCancel(ctx), r.WorkName(), "KILL")
		workUp = false
	}
	if workUp && r.Runtime == "runsc" && restartedOutside(o.Dir, pid) {
		// Docker restarted the workload (docker restart) in a namespace
		// whose addresses gVisor took when it last stopped: it has no
		// network. It starts again, through isolate, which gives them
		// back.
		e.c.ContainerKill(context.WithoutCancel(ctx), r.WorkName(), "KILL")
		workUp = false
	}
	if gateUp && workUp {
		// Checked at every session, which costs a netlink dump: the
		// holder's namespace must still have no way out. A sandbox made
		// before the holder has the workload's own namespace, which Docker
		// gives its routes again when it restarts the workload.
		if netUp {
			pid = netPid
		}
		if err := ensureIsolated(r, pid); err != nil {
			e.c.ContainerKill(context.WithoutCancel(ctx), r.WorkName(), "KILL")
			return nil, fmt.Errorf("the workload of %q had a way out and was stopped: %w", r.Name, err)
		}
		if err := refreshGate(ctx, r, o); err != nil {
			return nil, err
		}
		// Pushed again at every session: the host's values may have
		// changed, and a gate restarted behind moat's back has none.
		if err := pushSecrets(ctx, r, o); err != nil {
			return nil, err
		}
		// A workload just restarted may not be listening yet.
		return r, waitAgent(ctx, netip.AddrPortFrom(r.WorkloadIP, 22))
	}
	info, err := e.CheckLocal(ctx)
	if err != nil {
		return nil, err
	}
	if r.Runtime != "runsc" {
		fmt.Fprintf(o.Warn, "moat: sandbox %q runs on Docker with runc: the workload shares the host's kernel; register runsc with Docker for gVisor's (see: moat doctor)\n", r.Name)
	} else if !runtimeKeepsWrites(info, r.Runtime) {
		fmt.Fprintf(o.Warn, "moat: sandbox %q: Docker's runsc is registered without --overlay2=none, so what the workload writes outside the workspace is gone when it stops; register it as moat doctor says\n", r.Name)
	}
	// Stopped containers (a host reboot, a gate that died) start again
	// as they are: the workload keeps what it wrote outside the
	// workspace, as a gVisor sandbox keeps its writable layer.
	if err := restart(ctx, e, r, o, gateUp, netUp, workUp); err == nil {
		return r, nil
	} else if errors.Is(err, errSecrets) {
		// Not the containers' fault: making them anew would lose what
		// the workload wrote, and fail the same way.
		return nil, err
	} else if !errors.Is(err, errMissing) {
		fmt.Fprintf(o.Warn, "moat: sandbox %q: starting its stopped containers failed (%v); making them anew\n", r.Name, err)
	}
	// Whatever is left of an earlier start goes: the networks are made
	// again with the subnet free now.
	if err := Down(ctx, e, o.Dir); err != nil {
		return nil, err
	}
	if err := start(ctx, e, r, o); err != nil {
		if derr := Down(context.WithoutCancel(ctx), e, o.Dir); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, err
	}
	return r, nil
}

// restartedOutside says whether the workload's init is not the one moat
// last started (startWork records it).
func restartedOutside(dir string, pid int) bool {
	b, err := os.ReadFile(workPID(dir))
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && n != pid
}

// errMissing: a container or the record's addresses are not there to
// start again.
var errMissing = errors.New("nothing to start again")

// restart starts the sandbox's existing containers that are stopped, and
// isolates the workload's network again: a restarted holder has a new
// network namespace, with Docker's routes and rules back, and the
// workload joins it only once moat has removed them.
func restart(ctx context.Context, e *Conn, r *dockerrt.Record, o dockerrt.Options, gateUp, netUp, workUp bool) error {
	if !r.Subnet.IsValid() {
		return errMissing
	}
	for _, n := range []string{r.GateName(), r.NetName(), r.WorkName()} {
		if ok, err := e.exists(ctx, n); err != nil {
			return err
		} else if !ok {
			if n == r.NetName() {
				fmt.Fprintf(o.Warn, "moat: sandbox %q was made by an older moat, without a network holder; its containers are made anew (what the workload wrote outside the workspace is gone)\n", r.Name)
			}
			return errMissing
		}
	}
	if !gateUp {
		since := time.Now()
		if _, _, err := dockerrt.WriteGateDir(r, o); err != nil {
			return err
		}
		if err := e.c.ContainerStart(ctx, r.GateName(), container.StartOptions{}); err != nil {
			return fmt.Errorf("starting the gate: %w", err)
		}
		if _, err := waitGate(ctx, e, r, filepath.Join(o.Dir, "gate", "state", "ca.pem"), since); err != nil {
			return err
		}
	}
	if err := pushSecrets(ctx, r, o); err != nil {
		return err
	}
	if err := guardBridge(r.Bridge, r.Name); err != nil {
		return err
	}
	if !netUp {
		if workUp {
			// In the old holder's namespace, whose interfaces are gone.
			e.c.ContainerKill(context.WithoutCancel(ctx), r.WorkName(), "KILL")
			workUp = false
		}
		if err := e.c.ContainerStart(ctx, r.NetName(), container.StartOptions{}); err != nil {
			return fmt.Errorf("starting the network holder: %w", err)
		}
	}
	if !workUp {
		if err := e.startWork(ctx, r, o.Dir); err != nil {
			return err
		}
	}
	return waitAgent(ctx, netip.AddrPortFrom(r.WorkloadIP, 22))
}

// startWork isolates the holder's namespace and starts the workload in
// it. The order is the point: runsc copies the namespace's routes when
// the workload starts, and never again, so the default route goes first.
func (e *Conn) startWork(ctx context.Context, r *dockerrt.Record, dir string) error {
	up, netPid, err := e.running(ctx, r.NetName())
	if err != nil || !up {
		return fmt.Errorf("the network holder stopped as it started (see: docker logs %s): %v", r.NetName(), err)
	}
	if err := isolate(netPid, r); err != nil {
		// Fail closed: the workload does not start with a way out.
		return fmt.Errorf("isolating the workload's network: %w", err)
	}
	if err := e.c.ContainerStart(ctx, r.WorkName(), container.StartOptions{}); err != nil {
		return fmt.Errorf("starting the workload: %w", err)
	}
	up, pid, err := e.running(ctx, r.WorkName())
	if err != nil || !up {
		return fmt.Errorf("the workload stopped as it started (see: docker logs %s): %v", r.WorkName(), err)
	}
	if !sameNetns(pid, netPid) {
		e.c.ContainerKill(context.WithoutCancel(ctx), r.WorkName(), "KILL")
		return fmt.Errorf("the workload is not in its network holder's namespace (%s); it was stopped", r.NetName())
	}
	// Again after the start: nothing may have come back meanwhile.
	if err := checkRoutes(netPid, r.Subnet); err != nil {
		e.c.ContainerKill(context.WithoutCancel(ctx), r.WorkName(), "KILL")
		return fmt.Errorf("isolating the workload's network: %w", err)
	}
	return os.WriteFile(workPID(dir), []byte(strconv.Itoa(pid)+"\n"), 0o600)
}

// workPID holds the host pid of the workload's init as moat last started
// it.
func workPID(dir string) string { return filepath.Join(dir, "docker-work.pid") }

func start(ctx context.Context, e *Conn, r *dockerrt.Record, o dockerrt.Options) error {
	used, err := e.usedSubnets(ctx)
	if err != nil {
		return err
	}
	routes, err := hostRoutes()
	if err != nil {
		return err
	}
	subnet, err := dockerrt.PickSubnet(append(used, routes...))
	if err != nil {
		return err
	}
	r.Place(subnet)
	if r.GateImage, err = e.GateImage(ctx, o.Gate, "/etc/ssl/certs/ca-certificates.crt"); err != nil {
		return err
	}
	if err := r.Save(o.Dir); err != nil {
		return err
	}
	gdir, gateBinds, err := dockerrt.WriteGateDir(r, o)
	if err != nil {
		return err
	}
	labels := map[string]string{dockerrt.Label: r.Name}
	no := false
	if _, err := e.c.NetworkCreate(ctx, r.InternalNet(), network.CreateOptions{
		Driver: "bridge", Internal: true, EnableIPv6: &no, Labels: labels,
		// Docker assigns addresses from the lower half only: the upper
		// half is the gate's names range (dockerrt.NamesRange), whose
		// every address the gate answers ARP for.
		IPAM: &network.IPAM{Config: []network.IPAMConfig{{Subnet: r.Subnet.String(), IPRange: dockerrt.AssignRange(r.Subnet).String(),
			Gateway: dockerrt.HostAt(r.Subnet, 1).String()}}},
		Options: map[string]string{"com.docker.network.bridge.name": r.Bridge},
	}); err != nil {
		return fmt.Errorf("creating the internal network: %w", err)
	}
	egress := network.CreateOptions{Driver: "bridge", EnableIPv6: &no, Labels: labels}
	if o.EgressSubnet.IsValid() {
		egress.IPAM = &network.IPAM{Config: []network.IPAMConfig{{Subnet: o.EgressSubnet.String()}}}
	}
	if _, err := e.c.NetworkCreate(ctx, r.EgressNet(), egress); err != nil {
		return fmt.Errorf("creating the egress network: %w", err)
	}

	// The gate: root at first, to bind its ports and build its jail
	// (a mount namespace, pivot_root, its own seccomp filter), which
	// needs CAP_SYS_ADMIN and no seccomp filter of Docker's in the way
	// (Docker 20.10's default profile refuses pivot_root even with
	// CAP_SYS_ADMIN), and to route its names range to itself (a local
	// route, an nftables tproxy rule, an IP_TRANSPARENT listener), which
	// needs CAP_NET_ADMIN; then it drops to an unprivileged uid with no
	// capabilities, under its own filter.
	gate, err := e.c.ContainerCreate(ctx, &container.Config{
		Image: r.GateImage, Cmd: dockerrt.GateArgs(), Labels: labels,
	}, &container.HostConfig{
		Binds:       gateBinds,
		NetworkMode: container.NetworkMode(r.EgressNet()),
		CapAdd:      []string{"SYS_ADMIN", "NET_ADMIN"},
		SecurityOpt: []string{"seccomp=unconfined", "apparmor=unconfined"},
	}, nil, nil, r.GateName())
	if err != nil {
		return fmt.Errorf("creating the gate container: %w", err)
	}
	if err := e.c.NetworkConnect(ctx, r.InternalNet(), gate.ID, &network.EndpointSettings{
		IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: r.GateIP.String()},
	}); err != nil {
		return fmt.Errorf("connecting the gate to the internal network: %w", err)
	}
	if err := e.c.ContainerStart(ctx, gate.ID, container.StartOptions{}); err != nil {
		return fmt.Errorf("starting the gate: %w", err)
	}
	ca, err := waitGate(ctx, e, r, filepath.Join(gdir, "state", "ca.pem"), time.Time{})
	if err != nil {
		return err
	}
	// Before the workload runs: its requests to a secret's hosts are
	// refused until the value is there.
	if err := pushSecrets(ctx, r, o); err != nil {
		return err
	}

	guestDir := filepath.Join(o.Dir, "guest")
	if err := dockerrt.WriteGuestDir(guestDir, r, o, ca); err != nil {
		return err
	}
	binds := []string{guestDir + ":" + guestspec.Dir + ":ro"}
	if o.Workspace != "" {
		binds = append(binds, o.Workspace+":"+o.Workspace)
	}
	if err := e.createHolder(ctx, r, o, labels); err != nil {
		return err
	}
	_, err = e.c.ContainerCreate(ctx, &container.Config{
		// No Hostname: a container in another's network namespace has
		// that one's (Docker refuses both); the holder has the guest's.
		Image: r.ImageID, Entrypoint: []string{guestspec.Binary, "__init"}, Cmd: []string{},
		Labels: labels, WorkingDir: "/",
	}, &container.HostConfig{
		Binds: binds,
		// The holder's namespace, isolated before the workload starts
		// (startWork). No DNS either: moat init writes resolv.conf with
		// the gate as its one nameserver.
		NetworkMode: container.NetworkMode("container:" + r.NetName()),
		Runtime:     r.Runtime,
		// Raw sockets would let the workload forge its neighbours'
		// addresses on the subnet; nothing in a sandbox needs them.
		CapDrop: []string{"NET_RAW"},
	}, nil, nil, r.WorkName())
	if err != nil {
		return fmt.Errorf("creating the workload container: %w", err)
	}
	// The host's INPUT rules go in before the workload can send a packet.
	if err := guardBridge(r.Bridge, r.Name); err != nil {
		return err
	}
	if err := e.c.ContainerStart(ctx, r.NetName(), container.StartOptions{}); err != nil {
		return fmt.Errorf("starting the network holder: %w", err)
	}
	if err := e.startWork(ctx, r, o.Dir); err != nil {
		return err
	}
	return waitAgent(ctx, netip.AddrPortFrom(r.WorkloadIP, 22))
}

// holderBinary is where the holder container has moat-docker, bound
// read-only from the host: the gate's image is FROM scratch.
const holderBinary = "/bin/moat-docker"

// createHolder creates the network holder: a container on the internal
// network at the workload's address that runs `moat-docker hold` (it
// waits for its stop signal, and nothing else), on runc, with no
// capability, as nobody, from the gate's image with this moat-docker
// bound in. It owns the namespace the workload joins: the namespace
// exists, and moat removes its default route, before the workload's
// runtime starts (under runsc, gVisor copies the routes at that moment).
// It carries the guest's hostname, which the workload takes from it, and
// the gate as its DNS server.
func (e *Conn) createHolder(ctx context.Context, r *dockerrt.Record, o dockerrt.Options, labels map[string]string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := checkStatic(self); err != nil {
		return err
	}
	_, err = e.c.ContainerCreate(ctx, &container.Config{
		Image: r.GateImage, Entrypoint: []string{holderBinary}, Cmd: []string{"hold"},
		Hostname: o.Guest.Hostname, Labels: labels, User: "65534:65534",
	}, &container.HostConfig{
		Binds:          []string{self + ":" + holderBinary + ":ro"},
		NetworkMode:    container.NetworkMode(r.InternalNet()),
		DNS:            []string{r.GateIP.String()},
		Runtime:        "runc",
		CapDrop:        []string{"ALL"},
		ReadonlyRootfs: true,
		SecurityOpt:    []string{"no-new-privileges"},
	}, &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
		r.InternalNet(): {IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: r.WorkloadIP.String()}},
	}}, nil, r.NetName())
	if err != nil {
		return fmt.Errorf("creating the network holder: %w", err)
	}
	return nil
}

// gateFiles are the files of gate/ that WriteGateDir writes and the
// gate reads on a reload.
var gateFiles = []string{"gate.toml", "policy.toml", "preset.toml"}

// refreshGate writes a running gate's files again and has it reload them
// when they changed: a preset used for the first time since the gate
// started (or an edited moat.toml) reaches it at the next session, not
// only at its next start. A reload the gate refuses stops the session:
// the gate keeps its old policy, and the user must hear why.
func refreshGate(ctx context.Context, r *dockerrt.Record, o dockerrt.Options) error {
	dir := filepath.Join(o.Dir, "gate")
	var old [][]byte
	for _, f := range gateFiles {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		old = append(old, b)
	}
	o.Warn = nil // the start said what it drops; not again at every session
	if _, _, err := dockerrt.WriteGateDir(r, o); err != nil {
		return err
	}
	changed := false
	for i, f := range gateFiles {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		changed = changed || !bytes.Equal(b, old[i])
	}
	sock := dockerrt.ControlSocket(o.Dir)
	if _, err := os.Stat(sock); !changed || err != nil {
		return nil // unchanged, or a gate that predates the control socket (pushSecrets says so)
	}
	if err := dockerrt.Reload(ctx, sock); err != nil {
		return fmt.Errorf("sandbox %q: %w; fix the configuration, or restart the gate with: moat down %s", r.Name, err, r.Name)
	}
	return nil
}

// errSecrets marks a start stopped because the gate did not take the
// secrets' values.
var errSecrets = errors.New("handing secrets to the gate")

// pushSecrets hands the env: and command: secrets' values, which moat
// read on the host, to the gate over its control socket, and fails
// unless the gate then has every pushed secret's value (fail closed: the
// workload does not start, or the session does not open).
func pushSecrets(ctx context.Context, r *dockerrt.Record, o dockerrt.Options) error {
	sock := dockerrt.ControlSocket(o.Dir)
	if _, err := os.Stat(sock); err != nil {
		if len(o.Secrets) == 0 {
			return nil // a gate started before the control socket: nothing to push
		}
		return fmt.Errorf("%w of sandbox %q: its gate was started by an older moat and has no control socket (%v); restart it with: moat down %s", errSecrets, r.Name, err, r.Name)
	}
	// A gate Docker restarted behind moat's back may not listen yet.
	deadline := time.Now().Add(5 * time.Second)
	pending, err := dockerrt.PushSecrets(ctx, sock, o.Secrets)
	for errors.Is(err, syscall.ECONNREFUSED) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		pending, err = dockerrt.PushSecrets(ctx, sock, o.Secrets)
	}
	if err != nil {
		return fmt.Errorf("%w of sandbox %q: %w", errSecrets, r.Name, err)
	}
	if len(pending) > 0 {
		return fmt.Errorf("%w: %w", errSecrets, dockerrt.PendingError(r.Name, pending))
	}
	return nil
}

// gateServing is what the gate service logs once it is jailed and its
// listeners serve (internal/gateserve's runJailed).
const gateServing = "gate service jailed and serving"

// waitGate waits for the gate to serve, jailed, and returns the CA
// certificate it wrote, for the workload to trust.
func waitGate(ctx context.Context, e *Conn, r *dockerrt.Record, caPath string, since time.Time) ([]byte, error) {
	deadline := time.Now().Add(agentWait)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(caPath); err == nil && len(b) > 0 && strings.Contains(e.logs(ctx, r.GateName(), since, 50), gateServing) {
			return b, nil
		}
		if up, _, err := e.running(ctx, r.GateName()); err == nil && !up {
			return nil, fmt.Errorf("the gate stopped as it started: %s(see: docker logs %s)", e.logs(ctx, r.GateName(), since, 5), r.GateName())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("the gate wrote no CA certificate within %s; see its log with: docker logs %s", agentWait, r.GateName())
}

func waitAgent(ctx context.Context, ap netip.AddrPort) error {
	deadline := time.Now().Add(agentWait)
	var d net.Dialer
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := d.DialContext(dctx, "tcp", ap.String())
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the guest agent did not answer at %s within %s: %w", ap, agentWait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopTimeout is the workload's grace between SIGTERM and SIGKILL: moat
// init gives its processes 5 s (internal/guest's shutdownGrace).
const stopTimeout = 10

// Stop stops the sandbox's containers and keeps them, so that the next
// start finds the workload as it was. The workload stops first: while it
// runs, its holder and its gate do.
func Stop(ctx context.Context, e *Conn, dir string) error {
	r, err := dockerrt.Load(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range []string{r.WorkName(), r.NetName(), r.GateName()} {
		t := stopTimeout
		if err := e.c.ContainerStop(ctx, n, container.StopOptions{Timeout: &t}); err != nil && !client.IsErrNotFound(err) {
			errs = append(errs, fmt.Errorf("stopping %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// Down removes the sandbox's containers, networks and host rules. A
// sandbox with nothing left is not an error.
func Down(ctx context.Context, e *Conn, dir string) error {
	r, err := dockerrt.Load(dir)
	if err != nil {
		return err
	}
	err = e.remove(ctx, r.Name)
	if r.Bridge != "" {
		err = errors.Join(err, unguardBridge(r.Bridge, r.Name))
	}
	return err
}
