// Package guest is what runs inside the sandbox: moat init, PID 1, which
// also serves the moat agent, the SSH-protocol server every session goes
// through.
//
// Init prepares the guest from guest.json, written by the daemon: the agent
// user with passwordless sudo (written by init itself, so images need not
// ship useradd), the resolver; then serves the agent, reaps every orphan,
// and on SIGTERM stops everything cleanly. It must never exit by accident:
// when PID 1 exits, the sandbox is gone. The agent shares its process (see
// agent.Children for why): a listener that fails is reopened, and a panic
// while serving one connection ends that connection only.
package guest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/agent"
	"moat.dev/moat/internal/guestspec"
)

// shutdownGrace is how long processes get between SIGTERM and SIGKILL when
// the sandbox stops: long enough for an editor or git to finish a write.
const shutdownGrace = 5 * time.Second

// Init is PID 1 of the guest.
func Init() int {
	base := slog.New(slog.NewTextHandler(os.Stderr, nil))
	log, agentLog := base.With("component", "init"), base.With("component", "agent")
	spec, err := guestspec.Read(guestspec.File)
	if err != nil {
		log.Error("cannot start guest", "err", err)
		return 1
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT)

	// The agent starts serving while init writes the user's files, so the
	// daemon's connection and handshake overlap that work; sessions wait
	// for it (agent.Server.Ready).
	children := agent.NewChildren()
	srv, err := newAgent(spec, children, agentLog)
	if err != nil {
		log.Error("configuring agent", "err", err)
		return 1
	}
	ready := make(chan struct{})
	srv.Ready = ready
	ctx, stopAgent := context.WithCancel(context.Background())
	defer stopAgent()
	var serving sync.WaitGroup
	serving.Go(func() { serveAgent(ctx, srv, spec.Listen, agentLog) })
	// The trust stores and the guest's identity files are independent:
	// written at once, the guest kernel's file work on them overlaps
	// (about half the time, which every cold start waits for).
	var caFile string
	var stores trust
	var trusting sync.WaitGroup
	trusting.Go(func() { caFile, stores = trustCA(spec, log) })
	err = prepare(spec)
	trusting.Wait()
	if err != nil {
		log.Error("preparing guest", "err", err)
		return 1
	}
	srv.Env = sessionEnv(spec.Env, caFile, stores) // read by sessions only, after ready
	close(ready)

	for sig := range sigs {
		switch sig {
		case unix.SIGTERM, unix.SIGINT:
			// The agent first: it kills its sessions' process groups and
			// reports to their clients; then everything else.
			stopAgent()
			serving.Wait()
			shutdown(log)
			return 0
		case unix.SIGCHLD:
			children.Reap()
		}
	}
	return 0
}

func shutdown(log *slog.Logger) {
	log.Info("stopping guest")
	unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(shutdownGrace)
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.ECHILD) {
			break
		}
		if pid <= 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
}

// prepare writes the guest's identity files. It runs on every start; each
// step replaces what an earlier start wrote rather than appending again.
// The user's files and the rest are written at once.
func prepare(s *guestspec.Spec) error {
	var user error
	var wg sync.WaitGroup
	wg.Go(func() { user = prepareUser(s) })
	err := prepareSystem(s)
	wg.Wait()
	return errors.Join(user, err)
}

// prepareUser writes the agent user into passwd, group and shadow, and
// makes its home.
func prepareUser(s *guestspec.Spec) error {
	if err := writeUser(s); err != nil {
		return fmt.Errorf("creating user %s: %w", s.User, err)
	}
	if err := os.MkdirAll(s.Home, 0o755); err != nil {
		return fmt.Errorf("creating home: %w", err)
	}
	os.Chown(s.Home, s.UID, s.GID)
	return nil
}

