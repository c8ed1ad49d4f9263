package userns

import (
	"errors"
	"os"
	"os/user"
	"strings"
	"testing"
)

func TestConfigForErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "alice:100000:65536\n")
	u := &user.User{Username: "alice", Uid: "1001", Gid: "1001"}
	tests := []struct {
		name           string
		subuid, subgid string
		err            error
		errPart        string
	}{
		{"no subuid file", dir + "/missing", good, ErrNoSubIDs, dir + "/missing does not exist; as root, give the user a range"},
		{"no entry", write("other", "bob:100000:65536\n"), good, ErrNoSubIDs, "has no range for user alice; as root, give the user a range no other user has, e.g.: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 alice"},
		{"bad subgid line", good, write("bad", "alice:1\n"), nil, dir + "/bad:1: \"alice:1\" is not USER:START:COUNT"},
		{"small subgid range", good, write("small", "1001:200000:10\n"), ErrNoSubIDs, "gives alice 10 subordinate ids"},
	}
	for _, tt := range tests {
		_, err := ConfigFor(u, KeepIDs, tt.subuid, tt.subgid)
		if err == nil || !strings.Contains(err.Error(), tt.errPart) {
			t.Errorf("%s: error %v, want one containing %q", tt.name, err, tt.errPart)
		}
		if tt.err != nil && !errors.Is(err, tt.err) {
			t.Errorf("%s: error %v is not %v", tt.name, err, tt.err)
		}
	}
}
