package guest

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/agent"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/keys"
)

// Agent is the guest's SSH-protocol server, started by init.
func Agent() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "agent")
	spec, err := guestspec.Read(guestspec.File)
	if err != nil {
		log.Error("reading spec", "err", err)
		return 1
	}
	host, err := keys.Host(filepath.Join(guestspec.Dir, filepath.Base(keys.HostKey)))
	if err != nil {
		log.Error("loading host key", "err", err)
		return 1
	}
	auth, _, _, _, err := ssh.ParseAuthorizedKey([]byte(spec.AuthorizedKey))
	if err != nil {
		log.Error("parsing authorized key", "err", err)
		return 1
	}
	ln, err := net.Listen("tcp", spec.Listen)
	if err != nil {
		log.Error("listening", "addr", spec.Listen, "err", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer cancel()
	shell := "/bin/sh"
	if _, err := os.Stat("/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	srv := &agent.Server{
		Shell:   shell,
		HostKey: host, AuthorizedKey: auth,
		UID: spec.UID, GID: spec.GID,
		Home: spec.Home, Dir: spec.Workspace, Env: spec.Env, Log: log,
	}
	if err := srv.Serve(ctx, ln); err != nil {
		log.Error("serving", "err", err)
		return 1
	}
	return 0
}
