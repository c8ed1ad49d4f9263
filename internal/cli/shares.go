package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"moat.dev/moat/internal/config"
)

// checkShares refuses a share that would hand the guest what it must
// never see: anything inside moat's state (each sandbox's keys, its CA's
// key, its control socket), a directory that contains that state (sharing
// all of ~ would), or a socket (a share of a docker or ssh-agent socket is
// a way out of the sandbox). Paths are judged after every symlink is
// resolved, at each start: a link in the share's path may have changed
// since the sandbox was created.
func checkShares(shares []config.Share, protected string) error {
	prot, err := filepath.EvalSymlinks(protected)
	if err != nil {
		prot = filepath.Clean(protected)
	}
	for _, s := range shares {
		where := s.Path
		inside, contains := "share something else", "share a directory below it instead"
		switch s.Source {
		case "":
		case workspaceSource:
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
		if within(real, prot) {
			return fmt.Errorf("%s resolves to %s, inside moat's state (%s), which holds the sandboxes' keys; %s", where, real, prot, inside)
		}
		if within(prot, real) {
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

// workspaceSource marks the workspace among the shares checkShares judges.
const workspaceSource = "the workspace"

// within reports whether p is dir or inside it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}
