package cli

import (
	"io/fs"
	"strings"
	"testing"
)

func TestWorkspaceAccess(t *testing.T) {
	tests := []struct {
		owner, group int
		perm         uint32
		uid, gid     int
		ok           bool
	}{
		{0, 0, 0o700, 0, 0, true},        // root in the guest
		{0, 0, 0o700, 1234, 1234, false}, // someone else's private directory
		{0, 0, 0o755, 1234, 1234, true},  // readable: write failures are the command's own
		{1234, 1234, 0o700, 1234, 1234, true},
		{1234, 50, 0o070, 1234, 50, false}, // the owner's bits decide for the owner
		{0, 50, 0o750, 1234, 50, true},     // by group
		{0, 50, 0o701, 1234, 1234, false},  // x without r
	}
	for _, tt := range tests {
		err := workspaceAccess("/p", tt.owner, tt.group, fs.FileMode(tt.perm), tt.uid, tt.gid)
		if (err == nil) != tt.ok {
			t.Errorf("owner %d:%d mode %04o, agent %d:%d: err = %v, want ok=%v", tt.owner, tt.group, tt.perm, tt.uid, tt.gid, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "/p") {
			t.Errorf("the error does not name the workspace: %v", err)
		}
	}
}
