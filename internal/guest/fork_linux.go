package guest

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/agent"
	"moat.dev/moat/internal/guestspec"
	"moat.dev/moat/internal/keys"
)

// takeForkIdentity answers ForkRequest. A forked guest is its parent's
// memory image: its agent holds the parent's keys and sessions' base
// environment (with the parent's placeholders), and the trust stores on
// its disk hold the parent's CA. The daemon has written the fork's own
// into /.moat (the fork's guest directory), which this reads again.
// Processes started before the fork keep what they loaded: the parent's
// placeholders (which the fork's gate does not know, so they are
// worthless there) and, if they read it, the parent's CA.
func takeForkIdentity(srv *agent.Server, log *slog.Logger) (bool, []byte) {
	if err := forkIdentity(srv, log); err != nil {
		log.Error("taking the fork's identity", "err", err)
		return false, []byte(err.Error())
	}
	log.Info("took the fork's own keys, placeholders and CA")
	return true, nil
}

func forkIdentity(srv *agent.Server, log *slog.Logger) error {
	spec, err := guestspec.Read(guestspec.File)
	if err != nil {
		return err
	}
	host, err := keys.Host(filepath.Join(guestspec.Dir, filepath.Base(keys.HostKey)))
	if err != nil {
		return fmt.Errorf("loading host key: %w", err)
	}
	auth, _, _, _, err := ssh.ParseAuthorizedKey([]byte(spec.AuthorizedKey))
	if err != nil {
		return fmt.Errorf("parsing authorized key: %w", err)
	}
	// installCA removes every moat CA from the stores before it adds
	// this one: the parent's goes.
	caFile, stores := trustCA(spec, log)
	if caFile != "" {
		if _, err := os.Stat(caFile); err != nil {
			return err
		}
	}
	return srv.Rekey(host, auth, sessionEnv(spec.Env, caFile, stores))
}
