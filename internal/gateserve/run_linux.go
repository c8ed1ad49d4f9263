package gateserve

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/gate"
	"moat.dev/moat/internal/lockdown"
)

// jailedEnv marks the child that runs the service in a mount namespace of
// its own, which lockdown needs (its new root must not be the host's).
const jailedEnv = "MOAT_GATE_SERVE_JAILED"

// Run is `moat gate serve --config path`. Started as root, it starts
// itself again in a mount namespace of its own and waits for that child,
// passing on SIGHUP (reload), SIGTERM and SIGINT (stop): the parent reads
// nothing a client sends. The child binds the listeners (and routes a
// names range to itself: names_linux.go), reads the
// configuration, the CA and the secrets, then jails itself
// (internal/lockdown, as a sandbox's gate process does): service.uid, no
// capabilities, the seccomp filter, and of the host's files only the
// directories it must read again on reload and write its audit to. It
// returns when the service stops: ctx ends or a signal says so.
func Run(ctx context.Context, path string, log *slog.Logger) error {
	if os.Getenv(jailedEnv) == "1" {
		return runJailed(ctx, path, log)
	}
	if os.Geteuid() != 0 {
		return errors.New("moat gate serve binds its ports as root and then drops to service.uid in a jail; run it as root (sudo moat gate serve --config FILE)")
	}
	// Checked here too, so a mistake is reported before anything starts.
	cfg, err := LoadConfig(path)
	if err != nil {
		return err
	}
	if cfg.Names.IsValid() {
		// The child routes the names range to itself; whatever of that
		// outlives it (the route always, the nftables table on kernels
		// before 5.12) is removed here, as root, however it ended.
		defer func() {
			if err := removeInterception(cfg.Names); err != nil {
				log.Warn("gate service: removing the names range's route and table", "names", cfg.Names, "err", err)
			}
		}()
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding moat's own binary: %w", err)
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), jailedEnv+"=1")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS, Pdeathsig: unix.SIGKILL}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGHUP, unix.SIGTERM, unix.SIGINT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the jailed gate service: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			cmd.Process.Signal(sig)
		case <-ctx.Done():
			cmd.Process.Signal(unix.SIGTERM)
			select {
			case err := <-done:
				return err
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				return <-done
			}
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return fmt.Errorf("the gate service stopped: %s", ee.ProcessState)
			}
			return err
		}
	}
}

func runJailed(ctx context.Context, path string, log *slog.Logger) error {
	// The parent's signals are ours to act on; registered first so a
	// SIGHUP during set-up is not the default (exit).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGHUP, unix.SIGTERM, unix.SIGINT)
	defer signal.Stop(sigs)
	cfg, err := LoadConfig(path)
	if err != nil {
		return err
	}
	ls, err := Listen(cfg)
	if err != nil {
		return err
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	svc, err := New(Options{Config: cfg, Listeners: ls, Log: log, SystemRoots: roots, HostAddrs: gate.HostAddrs()})
	if err != nil {
		ls.Close()
		return err
	}
	binds, reread, err := svc.jailBinds()
	if err != nil {
		ls.Close()
		return err
	}
	for _, p := range reread {
		if !readableBy(p, cfg.UID, cfg.GID) {
			log.Warn("gate service: a reload reads this file as service.uid, which cannot read it; make it readable by the uid or gid, or reloads will be refused",
				"file", p, "uid", cfg.UID, "gid", cfg.GID)
		}
	}
	time.Now().Zone() // /etc/localtime, for the log's times
	err = lockdown.Apply(lockdown.Config{UID: cfg.UID, GID: cfg.GID, Binds: binds,
		NoFile:            noFile(),
		ParentDeathSignal: unix.SIGKILL,
	})
	if err != nil {
		// Partly jailed, or not at all: stop rather than serve (fail
		// closed).
		return fmt.Errorf("jailing the gate service: %w", err)
	}
	log.Info("gate service jailed and serving", "uid", cfg.UID, "tenants", len(cfg.Tenants),
		"dns", cfg.DNS, "http", cfg.HTTP, "https", cfg.HTTPS, "names", cfg.Names, "ca_cert", cfg.CACert)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-sigs:
				if sig != unix.SIGHUP {
					log.Info("gate service stopping", "signal", sig.String())
					cancel()
					return
				}
				if err := svc.Reload(); err != nil {
					log.Error("gate service: reload refused; the previous configuration stays in force", "err", err)
				} else {
					log.Info("gate service reloaded", "config", path)
				}
			}
		}
	}()
	return svc.Serve(ctx)
}

