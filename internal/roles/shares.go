package roles

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"moat.dev/moat/internal/agentstate"
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/daemon"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
	"moat.dev/moat/internal/ticket"
)

// CheckShares refuses a share that would hand the guest what it must
// never see: anything inside moat's state (each sandbox's keys, its CA's
// key, its control socket), a directory that contains that state (sharing
// all of ~ would), or a socket (a share of a docker or ssh-agent socket is
// a way out of the sandbox). Paths are judged after every symlink is
// resolved, at each start: a link in the share's path may have changed
// since the sandbox was created.
func CheckShares(shares []config.Share, protected string) error {
	prot, err := filepath.EvalSymlinks(protected)
	if err != nil {
		prot = filepath.Clean(protected)
	}
	for _, s := range shares {
		where := s.Path
		inside, contains := "share something else", "share a directory below it instead"
		switch s.Source {
		case "":
		case WorkspaceSource:
			where = "the workspace " + s.Path
			inside, contains = "run moat from a project directory outside it", "run moat from the project's own directory, below it"
		default:
			where = fmt.Sprintf("%s (share from %s)", s.Path, s.Source)
		}
		real, err := filepath.EvalSymlinks(s.Path)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s does not exist; create it or remove the share", where)
		}
		if err != nil {
			return fmt.Errorf("resolving %s: %w", where, err)
		}
		if Within(real, prot) {
			return fmt.Errorf("%s resolves to %s, inside moat's state (%s), which holds the sandboxes' keys; %s", where, real, prot, inside)
		}
		if Within(prot, real) {
			return fmt.Errorf("%s resolves to %s, which contains moat's state (%s) with the sandboxes' keys; %s", where, real, prot, contains)
		}
		st, err := os.Stat(real)
		if err != nil {
			return fmt.Errorf("reading %s: %w", where, err)
		}
		if st.Mode()&fs.ModeSocket != 0 {
			return fmt.Errorf("%s is a socket; sockets are not shared (a socket is a way out of the sandbox)", where)
		}
	}
	return nil
}

// WorkspaceSource marks the workspace among the shares CheckShares judges.
const WorkspaceSource = "the workspace"

// Within reports whether p is dir or inside it.
func Within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// ticketShares are the git mounts of the ticket whose workspace ws is,
// none for any other sandbox: added to the plan at each start
// (daemonOptions), so that they follow the worktrees the ticket has now.
func ticketShares(dirs state.Dirs, ws string) ([]runtime.Share, error) {
	// The gate process builds the same options but mounts nothing, and
	// runs jailed as a uid of its own that may not read the ticket's
	// record: the daemon's process alone needs these.
	if len(os.Args) > 1 && os.Args[1] == daemon.GateRole {
		return nil, nil
	}
	s, err := ticket.NewStore(dirs.State)
	if err != nil {
		return nil, err
	}
	t, err := s.ForWorkspace(ws)
	if err != nil || t == nil {
		return nil, err
	}
	ms, err := t.Mounts()
	if err != nil {
		return nil, err
	}
	var shares []config.Share
	var out []runtime.Share
	for _, m := range ms {
		shares = append(shares, config.Share{Path: m.Path, Source: "ticket " + t.Name})
		out = append(out, runtime.Share{Source: m.Path, Target: m.Path, RW: m.RW})
	}
	// The same refusals as any share: nothing of moat's state, no socket.
	if err := CheckShares(shares, dirs.State); err != nil {
		return nil, err
	}
	return out, nil
}

// agentShares are the mounts of the agents' state directories at the
// guest's ~/.claude and ~/.codex (internal/agentstate), folded in from the
// project's main line. Keeping the conversations is not worth a sandbox
// that does not start: a failure is logged and the sandbox starts
// without them (the agents then write into the guest's own layer), but a
// mount the share checks refuse is an error like any share's.
func agentShares(dirs state.Dirs, rec *state.Record, dir string, log *slog.Logger) ([]runtime.Share, error) {
	// The gate process builds the same options, jailed: it mounts nothing.
	if len(os.Args) > 1 && os.Args[1] == daemon.GateRole {
		return nil, nil
	}
	s, err := agentstate.NewStore(dirs.State)
	if err != nil {
		log.Warn("agents' conversations not kept", "err", err)
		return nil, nil
	}
	s.Note = func(m string) { log.Info("agent state: " + m) }
	// A guest restored from its checkpoint holds its files open: its
	// directory is mounted as it was, not rewritten.
	restoring := fileExists(runtime.SuspendDir(dir))
	ms, err := s.Start(rec.Workspace, rec.Name, rec.GuestUID, rec.GuestGID, restoring)
	if err != nil {
		log.Warn("agents' conversations not kept for this run", "err", err)
		return nil, nil
	}
	_, home := GuestUser(rec.GuestUID)
	var shares []config.Share
	var out []runtime.Share
	for _, m := range ms {
		shares = append(shares, config.Share{Path: m.Source, Source: "the agents' kept state"})
		out = append(out, runtime.Share{Source: m.Source, Target: filepath.Join(home, m.Target), RW: true})
	}
	if err := CheckShares(shares, dirs.State); err != nil {
		return nil, err
	}
	return out, nil
}

// saveAgentState commits and merges the sandbox's agent state when its
// daemon ends (the sandbox stopped or was suspended). It runs after the
// daemon's lock is released, so `moat down` may return first; whoever
// reads the state next (a start, moat sessions, destroy) commits the
// directory itself, under the same project lock.
func saveAgentState(dir string, log *slog.Logger) {
	warn := func(err error) { log.Warn("saving the agents' conversations", "err", err) }
	dirs, err := state.Resolve()
	if err != nil {
		warn(err)
		return
	}
	rec, err := state.Load(dir)
	if err != nil {
		warn(err)
		return
	}
	s, err := agentstate.NewStore(dirs.State)
	if err != nil {
		warn(err)
		return
	}
	s.Note = func(m string) { log.Info("agent state: " + m) }
	if err := s.Save(rec.Workspace, rec.Name); err != nil {
		warn(err)
	}
}
