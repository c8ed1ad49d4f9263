package userns

import (
	"errors"
	"os"
	"os/user"
	"slices"
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

func TestGateMaps(t *testing.T) {
	c := &Config{
		UIDMap: []IDMap{{0, 100000, 1001}, {1001, 1001, 1}, {1002, 101001, 64535}},
		GIDMap: []IDMap{{0, 100000, 1000}, {1000, 1000, 1}, {1001, 101000, 64536}},
	}
	tests := []struct {
		uid, gid     uint32
		wantU, wantG []IDMap
	}{
		// The gid at inside id uid (the gate's gid is its uid), and one
		// subordinate gid at nogroup's, so that newgidmap allows setgroups.
		{1001, 1000, []IDMap{{1001, 1001, 1}}, []IDMap{{1001, 1000, 1}, {65534, 100000, 1}}},
		{65534, 1000, []IDMap{{65534, 65534, 1}}, []IDMap{{65534, 1000, 1}, {65533, 100000, 1}}},
	}
	for _, tt := range tests {
		g := c.Gate(tt.uid, tt.gid)
		if !slices.Equal(g.UIDMap, tt.wantU) || !slices.Equal(g.GIDMap, tt.wantG) {
			t.Errorf("Gate(%d, %d) = %v, %v; want %v, %v", tt.uid, tt.gid, g.UIDMap, g.GIDMap, tt.wantU, tt.wantG)
		}
	}
	if len(c.UIDMap) != 3 || len(c.GIDMap) != 3 {
		t.Errorf("Gate changed its receiver: %v, %v", c.UIDMap, c.GIDMap)
	}
}

func TestMapsZero(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		content string
		want    bool
	}{
		{"         0     100000       1001\n      1001       1001          1\n", true},
		{"      1001       1001          1\n     65534     100000          1\n", false},
		{"", false},
	} {
		p := dir + "/map"
		os.WriteFile(p, []byte(tt.content), 0o644)
		if got := mapsZero(p); got != tt.want {
			t.Errorf("mapsZero(%q) = %v, want %v", tt.content, got, tt.want)
		}
	}
}