// jailBinds are the host paths the jailed service keeps: writable, the
// directories of its audit logs and placeholder files (owned by
// service.uid from now on, with the files it writes there); read-only,
// the directories of what a reload reads again: the configuration, the
// tenants' policy files, file: secrets and trust roots. Directories, not
// files: an editor replaces a file by renaming a new one over it, which a
// bind of the old file would never show.
//
// It also returns the files a reload reads again, for the caller to check
// that service.uid can read them.
func (s *Service) jailBinds() (binds []lockdown.Bind, reread []string, err error) {
	rw := map[string]bool{}
	own := func(file string) error {
		dir := filepath.Dir(file)
		rw[dir] = true
		if err := os.Chown(dir, s.cfg.UID, s.cfg.GID); err != nil {
			return err
		}
		// The file and its rotations and noise series.
		matches, _ := filepath.Glob(filepath.Join(dir, strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))+"*"))
		for _, m := range matches {
			if err := os.Lchown(m, s.cfg.UID, s.cfg.GID); err != nil {
				return err
			}
		}
		return nil
	}
	if err := own(s.cfg.Audit); err != nil {
		return nil, nil, err
	}
	reread = []string{s.cfg.Path}
	if k := s.cfg.Kube; k != nil {
		if err := own(k.Audit); err != nil {
			return nil, nil, err
		}
		// The API client reads its credentials again as they rotate: the
		// kubelet swaps the ServiceAccount token's directory in place.
		if k.Kubeconfig != "" {
			reread = append(reread, k.Kubeconfig)
		} else {
			reread = append(reread, filepath.Join(serviceAccountDir, "token"))
		}
	}
	for _, t := range s.tenants.Load().byName {
		if err := own(t.cfg.Audit); err != nil {
			return nil, nil, err
		}
		if err := own(t.cfg.Placeholders); err != nil {
			return nil, nil, err
		}
		reread = append(reread, t.cfg.Policy...)
		r, err := readRules(t.cfg, s.roots)
		if err != nil {
			return nil, nil, err
		}
		for _, sec := range r.secrets {
			if p, ok := strings.CutPrefix(sec.From, "file:"); ok {
				reread = append(reread, p)
			}
		}
		reread = append(reread, r.network.Trust...)
	}
	var ro []string
	for _, p := range reread {
		ro = append(ro, filepath.Dir(p))
	}
	for d := range rw {
		binds = append(binds, lockdown.Bind{Path: d, Writable: true})
	}
	seen := map[string]bool{}
	for _, d := range ro {
		d = filepath.Clean(d)
		if rw[d] || seen[d] || d == "/" {
			continue
		}
		seen[d] = true
		if _, err := os.Stat(d); err == nil {
			binds = append(binds, lockdown.Bind{Path: d})
		}
	}
	return binds, reread, nil
}

// serviceAccountDir is where a pod's ServiceAccount token is mounted
// (client-go's rest.InClusterConfig reads it there).
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// readableBy reports whether uid (with group gid and no others) may read
// path, and search its directory (the jail binds the directory), by the
// mode bits alone.
func readableBy(path string, uid, gid int) bool {
	return permits(path, uid, gid, 0o4) && permits(filepath.Dir(path), uid, gid, 0o1)
}

// permits checks one permission (4 read, 1 search) for uid and gid.
func permits(path string, uid, gid int, bit uint32) bool {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false
	}
	switch {
	case int(st.Uid) == uid:
		return st.Mode&(bit<<6) != 0
	case int(st.Gid) == gid:
		return st.Mode&(bit<<3) != 0
	}
	return st.Mode&bit != 0
}

// noFile is the jail's RLIMIT_NOFILE: a socket per client connection and
// per upstream, the audit logs' files and room for the runtime want 65536;
// raising the hard limit is not the service's to do, so at most that.
func noFile() uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Max > 65536 {
		return 65536
	}
	return lim.Max
}
