package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/gate"
	"moat.dev/moat/internal/guest"
	"moat.dev/moat/internal/lockdown"
	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/secret"
	"moat.dev/moat/internal/state"
)

// The gate process: everything of the daemon that reads what the guest
// sends, jailed. It sets itself up as root (the CA, the secrets, the
// policy, the audit log, the control socket), then locks itself down
// (internal/lockdown) before it reads a single frame from tap0, and asks
// the keeper for the guest to start. See docs/architecture.md,
// "Privilege separation".

// RunGate is the gate process's main (`moat __gate DIR`), started by the
// keeper with the fds keeper.go names; it returns when the keeper ends the
// link.
func RunGate(o Options) error {
	d := newDaemon(o)
	defer startProfile()()
	err := d.runGate()
	if err != nil && !errors.Is(err, errStopped) && d.keeper != nil {
		// The keeper stops the sandbox and then tells the CLI why, on
		// its own copy of the ready pipe: a CLI told before would start
		// the sandbox again while this start still stops. So the link
		// stays open until the keeper has the reason.
		d.requestStop(state.StopError, err)
	}
	if d.keeper != nil {
		d.keeper.Close()
	}
	if d.o.Ready != nil {
		d.o.Ready.Close()
	}
	d.cancel() // runGate's own exits end it too; this covers the ones before
	waitTasks(&d.tasks, gateTasksWait, d.log)
	return err
}

func (d *daemon) runGate() error {
	// Each set-up step's share, for the "locked down" log line.
	t := time.Now()
	var phases []any
	mark := func(name string) {
		phases = append(phases, name, time.Since(t).Microseconds())
		t = time.Now()
	}
	// The keeper drives the stop; a signal meant for the daemon's
	// process group is not this process's to act on.
	signal.Ignore(unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	l, err := newLink(os.NewFile(gateLinkFD, "link"), maxLinkMessage, d.serveKeeper, &d.tasks)
	if err != nil {
		return err
	}
	d.keeper = l // closed by RunGate, once the keeper knows how this ended
	if os.Getenv(gateReadyEnv) != "" {
		d.o.Ready = os.NewFile(gateReadyFD, "ready")
	}
	// Everything the gate process starts stops with ctx, after the
	// listeners and the netstack's users below have closed.
	ctx := d.ctx
	defer d.cancel()
	if _, err := l.call(ctx, "handover", nil, &d.o.SecretEnv); err != nil {
		return err
	}
	rec, err := state.Load(d.o.Dir)
	if err != nil {
		return err
	}
	d.rec = rec
	if rec.GateUID == 0 {
		return errors.New("the record has no gate uid")
	}
	mark("handover_us")

	// Set-up, as root: everything read from the host is read now.
	ca, creds, err := d.startCredentials(ctx)
	if err != nil {
		return err
	}
	d.ca, d.creds = ca, creds
	mark("credentials_us")
	if err := d.writeGuestSpec(); err != nil {
		return err
	}
	if d.fork, err = d.loadForkKeys(); err != nil { // before the guest starts: its restore deletes them
		return err
	}
	d.readCopies()
	nw, err := d.startNetwork(ctx)
	if err != nil {
		return err
	}
	d.net = nw
	defer nw.close()
	mark("network_us")
	proxy, err := d.newProxy()
	if err != nil {
		return err
	}
	d.proxy = proxy
	defer proxy.Close()
	ln, srv, err := d.listenControl()
	if err != nil {
		return err
	}
	defer ln.Close()
	defer srv.Close()

	mark("proxy_us")
	if err := d.lockDown(rec.GateUID); err != nil {
		return fmt.Errorf("locking the gate process down: %w", err)
	}
	mark("lockdown_us")
	d.log.Info("gate process locked down", append([]any{"uid", rec.GateUID}, phases...)...)
	var now state.Record
	fds, err := l.call(ctx, "go", nil, &now)
	if err != nil {
		return err
	}
	if now.Name != "" {
		// The keeper's record as the guest starts: a standby's says
		// resuming only from its word to go.
		d.recMu.Lock()
		d.rec = &now
		d.recMu.Unlock()
		rec = &now
	}
	if len(fds) != 1 {
		closeFiles(fds)
		return errors.New("the keeper sent no tap0")
	}
	// The netstack owns the descriptor from here.
	tapFD, err := unix.Dup(int(fds[0].Fd()))
	fds[0].Close()
	if err != nil {
		return err
	}
	lim := d.gateLimits()
	st, err := netstack.New(netstack.Options{TAPFD: tapFD, Gate: nw.gate, Log: d.log, Ctx: ctx,
		WindowBudget: lim.windowBytes, DNSQueries: lim.dns})
	if err != nil {
		return err
	}
	d.stack = st
	d.annotateHolds()
	defer d.startForwards(ctx)()
	d.tasks.Go("control server", func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Warn("serving the control socket", "err", err)
		}
	})

	if err := d.waitAgent(); err != nil {
		if errors.Is(err, errStopped) {
			return err
		}
		return fmt.Errorf("%w (see %s)", err, filepath.Join(d.o.Dir, "daemon.log"))
	}
	// The guest is up and runsc has sized it: the keeper's OOM guard may
	// raise the cgroup's hard limit above the ceiling (resources.go).
	l.call(ctx, "up", nil, nil)
	if err := d.runSetUp(ctx); err != nil { // suspend.go: none on a resume
		return err
	}
	if err := d.updateRecord(func(r *state.Record) error { r.State = state.StateRunning; return nil }); err != nil {
		return err
	}
	d.log.Info("sandbox running", "boot_ms", time.Since(rec.Started).Milliseconds())
	close(d.booted)
	d.servingProcs()
	d.tasks.Go("handing freed memory back", func() {
		// What the start allocated (the policy's compile, the CA, the
		// guest's first handshake, the host's tools' answers) is garbage
		// by now; the runtime would keep the freed pages for a while.
		// Handing them back at once is about 2 MiB of an idle
		// sandbox's memory.
		select {
		case <-d.net.settled:
			debug.FreeOSMemory()
		case <-ctx.Done():
		}
	})
	d.tasks.Go("idle watch", func() { d.watchIdle(ctx) })
	if d.o.Ready != nil {
		fmt.Fprintln(d.o.Ready, "ok")
		d.o.Ready.Close()
		d.o.Ready = nil
	}
	<-l.done
	return nil
}

