package lockdown

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	ok := Config{UID: 1000, GID: 1000, NoFile: 64}
	with := func(f func(*Config)) Config { c := ok; f(&c); return c }
	tests := []struct {
		name    string
		c       Config
		wantErr string // "" for valid
	}{
		{"minimal", ok, ""},
		{"root uid", with(func(c *Config) { c.UID = 0 }), "uid 0"},
		{"root gid", with(func(c *Config) { c.GID = 0 }), "gid 0"},
		{"negative uid", with(func(c *Config) { c.UID = -1 }), "uid -1"},
		{"no nofile", with(func(c *Config) { c.NoFile = 0 }), "NoFile"},
		{"relative bind", with(func(c *Config) { c.Binds = []Bind{{Path: "var/lib"}} }), `"var/lib"`},
		{"unclean bind", with(func(c *Config) { c.Binds = []Bind{{Path: "/var/../etc"}} }), `"/var/../etc"`},
		{"trailing slash", with(func(c *Config) { c.Binds = []Bind{{Path: "/var/"}} }), `"/var/"`},
		{"root bind", with(func(c *Config) { c.Binds = []Bind{{Path: "/"}} }), `"/"`},
		{"twice", with(func(c *Config) { c.Binds = []Bind{{Path: "/a"}, {Path: "/a", Writable: true}} }), "twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.c.validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("validate: got %v, want ErrConfig naming %s", err, tt.wantErr)
			}
		})
	}
}

// A bind inside another is mounted after it, whatever the order given.
func TestValidateOrdersParentsFirst(t *testing.T) {
	c := Config{UID: 1, GID: 1, NoFile: 1, Binds: []Bind{
		{Path: "/a/b/c"}, {Path: "/a-b"}, {Path: "/a/b"}, {Path: "/a"},
	}}
	binds, err := c.validate()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range binds {
		got = append(got, b.Path)
	}
	for i, p := range got {
		for _, q := range got[i+1:] {
			if strings.HasPrefix(p, q+"/") {
				t.Fatalf("order %v mounts %s before its parent %s", got, p, q)
			}
		}
	}
	if !slices.Contains(got, "/a-b") || len(got) != 4 {
		t.Fatalf("binds lost: %v", got)
	}
}