// prepareSystem writes the rest: temporary directories, sudoers, the
// resolver, hosts, hostname and the TCP windows.
func prepareSystem(s *guestspec.Spec) error {
	for _, d := range []string{"/tmp", "/var/tmp"} {
		// os.FileMode keeps the sticky bit in ModeSticky, not in 0o1000:
		// a bare 0o1777 would leave /tmp world-writable without it.
		os.MkdirAll(d, os.ModeSticky|0o777)
		os.Chmod(d, os.ModeSticky|0o777)
	}
	if _, err := os.Stat("/etc/sudoers.d"); err == nil || sudoPresent() {
		os.MkdirAll("/etc/sudoers.d", 0o750)
		line := s.User + " ALL=(ALL:ALL) NOPASSWD: ALL\nDefaults:" + s.User + " !requiretty\n"
		if err := os.WriteFile("/etc/sudoers.d/90-moat", []byte(line), 0o440); err != nil {
			return fmt.Errorf("writing sudoers: %w", err)
		}
	}
	if s.Nameserver != "" {
		os.Remove("/etc/resolv.conf") // often a symlink into the host's /run
		if err := os.WriteFile("/etc/resolv.conf", []byte("nameserver "+s.Nameserver+"\noptions timeout:2 attempts:2\n"), 0o644); err != nil {
			return fmt.Errorf("writing resolv.conf: %w", err)
		}
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", s.Hostname)
	if err := os.WriteFile("/etc/hosts", []byte(hosts), 0o644); err != nil {
		return fmt.Errorf("writing hosts: %w", err)
	}
	os.WriteFile("/etc/hostname", []byte(s.Hostname+"\n"), 0o644)
	// The guest's TCP windows, as large as the gate's (netstack.go): the
	// path to the gate is a memory copy, bounded by the window. gVisor's
	// netstack honours these; a failure only costs throughput.
	os.WriteFile("/proc/sys/net/ipv4/tcp_rmem", []byte("4096 4194304 16777216"), 0o644)
	os.WriteFile("/proc/sys/net/ipv4/tcp_wmem", []byte("4096 4194304 16777216"), 0o644)
	return nil
}

// trustCA adds the sandbox CA, and the [network] trust roots the daemon
// put after it in the same file, to the guest's trust stores and returns
// the file's path ("" when there is none to trust). A failure is logged,
// not fatal: without the CA only the connections the gate inspects fail,
// without a root only those to hosts it splices, and both fail closed, at
// the client's certificate check.
func trustCA(s *guestspec.Spec, log *slog.Logger) (string, trust) {
	if s.CAFile == "" {
		return "", trust{} // a record from before TLS inspection
	}
	ca, err := os.ReadFile(s.CAFile)
	if err != nil {
		log.Warn("reading the sandbox CA; inspected TLS connections will not verify", "err", err)
		return "", trust{}
	}
	t, err := installCA("/", ca)
	if err != nil {
		log.Warn("adding the sandbox CA and the [network] trust roots to the trust stores; programs using the failed ones will not verify inspected TLS connections (or, for a root, spliced ones)", "err", err)
	}
	if len(t.changed) > 0 {
		log.Info("trusting the sandbox CA", "trust_roots", t.roots, "wrote", t.changed)
	}
	return s.CAFile, t
}

func sudoPresent() bool {
	for _, p := range []string{"/usr/bin/sudo", "/bin/sudo"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// writeUser puts the agent user into passwd and group, replacing any entry
// with the same name or id, and adds it to the sudo/wheel groups.
func writeUser(s *guestspec.Spec) error {
	shell := "/bin/sh"
	if _, err := os.Stat("/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	uid, gid := strconv.Itoa(s.UID), strconv.Itoa(s.GID)
	passwd := fmt.Sprintf("%s:x:%s:%s:moat agent:%s:%s", s.User, uid, gid, s.Home, shell)
	if err := rewrite("/etc/passwd", func(f []string) bool { return f[0] == s.User || (len(f) > 2 && f[2] == uid) }, passwd); err != nil {
		return err
	}
	// The host's shadow is hidden from the guest; without an entry PAM's
	// account check (which sudo runs even with NOPASSWD) refuses the user.
	// "*": no password can log in; the account itself is valid.
	if err := ensureShadow(s.User); err != nil {
		return err
	}
	group := fmt.Sprintf("%s:x:%s:", s.User, gid)
	if err := rewrite("/etc/group", func(f []string) bool { return f[0] == s.User || (len(f) > 2 && f[2] == gid) }, group); err != nil {
		return err
	}
	return nil
}

func ensureShadow(user string) error {
	passwd, _ := os.ReadFile("/etc/passwd")
	old, _ := os.ReadFile("/etc/shadow")
	have := map[string]bool{}
	var out []string
	for _, l := range strings.Split(strings.TrimRight(string(old), "\n"), "\n") {
		if f := strings.Split(l, ":"); l != "" && f[0] != user {
			have[f[0]] = true
			out = append(out, l)
		}
	}
	for _, l := range strings.Split(string(passwd), "\n") {
		name, _, _ := strings.Cut(l, ":")
		if name != "" && !have[name] {
			out = append(out, name+":*:19000:0:99999:7:::")
		}
	}
	os.Remove("/etc/shadow")
	return os.WriteFile("/etc/shadow", []byte(strings.Join(out, "\n")+"\n"), 0o640)
}

func rewrite(path string, drop func([]string) bool, add string) error {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var out []string
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if line == "" {
			continue
		}
		if drop(strings.Split(line, ":")) {
			continue
		}
		out = append(out, line)
	}
	out = append(out, add)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	os.Remove(path)
	return os.WriteFile(path, []byte(strings.Join(out, "\n")+"\n"), 0o644)
}
