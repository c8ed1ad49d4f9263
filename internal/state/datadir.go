package state

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
)

// DataDir is where moat keeps name's files that belong to the user rather
// than to moat's state (worktrees, agents' conversations): $MOAT_HOME/name
// when MOAT_HOME is set, else $XDG_DATA_HOME/moat/name, else
// ~/.local/share/moat/name, the home being the sudo user's under sudo, so
// that the files are theirs and the git moat runs as them reaches them
// (root's home is closed to it).
func DataDir(name string) (string, error) {
	switch h, xdg := os.Getenv("MOAT_HOME"), os.Getenv("XDG_DATA_HOME"); {
	case h != "":
		abs, err := filepath.Abs(h)
		if err != nil {
			return "", fmt.Errorf("resolving MOAT_HOME: %w", err)
		}
		return filepath.Join(abs, name), nil
	case filepath.IsAbs(xdg):
		return filepath.Join(xdg, "moat", name), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("finding home directory (set MOAT_HOME instead): %w", err)
	}
	if h := sudoHome(); h != "" {
		home = h
	}
	return filepath.Join(home, ".local", "share", "moat", name), nil
}

// sudoHome is the home of the user who ran moat through sudo, or "".
func sudoHome() string {
	uid := os.Getenv("SUDO_UID")
	if os.Geteuid() != 0 || uid == "" || uid == "0" {
		return ""
	}
	u, err := user.LookupId(uid)
	if err != nil {
		return ""
	}
	return u.HomeDir
}