// writeGuestSpec writes what the guest's init is told (guestspec), only
// when it changed, as ca.pem (credentials.go): each write is an fsync on
// the gate process's way to "go", and a resume or a restart of an
// unchanged sandbox would write the same bytes again.
func (d *daemon) writeGuestSpec() error {
	b, err := json.MarshalIndent(d.o.Guest, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(d.o.Plan.GuestDir, "guest.json")
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	return state.WriteAtomic(path, b, 0o644)
}

// lockDown jails the process (internal/lockdown): its uid, no
// capabilities, the seccomp filter, and of the host's files only its
// audit directory. What the standard library would read lazily from the
// host is read first.
func (d *daemon) lockDown(uid int) error {
	time.Now().Zone() // /etc/localtime, for the log's times
	lim := d.gateLimits()
	ppid := os.Getppid()
	binds := []lockdown.Bind{{Path: state.AuditDir(d.o.Dir), Writable: true}}
	// The system's root certificates, read-only, where Go looks for
	// them: read lazily at the first upstream TLS handshake the gate
	// verifies (most sandboxes have none), not on the start path.
	for _, p := range systemRoots() {
		binds = append(binds, lockdown.Bind{Path: p})
	}
	err := lockdown.Apply(lockdown.Config{
		UID: uid, GID: uid,
		Binds: binds,
		// A socket per guest connection and per session, the audit
		// log's files, the listeners of forwards, and room for the
		// runtime.
		NoFile:            uint64(2*lim.conns + 1024),
		ParentDeathSignal: unix.SIGKILL,
	})
	if err != nil {
		return err
	}
	// The parent-death signal, set again by Apply after the change of
	// uid, checked against a keeper that died in between.
	if os.Getppid() != ppid {
		return errors.New("the keeper is gone")
	}
	return nil
}

// oomKillAnswer is the gate process's answer to the keeper's "oom-kill":
// the guest agent's reply, read here.
type oomKillAnswer struct {
	OK   bool   `json:"ok"`
	What string `json:"what"`
	RSS  uint64 `json:"rss"`
}

// serveKeeper answers the keeper's calls.
func (d *daemon) serveKeeper(ctx context.Context, method string, body json.RawMessage) (any, []*os.File, error) {
	switch method {
	case "oom-kill":
		if d.proxy == nil {
			return oomKillAnswer{}, nil, nil
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ok, reply, err := d.proxy.GlobalRequest(ctx, guest.OOMKillRequest, nil)
		if err != nil {
			return nil, nil, err
		}
		return parseOOMKill(ok, reply), nil, nil
	}
	return nil, nil, fmt.Errorf("no call %q", method)
}

// hostAddrs are the host's own addresses, which the gate refuses like
// loopback. The jail has no netlink socket to list them: the keeper
// does. A failed call keeps the last list.
func (d *daemon) hostAddrs() func() []netip.Addr {
	if d.keeper == nil {
		return gate.HostAddrs
	}
	var mu sync.Mutex
	var last []netip.Addr
	return func() []netip.Addr {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var got []netip.Addr
		mu.Lock()
		defer mu.Unlock()
		if _, err := d.keeper.call(ctx, "addrs", nil, &got); err == nil {
			last = got
		}
		return last
	}
}

// host is the keeper's view of the sandbox (hostStatus).
func (d *daemon) host() hostStatus {
	if d.keeper == nil {
		return d.hostStatus()
	}
	var h hostStatus
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.keeper.call(ctx, "host", nil, &h)
	return h
}

// parseOOMKill reads the guest agent's answer to guest.OOMKillRequest:
// what it killed, and its "rss_kib=N".
func parseOOMKill(ok bool, reply []byte) oomKillAnswer {
	what := truncate(string(reply), 200)
	a := oomKillAnswer{OK: ok, What: what}
	if _, kib, found := strings.Cut(what, "rss_kib="); found {
		if f := strings.Fields(kib); len(f) > 0 {
			if n, err := strconv.ParseUint(f[0], 10, 64); err == nil {
				a.RSS = n << 10
			}
		}
	}
	return a
}

// dialAgentVia reaches the host's ssh-agent through the keeper (its
// dialAgent), in the gate process; nil elsewhere.
func (d *daemon) dialAgentVia() func() (net.Conn, error) {
	if d.keeper == nil {
		return nil
	}
	return func() (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fds, err := d.keeper.call(ctx, "agent", nil, nil)
		if err != nil {
			return nil, err
		}
		if len(fds) != 1 {
			closeFiles(fds)
			return nil, errors.New("the keeper sent no agent connection")
		}
		defer fds[0].Close()
		return net.FileConn(fds[0])
	}
}

// secretRemote reads secrets' file: and command: sources through the
// keeper (its readSecretSource), in the gate process; nil elsewhere.
func (d *daemon) secretRemote() secret.RemoteRead {
	if d.keeper == nil {
		return nil
	}
	return func(ctx context.Context, name string) ([]byte, error) {
		var a secretAnswer
		if _, err := d.keeper.call(ctx, "secret", secretRequest{Name: name}, &a); err != nil {
			return nil, err
		}
		return a.Value, nil
	}
}

// systemRoots are the places crypto/x509 reads the system's root
// certificates from on Linux that exist on this host (its own list, and
// SSL_CERT_FILE and SSL_CERT_DIR), for the jail to keep.
func systemRoots() []string {
	cands := []string{
		"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem",
		"/etc/pki/tls/cacert.pem", "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/ssl/cert.pem",
		"/etc/ssl/certs", "/etc/pki/tls/certs",
	}
	if f := os.Getenv("SSL_CERT_FILE"); f != "" {
		cands = append(cands, f)
	}
	cands = append(cands, filepath.SplitList(os.Getenv("SSL_CERT_DIR"))...)
	var out []string
	seen := map[string]bool{}
	for _, c := range cands {
		c = filepath.Clean(c)
		if !filepath.IsAbs(c) || seen[c] {
			continue
		}
		if _, err := os.Stat(c); err == nil {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out
}
