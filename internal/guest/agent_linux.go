package guest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/agent"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/keys"
)

// newAgent configures the guest's SSH-protocol server from the spec.
func newAgent(spec *guestspec.Spec, children *agent.Children, log *slog.Logger) (*agent.Server, error) {
	host, err := keys.Host(filepath.Join(guestspec.Dir, filepath.Base(keys.HostKey)))
	if err != nil {
		return nil, fmt.Errorf("loading host key: %w", err)
	}
	auth, _, _, _, err := ssh.ParseAuthorizedKey([]byte(spec.AuthorizedKey))
	if err != nil {
		return nil, fmt.Errorf("parsing authorized key: %w", err)
	}
	shell := "/bin/sh"
	if _, err := os.Stat("/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	// srv is named for GlobalRequest: a fork's rekey changes it.
	var srv *agent.Server
	srv = &agent.Server{
		Shell:   shell,
		HostKey: host, AuthorizedKey: auth,
		UID: spec.UID, GID: spec.GID,
		Home: spec.Home, Dir: spec.Workspace, Env: spec.Env, Log: log,
		Children:    children,
		AgentSocket: spec.SSHAgentSocket,
		SFTPCommand: []string{guestspec.Binary, "__sftp"},
		// The daemon's OOM guard (oomkill_linux.go), answered in
		// process: no fork or exec while the guest is at its ceiling.
		GlobalRequest: func(name string, _ []byte) (bool, []byte) {
			if name == ForkRequest {
				return takeForkIdentity(srv, log)
			}
			if name != OOMKillRequest {
				return false, nil
			}
			what, err := OOMKill()
			if err != nil {
				return false, []byte(err.Error())
			}
			return true, []byte(what)
		},
	}
	return srv, nil
}

// serveAgent serves the agent on spec.Listen until ctx ends. The agent is
// the only way into the sandbox, so a listener that fails is opened again,
// with a pause that grows to 2 s rather than a tight loop.
func serveAgent(ctx context.Context, srv *agent.Server, listen string, log *slog.Logger) {
	for restarts := 0; ctx.Err() == nil; restarts++ {
		if restarts > 0 {
			select {
			case <-time.After(min(time.Duration(restarts)*100*time.Millisecond, 2*time.Second)):
			case <-ctx.Done():
				return
			}
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			log.Error("listening", "addr", listen, "err", err, "restarts", restarts)
			continue
		}
		if err := srv.Serve(ctx, ln); err != nil {
			log.Error("serving; listening again", "err", err, "restarts", restarts)
		}
	}
}
