package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// mustParse parses doc as the file at path, with HOME=/home/u.
func mustParse(t *testing.T, path, doc string) *File {
	t.Helper()
	t.Setenv("HOME", "/home/u")
	f, err := Parse(path, []byte(doc))
	if err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	return f
}

const (
	userPath    = "/home/u/.config/moat/config.toml"
	projectPath = "/work/proj/moat.toml"
)

func TestMergeDefaults(t *testing.T) {
	got := Merge()
	want := Defaults()
	if !reflect.DeepEqual(got.Sandbox, want.Sandbox) || got.Sources != nil {
		t.Errorf("Merge() = %+v, want defaults %+v", got, want)
	}
	if got := Merge(nil, nil); !reflect.DeepEqual(got.Sandbox, want.Sandbox) || got.Sources != nil {
		t.Errorf("Merge(nil, nil) = %+v", got)
	}
	d := Defaults().Sandbox
	wantSandbox := Sandbox{Image: "host", Runtime: "gvisor", CPUs: 4, MemoryBytes: 1 << 30,
		MemoryMaxBytes: 4 << 30, PidsMax: 4096, IdleTimeout: 30 * time.Minute}
	if d != wantSandbox {
		t.Errorf("Defaults().Sandbox = %+v, want %+v", d, wantSandbox)
	}
	if err := Merge().Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
}

func TestMergeScalars(t *testing.T) {
	user := mustParse(t, userPath, `
[sandbox]
image = "debian:bookworm"
cpus = 8
pids_max = 100
idle_timeout = "off"
daemon_memory_max = "256MiB"
platform = "systrap"
`)
	project := mustParse(t, projectPath, `
[sandbox]
name = "api"
cpus = 2
idle_timeout = "2h"
`)
	got := Merge(user, project).Sandbox
	want := Sandbox{Name: "api", Image: "debian:bookworm", Runtime: "gvisor", CPUs: 2,
		MemoryBytes: 1 << 30, MemoryMaxBytes: 4 << 30, PidsMax: 100, IdleTimeout: 2 * time.Hour, DaemonMemoryMaxBytes: 256 << 20,
		Platform: "systrap"}
	if got != want {
		t.Errorf("user+project:\ngot  %+v\nwant %+v", got, want)
	}
	// Order is precedence: the last file wins.
	got = Merge(project, user).Sandbox
	want = Sandbox{Name: "api", Image: "debian:bookworm", Runtime: "gvisor", CPUs: 8,
		MemoryBytes: 1 << 30, MemoryMaxBytes: 4 << 30, PidsMax: 100, IdleOff: true, DaemonMemoryMaxBytes: 256 << 20,
		Platform: "systrap"}
	if got != want {
		t.Errorf("project+user:\ngot  %+v\nwant %+v", got, want)
	}
}

func TestMergeMemory(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name          string
		user, project string
		mem, max      uint64
		wantErr       string
	}{
		{"defaults", "", "", 1 * gib, 4 * gib, ""},
		{"bare memory is fixed size", "", `sandbox.memory = "512MiB"`, 512 << 20, 512 << 20, ""},
		{"bare memory above default ceiling", "", `sandbox.memory = "8GiB"`, 8 * gib, 8 * gib, ""},
		{"both in one file", "", "[sandbox]\nmemory = \"2GiB\"\nmemory_max = \"6GiB\"", 2 * gib, 6 * gib, ""},
		{"max only", "", `sandbox.memory_max = "8GiB"`, 1 * gib, 8 * gib, ""},
		{"narrower max lifts user's fixed size", `sandbox.memory = "2GiB"`, `sandbox.memory_max = "8GiB"`, 2 * gib, 8 * gib, ""},
		{"narrower bare memory fixes again", "[sandbox]\nmemory = \"1GiB\"\nmemory_max = \"8GiB\"", `sandbox.memory = "3GiB"`, 3 * gib, 3 * gib, ""},
		{"user max, project bare memory", `sandbox.memory_max = "16GiB"`, `sandbox.memory = "2GiB"`, 2 * gib, 2 * gib, ""},
		{"max below default memory", "", "\n[sandbox]\nmemory_max = \"512MiB\"", 0, 0,
			projectPath + ":3:14: sandbox.memory_max: 512MiB is less than sandbox.memory 1GiB (built-in default); raise memory_max, or set memory in the same file"},
		{"project max below user memory", "[sandbox]\nmemory = \"4GiB\"", "[sandbox]\nmemory_max = \"2GiB\"", 0, 0,
			projectPath + ":2:14: sandbox.memory_max: 2GiB is less than sandbox.memory 4GiB (" + userPath + ":2:10)"},
		{"project memory above user max", "[sandbox]\nmemory = \"1GiB\"\nmemory_max = \"2GiB\"", "", 1 * gib, 2 * gib, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var layers []*File
			if tt.user != "" {
				layers = append(layers, mustParse(t, userPath, tt.user))
			}
			if tt.project != "" {
				layers = append(layers, mustParse(t, projectPath, tt.project))
			}
			c := Merge(layers...)
			err := c.Validate()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalid) {
					t.Errorf("Validate() = %v\nwant ErrInvalid containing %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate() = %v", err)
			}
			if c.Sandbox.MemoryBytes != tt.mem || c.Sandbox.MemoryMaxBytes != tt.max {
				t.Errorf("memory = %s / %s, want %s / %s", FormatSize(c.Sandbox.MemoryBytes),
					FormatSize(c.Sandbox.MemoryMaxBytes), FormatSize(tt.mem), FormatSize(tt.max))
			}
		})
	}
}

