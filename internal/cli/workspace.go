package cli

import (
	"fmt"
	"io/fs"
	"os/user"
	"strconv"
	"syscall"

	"moat.dev/moat/internal/state"
)

// usableWorkspace refuses a session in a workspace the agent user cannot
// enter and read: the command would fail inside the guest with a bare
// "permission denied" that names neither the directory nor the reason.
func usableWorkspace(rec *state.Record) error {
	var st syscall.Stat_t
	if err := syscall.Stat(rec.Workspace, &st); err != nil {
		return nil // the start reports a workspace that is gone
	}
	return workspaceAccess(rec.Workspace, int(st.Uid), int(st.Gid), fs.FileMode(st.Mode&0o777), rec.GuestUID, rec.GuestGID)
}

// workspaceAccess is usableWorkspace's decision, on the mode bits alone
// (moat does not read ACLs): the agent needs to read and enter the
// directory. uid 0 in the guest reaches the workspace as the gofer does,
// as root.
func workspaceAccess(ws string, ownerUID, ownerGID int, perm fs.FileMode, uid, gid int) error {
	const need = 0o5 // r-x
	var have fs.FileMode
	switch {
	case uid == 0:
		return nil
	case uid == ownerUID:
		have = perm >> 6
	case gid == ownerGID:
		have = perm >> 3
	default:
		have = perm
	}
	if have&need == need {
		return nil
	}
	return fmt.Errorf("the agent user (uid %d) cannot use the workspace %s: it belongs to %s with mode %04o; "+
		"run moat as its owner (sudo -u %s moat …), or give others access: chmod o+rx %s",
		uid, ws, ownerName(ownerUID), perm, ownerName(ownerUID), ws)
}

func ownerName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username + " (uid " + strconv.Itoa(uid) + ")"
	}
	return "uid " + strconv.Itoa(uid)
}