func TestValidatePointsAtNarrowerMemory(t *testing.T) {
	// The project raised memory above the user's explicit ceiling: the
	// project's memory line is the one to change.
	user := mustParse(t, userPath, "[sandbox]\nmemory_max = \"2GiB\"")
	project := mustParse(t, projectPath, "[sandbox]\n\nmemory = \"3GiB\"\nmemory_max = \"3GiB\"")
	if err := Merge(user, project).Validate(); err != nil {
		t.Errorf("explicit max in the same file: %v", err)
	}
	flags := &File{Path: "command line", Sandbox: SandboxLayer{MemoryMaxBytes: ptr(uint64(1 << 30))}}
	err := Merge(user, project, flags).Validate()
	want := "command line: sandbox.memory_max: 1GiB is less than sandbox.memory 3GiB (" + projectPath + ":3:10)"
	if err == nil || err.Error() != want+"; raise memory_max, or set memory in the same file" {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	// A flag memory above a file's explicit ceiling: still fixed-size.
	flags = &File{Path: "command line", Sandbox: SandboxLayer{MemoryBytes: ptr(uint64(8 << 30))}}
	if c := Merge(user, project, flags); c.Validate() != nil || c.Sandbox.MemoryMaxBytes != 8<<30 {
		t.Errorf("flag memory: %+v, %v", c.Sandbox, c.Validate())
	}
}

func TestMergeLists(t *testing.T) {
	user := mustParse(t, userPath, `
[[shares]]
path = "~/notes"
[[shares]]
path = "~/data"
target = "/data"

[network]
use = ["default"]
allow = ["a.example.com", "b.example.com"]
block = ["t.example.com"]

[secrets.GH]
from = "env:GH"
hosts = ["api.github.com"]
[secrets.NPM]
from = "env:NPM"
hosts = ["registry.example.net"]

[env]
EDITOR = "vi"
LANG = "C.UTF-8"

[forwards]
ports = [3000, 8080]
reverse = [5432]

[hooks]
on_create = ["echo user", "go mod download"]
`)
	project := mustParse(t, projectPath, `
[[shares]]
path = "data"
target = "/data"
rw = true

[network]
use = ["default", "go"]
allow = ["b.example.com", "c.example.com"]

[secrets.GH]
from = "command:gh auth token"
hosts = ["github.com"]

[env]
LANG = "en_US.UTF-8"
DEBUG = "1"

[forwards]
ports = ["8080:80", 9000]
reverse = ["5433:5432"]

[hooks]
on_create = ["go mod download", "make"]
on_up = ["./start.sh"]
`)
	got := Merge(user, project)
	want := Config{
		Sandbox: Defaults().Sandbox,
		Shares: []Share{
			{Path: "/home/u/notes", Target: "/home/u/notes", Source: userPath},
			{Path: "/work/proj/data", Target: "/data", RW: true, Source: projectPath},
		},
		Network: Network{
			Use:   []string{"default", "go"},
			Allow: []string{"a.example.com", "b.example.com", "c.example.com"},
			Block: []string{"t.example.com"},
			Layers: []NetworkLayer{
				{Source: userPath, Use: []string{"default"}, Allow: []string{"a.example.com", "b.example.com"}, Block: []string{"t.example.com"}},
				{Source: projectPath, Use: []string{"default", "go"}, Allow: []string{"b.example.com", "c.example.com"}},
			},
		},
		Secrets: map[string]Secret{
			"GH":  {Name: "GH", From: "command:gh auth token", Hosts: []string{"github.com"}, Source: projectPath},
			"NPM": {Name: "NPM", From: "env:NPM", Hosts: []string{"registry.example.net"}, Source: userPath},
		},
		Env:     map[string]string{"EDITOR": "vi", "LANG": "en_US.UTF-8", "DEBUG": "1"},
		EnvVars: []EnvVar{{Name: "EDITOR", Value: "vi", Source: userPath}, {Name: "LANG", Value: "en_US.UTF-8", Source: projectPath}, {Name: "DEBUG", Value: "1", Source: projectPath}},
		Forwards: Forwards{
			Ports:   []Forward{{3000, 3000, userPath}, {8080, 80, projectPath}, {9000, 9000, projectPath}},
			Reverse: []Forward{{5433, 5432, projectPath}},
		},
		Hooks: Hooks{
			OnCreate: []string{"echo user", "go mod download", "make"},
			OnUp:     []string{"./start.sh"},
		},
		Sources: []string{userPath, projectPath},
	}
	got.origin = nil
	if !reflect.DeepEqual(got, want) {
		gj, _ := json.MarshalIndent(got, "", " ")
		wj, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("got  %s\nwant %s", gj, wj)
	}
}

// TestMergeNetworkTLS checks [network] inspect and trust: inspect is a
// scalar (the narrowest file that sets it wins, so a project can turn
// off what the user turned on), trust a union; each file's layer keeps
// its own values.
func TestMergeNetworkTLS(t *testing.T) {
	dir := t.TempDir()
	cert := testCertPEM(t)
	for _, n := range []string{"user.pem", "proj.pem"} {
		if err := os.WriteFile(filepath.Join(dir, n), cert, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	userPEM, projPEM := filepath.Join(dir, "user.pem"), filepath.Join(dir, "proj.pem")
	tests := []struct {
		name          string
		user, project string
		flags         *File
		wantInspect   bool
		wantTrust     []string
		wantLayers    []NetworkLayer
	}{
		{"default off", "", "", nil, false, nil, nil},
		{"user on", "network.inspect = true", "", nil, true, nil,
			[]NetworkLayer{{Source: userPath, Inspect: ptr(true)}}},
		{"project silent keeps user's", "network.inspect = true", `network.allow = ["a.example"]`, nil, true, nil,
			[]NetworkLayer{{Source: userPath, Inspect: ptr(true)}, {Source: projectPath, Allow: []string{"a.example"}}}},
		{"project off beats user on", "network.inspect = true", "network.inspect = false", nil, false, nil,
			[]NetworkLayer{{Source: userPath, Inspect: ptr(true)}, {Source: projectPath, Inspect: ptr(false)}}},
		{"flag beats project", "", "network.inspect = false", &File{Path: "command line", Network: NetworkLayer{Source: "command line", Inspect: ptr(true)}}, true, nil,
			[]NetworkLayer{{Source: projectPath, Inspect: ptr(false)}, {Source: "command line", Inspect: ptr(true)}}},
		{"trust unions", `network.trust = ["` + userPEM + `"]`, `network.trust = ["` + projPEM + `", "` + userPEM + `"]`, nil, false,
			[]string{userPEM, projPEM},
			[]NetworkLayer{{Source: userPath, Trust: []string{userPEM}}, {Source: projectPath, Trust: []string{projPEM, userPEM}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var layers []*File
			if tt.user != "" {
				layers = append(layers, mustParse(t, userPath, tt.user))
			}
			if tt.project != "" {
				layers = append(layers, mustParse(t, projectPath, tt.project))
			}
			layers = append(layers, tt.flags)
			got := Merge(layers...).Network
			if got.Inspect != tt.wantInspect {
				t.Errorf("Inspect = %v, want %v", got.Inspect, tt.wantInspect)
			}
			if !reflect.DeepEqual(got.Trust, tt.wantTrust) {
				t.Errorf("Trust = %q, want %q", got.Trust, tt.wantTrust)
			}
			if !reflect.DeepEqual(got.Layers, tt.wantLayers) {
				gj, _ := json.Marshal(got.Layers)
				wj, _ := json.Marshal(tt.wantLayers)
				t.Errorf("Layers = %s\nwant     %s", gj, wj)
			}
		})
	}
}

// TestMergeDoesNotAlias checks that merging leaves the files alone, so a
// File can be merged into several configs.
func TestMergeDoesNotAlias(t *testing.T) {
	user := mustParse(t, userPath, "[network]\nallow = [\"a\"]\n[hooks]\non_up = [\"x\"]")
	project := mustParse(t, projectPath, "[network]\nallow = [\"b\"]\n[hooks]\non_up = [\"y\"]")
	Merge(user, project)
	c := Merge(user, project)
	if !reflect.DeepEqual(user.Network.Allow, []string{"a"}) || !reflect.DeepEqual(user.Hooks.OnUp, []string{"x"}) {
		t.Errorf("user file changed by Merge: %+v %+v", user.Network, user.Hooks)
	}
	if !reflect.DeepEqual(c.Network.Allow, []string{"a", "b"}) {
		t.Errorf("allow = %v", c.Network.Allow)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HOME", dir)
	user := filepath.Join(dir, "config.toml")
	project := filepath.Join(dir, "ws", "moat.toml")
	write := func(path, doc string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	c, err := Load(user, project)
	if err != nil || !reflect.DeepEqual(c.Sandbox, Defaults().Sandbox) || c.Sources != nil {
		t.Fatalf("Load(no files) = %+v, %v", c, err)
	}

	write(user, "sandbox.cpus = 6\n")
	write(project, "[[shares]]\npath = \"data\"\n")
	c, err = Load(user, project)
	if err != nil {
		t.Fatal(err)
	}
	if c.Sandbox.CPUs != 6 || len(c.Shares) != 1 || c.Shares[0].Path != filepath.Join(dir, "ws", "data") {
		t.Errorf("Load = %+v", c)
	}
	if !reflect.DeepEqual(c.Sources, []string{user, project}) {
		t.Errorf("Sources = %v", c.Sources)
	}

	write(project, "sandbox.memory_max = \"128MiB\"\n")
	if _, err := Load(user, project); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), project+":1:22: sandbox.memory_max:") {
		t.Errorf("Load(max below memory) = %v", err)
	}
	write(user, "sandbox.cpus = \"6\"\n")
	if _, err := Load(user, project); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), user+":1:16: sandbox.cpus:") {
		t.Errorf("Load(bad user file) = %v", err)
	}
}

// TestConfigJSON checks the snapshot survives a round trip through the
// record, and that its field names, which are frozen, stay as they are.
func TestConfigJSON(t *testing.T) {
	f := mustParse(t, projectPath, `
[sandbox]
name = "api"
idle_timeout = "off"
[network]
inspect = true
[secrets.K]
from = "env:K"
hosts = ["k.example"]
query = "key"
[forwards]
ports = ["8080:80"]
[env]
A = "1"
`)
	c := Merge(f)
	c.Network.Trust = []string{"/etc/moat/corp.pem"} // a real file is TestTrust's business
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"sandbox":{"name":"api","image":"host","runtime":"gvisor","cpus":4,"memory_bytes":1073741824,"memory_max_bytes":4294967296,"pids_max":4096,"idle_timeout":0,"idle_off":true}`,
		`"forwards":{"ports":[{"host":8080,"guest":80,"source":"/work/proj/moat.toml"}]}`, `"env_vars":[{"name":"A","value":"1","source":"/work/proj/moat.toml"}]`, `"sources":["/work/proj/moat.toml"]`,
		`"inspect":true,"trust":["/etc/moat/corp.pem"],"layers":[{"source":"/work/proj/moat.toml","inspect":true}]`,
		`"secrets":{"K":{"name":"K","from":"env:K","hosts":["k.example"],"query":"key","source":"/work/proj/moat.toml"}}`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("JSON %s\nlacks %s", b, k)
		}
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	c.origin = nil
	if !reflect.DeepEqual(back, c) {
		t.Errorf("round trip:\ngot  %+v\nwant %+v", back, c)
	}
}

func TestMergeNetworkMode(t *testing.T) {
	for _, tt := range []struct {
		name, user, project, want string
	}{
		{"default", "", "", ""},
		{"user report", `network.mode = "report"`, "", ModeReport},
		{"project silent keeps user's", `network.mode = "report"`, `network.allow = ["a.example"]`, ModeReport},
		{"project enforce beats user report", `network.mode = "report"`, `network.mode = "enforce"`, ModeEnforce},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var layers []*File
			if tt.user != "" {
				layers = append(layers, mustParse(t, userPath, tt.user))
			}
			if tt.project != "" {
				layers = append(layers, mustParse(t, projectPath, tt.project))
			}
			if got := Merge(layers...).Network.Mode; got != tt.want {
				t.Errorf("Mode = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestMergeDisk(t *testing.T) {
	type disk struct {
		bytes     uint64
		unlimited bool
		from      string
	}
	tests := []struct {
		name, user, project string
		want                disk
	}{
		{"not set", "", "", disk{}},
		{"user", `sandbox.disk = "10GiB"`, "", disk{10 << 30, false, userPath}},
		{"project wins", `sandbox.disk = "10GiB"`, `sandbox.disk = "64MiB"`, disk{64 << 20, false, projectPath}},
		{"project unlimited", `sandbox.disk = "10GiB"`, `sandbox.disk = "unlimited"`, disk{0, true, projectPath}},
		{"project size after user unlimited", `sandbox.disk = "unlimited"`, `sandbox.disk = "1GiB"`, disk{1 << 30, false, projectPath}},
	}
	for _, tt := range tests {
		s := Merge(mustParse(t, userPath, tt.user), mustParse(t, projectPath, tt.project)).Sandbox
		if got := (disk{s.DiskBytes, s.DiskUnlimited, s.DiskFrom}); got != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
