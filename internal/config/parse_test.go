package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func ptr[T any](v T) *T { return &v }

// parse parses doc as /work/proj/moat.toml with HOME=/home/u, so paths in
// wants are fixed.
func parse(t *testing.T, doc string) (*File, error) {
	t.Helper()
	t.Setenv("HOME", "/home/u")
	f, err := Parse("/work/proj/moat.toml", []byte(doc))
	if f != nil {
		f.ix = nil // positions are tested through error messages
	}
	return f, err
}

func TestParseEveryKey(t *testing.T) {
	doc := `
[sandbox]
name = "api"
image = "debian:bookworm"
runtime = "gvisor"
cpus = 2
memory = "512MiB"
memory_max = "2GiB"
pids_max = 1024
idle_timeout = "1h"

[[shares]]
path = "~/data"
target = "/data"
rw = true

[[shares]]
path = "assets"

[network]
use = ["default", "go"]
allow = ["api.example.com", "*.example.org", "registry.example.net:443", "10.20.0.0/16", "api.example.com"]
block = ["telemetry.example.com"]
inspect = true

[secrets.GH_TOKEN]
from = "env:GH_TOKEN"
hosts = ["api.github.com"]
header = "authorization"
query = "access_token"
require = true

[secrets.KEY]
from = "file:keys/api.key"
hosts = ["api.example.com"]

[env]
ZED = "last?"
DATABASE_URL = "${DATABASE_URL:?set DATABASE_URL on the host}"
MODE = "${MODE:-dev}"
EDITOR = true

[forwards]
ports = [3000, "8080:80", "9000", 3000]
reverse = [5432, "6380:6379"]

[hooks]
on_create = ["go mod download"]
on_up = ["./scripts/start-db.sh"]
`
	got, err := parse(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	want := &File{
		Path: "/work/proj/moat.toml",
		Sandbox: SandboxLayer{
			Name: ptr("api"), Image: ptr("debian:bookworm"), Runtime: ptr("gvisor"),
			CPUs: ptr(2), MemoryBytes: ptr(uint64(512 << 20)), MemoryMaxBytes: ptr(uint64(2 << 30)),
			PidsMax: ptr(1024), IdleTimeout: ptr(time.Hour),
		},
		Shares: []Share{
			{Path: "/home/u/data", Target: "/data", RW: true, Source: "/work/proj/moat.toml"},
			{Path: "/work/proj/assets", Target: "/work/proj/assets", Source: "/work/proj/moat.toml"},
		},
		Network: NetworkLayer{
			Source:  "/work/proj/moat.toml",
			Use:     []string{"default", "go"},
			Allow:   []string{"api.example.com", "*.example.org", "registry.example.net:443", "10.20.0.0/16"},
			Block:   []string{"telemetry.example.com"},
			Inspect: ptr(true),
		},
		Secrets: map[string]Secret{
			"GH_TOKEN": {Name: "GH_TOKEN", From: "env:GH_TOKEN", Hosts: []string{"api.github.com"},
				Header: "authorization", Query: "access_token", Require: true, Source: "/work/proj/moat.toml"},
			"KEY": {Name: "KEY", From: "file:/work/proj/keys/api.key", Hosts: []string{"api.example.com"},
				Source: "/work/proj/moat.toml"},
		},
		Env: []EnvVar{
			{Name: "ZED", Value: "last?", Source: "/work/proj/moat.toml"},
			{Name: "DATABASE_URL", Value: "${DATABASE_URL:?set DATABASE_URL on the host}", Source: "/work/proj/moat.toml"},
			{Name: "MODE", Value: "${MODE:-dev}", Source: "/work/proj/moat.toml"},
			{Name: "EDITOR", Pass: true, Source: "/work/proj/moat.toml"},
		},
		Forwards: Forwards{
			Ports:   []Forward{{3000, 3000, "/work/proj/moat.toml"}, {8080, 80, "/work/proj/moat.toml"}, {9000, 9000, "/work/proj/moat.toml"}},
			Reverse: []Forward{{5432, 5432, "/work/proj/moat.toml"}, {6380, 6379, "/work/proj/moat.toml"}},
		},
		Hooks: Hooks{OnCreate: []string{"go mod download"}, OnUp: []string{"./scripts/start-db.sh"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestParseEmpty(t *testing.T) {
	got, err := parse(t, "# nothing\n")
	if err != nil {
		t.Fatal(err)
	}
	want := &File{Path: "/work/proj/moat.toml", Network: NetworkLayer{Source: "/work/proj/moat.toml"}, Secrets: map[string]Secret{}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestParseScalars(t *testing.T) {
	tests := []struct {
		doc  string
		want SandboxLayer
	}{
		{`sandbox.image = "host"`, SandboxLayer{Image: ptr("host")}},
		{`sandbox.image = "ghcr.io/acme/dev@sha256:abc"`, SandboxLayer{Image: ptr("ghcr.io/acme/dev@sha256:abc")}},
		{`sandbox.image = "./img/dev.tar"`, SandboxLayer{Image: ptr("/work/proj/img/dev.tar")}},
		{`sandbox.image = "img/dev.tar.gz"`, SandboxLayer{Image: ptr("/work/proj/img/dev.tar.gz")}},
		{`sandbox.image = "~/images/dev.tgz"`, SandboxLayer{Image: ptr("/home/u/images/dev.tgz")}},
		{`sandbox.image = "/abs/x"`, SandboxLayer{Image: ptr("/abs/x")}},
		{`sandbox.idle_timeout = "off"`, SandboxLayer{IdleTimeout: ptr(time.Duration(0))}},
		{`sandbox.idle_timeout = "1m"`, SandboxLayer{IdleTimeout: ptr(time.Minute)}},
		{`sandbox.idle_timeout = "1h30m"`, SandboxLayer{IdleTimeout: ptr(90 * time.Minute)}},
		{`sandbox.memory = "64MiB"`, SandboxLayer{MemoryBytes: ptr(uint64(64 << 20))}},
		{`sandbox = { cpus = 1, pids_max = 1 }`, SandboxLayer{CPUs: ptr(1), PidsMax: ptr(1)}},
		{"[sandbox]\nmemory = \"1G\"\nmemory_max = \"1GiB\"", SandboxLayer{MemoryBytes: ptr(uint64(1 << 30)), MemoryMaxBytes: ptr(uint64(1 << 30))}},
		{`sandbox.daemon_memory_max = "256MiB"`, SandboxLayer{DaemonMemoryMaxBytes: ptr(uint64(256 << 20))}},
		{`sandbox.disk = "20GiB"`, SandboxLayer{DiskBytes: ptr(uint64(20 << 30))}},
		{`sandbox.disk = "32MiB"`, SandboxLayer{DiskBytes: ptr(uint64(32 << 20))}},
		{`sandbox.disk = "unlimited"`, SandboxLayer{DiskBytes: ptr(uint64(0))}},
	}
	for _, tt := range tests {
		got, err := parse(t, tt.doc)
		if err != nil {
			t.Errorf("%s: %v", tt.doc, err)
			continue
		}
		if !reflect.DeepEqual(got.Sandbox, tt.want) {
			t.Errorf("%s: got %+v, want %+v", tt.doc, got.Sandbox, tt.want)
		}
	}
}

// TestParseErrors checks that each mistake is caught, with the file,
// line and column, the full key and a hint. want holds substrings.
func TestParseErrors(t *testing.T) {
	known := "known keys in [sandbox]: name, image, runtime, cpus, memory, memory_max, pids_max, idle_timeout"
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		// Unknown keys: top level, in tables, in [[shares]], in secrets.X.
		{"unknown in sandbox", "\n\n[sandbox]\nimgae = \"x\"",
			[]string{`moat.toml:4:1: unknown key "sandbox.imgae"; ` + known, `did you mean "image"?`}},
		{"unknown top level key", `zap = 1`,
			[]string{`moat.toml:1:1: unknown key "zap"; known top-level tables: sandbox, shares, files, network, secrets, env, forwards, hooks`}},
		{"unknown top level table", "[netwrok]\nallow = []",
			[]string{`moat.toml:1:2: unknown key "netwrok"`, `did you mean "network"?`}},
		{"unknown dotted", `sandbox.memory.max = "1GiB"`,
			[]string{`moat.toml:1:1: sandbox.memory: expected a size string such as "1GiB" (with quotes), got a table`}},
		{"unknown in network", "[network]\nallows = []", []string{`2:1: unknown key "network.allows"; known keys in [network]: use, allow, block, inspect, trust, mode`}},
		{"unknown in forwards", "[forwards]\nport = 1", []string{`2:1: unknown key "forwards.port"; known keys in [forwards]: ports, reverse`}},
		{"unknown in hooks", "[hooks]\non_start = []", []string{`2:1: unknown key "hooks.on_start"; known keys in [hooks]: on_create, on_up`}},
		{"unknown in shares", "[[shares]]\npath = \"a\"\n[[shares]]\npath = \"b\"\nreadonly = true",
			[]string{`5:1: unknown key "shares[1].readonly"; known keys in [[shares]]: path, target, rw`}},
		{"unknown in inline share", `shares = [{ path = "a", mode = "ro" }]`,
			[]string{`1:25: unknown key "shares[0].mode"`}},
		{"unknown in secret", "[secrets.GH]\nfrom = \"env:GH\"\nhost = [\"x\"]",
			[]string{`3:1: unknown key "secrets.GH.host"; known keys in [secrets.GH]: from, hosts, header, query, require`, `did you mean "hosts"?`}},
		{"all unknown keys reported", "a = 1\nb = 2", []string{`1:1: unknown key "a"`, `2:1: unknown key "b"`}},

		// Syntax.
		{"syntax", "[sandbox]\nname = \"api", []string{"moat.toml:2:11: TOML syntax error: unterminated basic string"}},
		{"syntax header", "[sandbox", []string{"moat.toml:1:", "TOML syntax error"}},
		{"set twice", "[sandbox]\ncpus = 1\ncpus = 2", []string{"moat.toml:3:1: sandbox.cpus: set twice (first on line 2); remove one"}},

		// Types.
		{"name type", `sandbox.name = 1`, []string{"1:16: sandbox.name: expected a string, got an integer"}},
		{"image type", `sandbox.image = true`, []string{"sandbox.image: expected a string, got a boolean"}},
		{"runtime type", `sandbox.runtime = ["gvisor"]`, []string{"sandbox.runtime: expected a string, got a list"}},
		{"cpus type", "[sandbox]\ncpus = \"4\"", []string{"2:8: sandbox.cpus: expected an integer, got a string"}},
		{"cpus float", "[sandbox]\ncpus = 1.5", []string{"sandbox.cpus: expected an integer, got a float"}},
		{"pids type", `sandbox.pids_max = "many"`, []string{"sandbox.pids_max: expected an integer, got a string"}},
		{"memory type", "[sandbox]\nmemory = 1024", []string{`2:10: sandbox.memory: expected a size string such as "1GiB" (with quotes), got an integer`}},
		{"memory_max type", `sandbox.memory_max = 1.5`, []string{"sandbox.memory_max: expected a size string"}},
		{"idle type", `sandbox.idle_timeout = 30`, []string{`sandbox.idle_timeout: expected a duration string such as "30m", or "off", got an integer`}},
		{"sandbox type", `sandbox = "big"`, []string{"1:11: sandbox: expected a table, got a string"}},
		{"sandbox array table", "[[sandbox]]", []string{"sandbox: expected a table, got an array of tables"}},
		{"shares type", `shares = "~/x"`, []string{"shares: expected a list of tables: write [[shares]] sections, got a string"}},
		{"share element type", `shares = ["~/x"]`, []string{"1:11: shares[0]: expected a table, got a string"}},
		{"share path type", "[[shares]]\npath = 1", []string{"2:8: shares[0].path: expected a string, got an integer"}},
		{"share target type", "[[shares]]\npath = \"a\"\ntarget = 1", []string{"shares[0].target: expected a string"}},
		{"share rw type", "[[shares]]\npath = \"a\"\nrw = \"yes\"", []string{"3:6: shares[0].rw: expected true or false, got a string"}},
		{"network type", `network = ["a"]`, []string{"network: expected a table, got a list"}},
		{"allow type", `network.allow = "a"`, []string{`network.allow: expected a list of strings, e.g. ["a", "b"], got a string`}},
		{"allow element", "[network]\nallow = [\"a\",\n  3]", []string{"3:3: network.allow[1]: expected a string, got an integer"}},
		{"use element", `network.use = [true]`, []string{"network.use[0]: expected a string, got a boolean"}},
		{"block element", `network.block = [[1]]`, []string{"network.block[0]: expected a string, got a list"}},
		{"secrets type", `secrets = []`, []string{"secrets: expected a table of [secrets.NAME] tables, got a list"}},
		{"secret type", "[secrets]\nGH = \"env:GH\"", []string{"2:6: secrets.GH: expected a table, got a string"}},
		{"secret from type", "[secrets.GH]\nfrom = 1", []string{"secrets.GH.from: expected a string, got an integer"}},
		{"secret hosts type", "[secrets.GH]\nhosts = \"x\"", []string{"secrets.GH.hosts: expected a list of strings"}},
		{"secret header type", "[secrets.GH]\nheader = 1", []string{"secrets.GH.header: expected a string"}},
		{"secret require type", "[secrets.GH]\nrequire = \"yes\"", []string{"secrets.GH.require: expected true or false, got a string"}},
		{"secret query type", "[secrets.GH]\nquery = [\"key\"]", []string{"secrets.GH.query: expected a string, got a list"}},
		{"file without target", "[[files]]\nsource = \"a\"", []string{"files[0]: a file needs source and target"}},
		{"file mode", "[[files]]\nsource = \"a\"\ntarget = \"/x\"\nmode = \"rw\"", []string{`4:8: files[0].mode: "rw" is not a permission mode`}},
		{"file relative target", "[[files]]\nsource = \"a\"\ntarget = \"x\"", []string{`files[0].target: "x" is not an absolute guest path`}},
		{"file into proc", "[[files]]\nsource = \"a\"\ntarget = \"/proc/x\"", []string{`files[0].target: cannot write into /proc/x`}},
		{"env false", "[env]\nA = false", []string{"2:5: env.A: false means nothing here; write A = true to pass the host's value, or remove the line"}},
		{"inspect type", "[network]\ninspect = \"yes\"", []string{"2:11: network.inspect: expected true or false, got a string"}},
		{"mode value", "[network]\nmode = \"learn\"", []string{`2:8: network.mode: must be "enforce" or "report", not "learn"`}},
		{"trust type", `network.trust = "/etc/ca.pem"`, []string{`network.trust: expected a list of strings, e.g. ["a", "b"], got a string`}},
		{"trust element", "[network]\ntrust = [1]", []string{"2:10: network.trust[0]: expected a string, got an integer"}},
		{"env type", `env = "A=1"`, []string{"env: expected a table, got a string"}},
		{"env value type", "[env]\nPORT = 8080", []string{"2:8: env.PORT: expected a string (\"literal\", \"${HOST_VAR:-default}\") or true (the host's value of the same name), got an integer"}},
		{"env value date", "[env]\nDAY = 2024-01-01", []string{"env.DAY: expected a string (\"literal\", \"${HOST_VAR:-default}\") or true (the host's value of the same name), got a date or time"}},
		{"forwards type", `forwards = 3000`, []string{"forwards: expected a table, got an integer"}},
		{"ports type", `forwards.ports = 3000`, []string{`forwards.ports: expected a list of ports, e.g. [3000, "8080:80"], got an integer`}},
		{"reverse type", `forwards.reverse = "5432"`, []string{"forwards.reverse: expected a list of ports"}},
		{"port element float", "[forwards]\nports = [1, 2.5]", []string{`2:13: forwards.ports[1]: expected a port (3000) or a "host:guest" string ("8080:80"), got a float`}},
		{"hooks type", `hooks = ["x"]`, []string{"hooks: expected a table, got a list"}},
		{"on_create type", `hooks.on_create = "make"`, []string{"hooks.on_create: expected a list of strings"}},
		{"on_up element", `hooks.on_up = [1]`, []string{"hooks.on_up[0]: expected a string, got an integer"}},

		// Values.
		{"bad name", "[sandbox]\nname = \"My_API\"", []string{`2:8: sandbox.name: sandbox name "My_API" contains 'M'`, `e.g. "my-api"`}},
		{"empty image", `sandbox.image = ""`, []string{`sandbox.image: empty image; write "host"`}},
		{"image spaces", `sandbox.image = "debian bookworm"`, []string{`sandbox.image: "debian bookworm" contains white space`}},
		{"image ~user", `sandbox.image = "~bob/x.tar"`, []string{`only ~ and ~/ are expanded`}},
		{"runtime runc", "[sandbox]\nruntime = \"runc\"", []string{`2:11: sandbox.runtime: runtime "runc" is not supported yet`}},
		{"runtime vm", `sandbox.runtime = "vm"`, []string{`runtime "vm" is not supported yet`}},
		{"runtime unknown", `sandbox.runtime = "podman"`, []string{`1:19: sandbox.runtime: unknown runtime "podman"; write "gvisor"`}},
		{"platform unknown", "[sandbox]\nplatform = \"ptrace\"", []string{`2:12: sandbox.platform: unknown platform "ptrace"; write "auto"`}},
		{"platform type", `sandbox.platform = 1`, []string{"sandbox.platform: expected a string"}},
		{"cpus zero", "[sandbox]\ncpus = 0", []string{"2:8: sandbox.cpus: 0 is out of range; write a whole number of at least 1"}},
		{"cpus negative", `sandbox.cpus = -2`, []string{"sandbox.cpus: -2 is out of range"}},
		{"cpus huge", `sandbox.cpus = 99999999999999999999`, []string{"sandbox.cpus:", "too large"}},
		{"pids zero", `sandbox.pids_max = 0`, []string{"sandbox.pids_max: 0 is out of range"}},
		{"bad size", "\n\n\n\n[sandbox]\nmemory = \"1 gigabyte\"", []string{`moat.toml:6:10: sandbox.memory: "1 gigabyte" is not a size; write e.g. "512MiB" or "2GiB"`}},
		{"fraction size", `sandbox.memory_max = "1.5GiB"`, []string{`sandbox.memory_max: "1.5GiB" is not a size; sizes are whole numbers`}},
		{"tiny size", `sandbox.memory = "512"`, []string{`sandbox.memory: "512" is less than the minimum of 64MiB; sizes without a unit are bytes`}},
		{"tiny daemon", `sandbox.daemon_memory_max = "32MiB"`, []string{`sandbox.daemon_memory_max: "32MiB" is less than the minimum of 64MiB`}},
		{"daemon type", `sandbox.daemon_memory_max = 256`, []string{"sandbox.daemon_memory_max: expected a size string"}},
		{"tiny disk", "[sandbox]\ndisk = \"16MiB\"", []string{`moat.toml:2:8: sandbox.disk: "16MiB" is less than the minimum of 32MiB; sizes without a unit are bytes`}},
		{"bad disk", `sandbox.disk = "lots"`, []string{`sandbox.disk: "lots" is not a size; write e.g. "512MiB" or "2GiB", or "unlimited"`}},
		{"disk type", `sandbox.disk = 20`, []string{`sandbox.disk: expected a size string such as "20GiB", or "unlimited"`}},
		{"max below memory", "[sandbox]\nmemory = \"2GiB\"\nmemory_max = \"1GiB\"",
			[]string{"3:14: sandbox.memory_max: 1GiB is less than sandbox.memory 2GiB"}},
		{"bad duration", `sandbox.idle_timeout = "30 minutes"`, []string{`sandbox.idle_timeout: "30 minutes" is not a duration; write e.g. "30m", "2h" or "off"`}},
		{"short idle", "[sandbox]\nidle_timeout = \"59s\"", []string{`2:16: sandbox.idle_timeout: "59s" is shorter than the minimum of 1m`}},
		{"negative idle", `sandbox.idle_timeout = "-1h"`, []string{`is shorter than the minimum of 1m`}},
		{"zero idle", `sandbox.idle_timeout = "0s"`, []string{`is shorter than the minimum of 1m`, `"off"`}},
		{"share without path", "[[shares]]\ntarget = \"/x\"", []string{"1:3: shares[0]: share has no path"}},
		{"share relative target", "[[shares]]\npath = \"a\"\ntarget = \"data\"", []string{`3:10: shares[0].target: "data" is not an absolute guest path`}},
		{"share over proc", "[[shares]]\npath = \"a\"\ntarget = \"/proc/x\"", []string{"shares[0].target: cannot mount over /proc"}},
		{"share over root", "[[shares]]\npath = \"/\"", []string{"shares[0].target: cannot mount over /"}},
		{"share same target", "[[shares]]\npath = \"a\"\ntarget = \"/d\"\n[[shares]]\npath = \"b\"\ntarget = \"/d/\"",
			[]string{"4:3: shares[1]: target /d is already used by shares[0]"}},
		{"empty allow", "[network]\nallow = [\"a\", \"\"]", []string{"2:15: network.allow[1]: empty entry; remove it"}},
		{"empty hook", `hooks.on_up = [" "]`, []string{"hooks.on_up[0]: empty entry"}},
		{"secret without from", "[secrets.GH]\nhosts = [\"x\"]", []string{`1:2: secrets.GH: no from; write e.g. from = "env:GH"`}},
		{"secret without hosts", "[secrets.GH]\nfrom = \"env:GH\"", []string{`1:2: secrets.GH: no hosts`}},
		{"secret bad prefix", "[secrets.GH]\nfrom = \"vault:gh\"\nhosts = [\"x\"]", []string{`2:8: secrets.GH.from: "vault:gh" is not a secret source; write "env:VAR", "file:PATH" or "command:CMD"`}},
		{"secret no prefix", "[secrets.GH]\nfrom = \"GH\"\nhosts = [\"x\"]", []string{`"GH" is not a secret source`}},
		{"secret empty command", "[secrets.GH]\nfrom = \"command:\"\nhosts = [\"x\"]", []string{`"command:" is not a secret source`}},
		{"secret empty file", "[secrets.GH]\nfrom = \"file:\"\nhosts = [\"x\"]", []string{`"file:" is not a secret source`}},
		{"secret bad env", "[secrets.GH]\nfrom = \"env:1X\"\nhosts = [\"x\"]", []string{`"1X" is not an environment variable name`}},
		{"secret bad name", "[secrets.\"my-key\"]\nfrom = \"env:A\"\nhosts = [\"x\"]", []string{`secrets.my-key: secret name "my-key" is not a valid environment variable name`}},
		{"secret bad header", "[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"x\"]\nheader = \"x api key\"", []string{`4:10: secrets.GH.header: "x api key" is not an HTTP header name`}},
		{"secret header colon", "[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"x\"]\nheader = \"authorization:\"", []string{`4:10: secrets.GH.header: "authorization:" is not an HTTP header name`}},
		{"secret header empty", "[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"x\"]\nheader = \"\"", []string{`secrets.GH.header: "" is not an HTTP header name`}},
		{"secret header non-ASCII", "[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"x\"]\nheader = \"x-schlüssel\"", []string{`secrets.GH.header: "x-schlüssel" is not an HTTP header name`}},
		{"secret query empty", "[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"x\"]\nquery = \"\"", []string{`4:9: secrets.GH.query: "" is not a URL query parameter name`}},
		{"secret query with =", "[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"x\"]\nquery = \"key=\"", []string{`secrets.GH.query: "key=" is not a URL query parameter name; write the bare name`}},
		{"secret query with ?", "[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"x\"]\nquery = \"?key\"", []string{`"?key" is not a URL query parameter name`}},
		{"secret query with space", "[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"x\"]\nquery = \"api key\"", []string{`"api key" is not a URL query parameter name`}},
		{"trust missing", "[network]\ntrust = [\"certs/ca.pem\"]", []string{"2:10: network.trust[0]: reading /work/proj/certs/ca.pem: no such file or directory; write the path of a PEM file of CA certificates"}},
		{"trust empty entry", "[network]\ntrust = [\"\"]", []string{"2:10: network.trust[0]: empty entry; remove it"}},
		{"env bad name", "[env]\n\"MY-VAR\" = \"x\"", []string{`2:12: env.MY-VAR: "MY-VAR" is not a valid environment variable name`}},
		{"env unclosed", "[env]\nA = \"${HOME\"", []string{`2:5: env.A: "${HOME" has an unclosed ${`}},
		{"env bad var", "[env]\nA = \"${1X}\"", []string{`env.A: ${1X}: "1X" is not a variable name`}},
		{"env bad operator", "[env]\nA = \"${X:=y}\"", []string{`env.A: ${X:=y}: unknown operator ":="`}},
		{"port zero", "[forwards]\nports = [0]", []string{`2:10: forwards.ports[0]: 0 is not a port; write a port (3000) or "host:guest" ("8080:80"), ports 1-65535`}},
		{"port too big", `forwards.reverse = [65536]`, []string{`forwards.reverse[0]: 65536 is not a port`}},
		{"port bad string", `forwards.ports = ["80:http"]`, []string{`forwards.ports[0]: "80:http" is not a port forward`}},
		{"port triple", `forwards.ports = ["1:2:3"]`, []string{`"1:2:3" is not a port forward`}},
		{"port negative", `forwards.ports = [-1]`, []string{`-1 is not a port`}},
		{"port twice", "[forwards]\nports = [8080, \"8080:80\"]", []string{"2:16: forwards.ports[1]: port 8080 is already forwarded (8080:8080); remove one"}},
		{"reverse twice", `forwards.reverse = ["5432:5432", "5433:5432"]`, []string{"forwards.reverse[1]: port 5432 is already forwarded"}},
		{"several value errors", "[sandbox]\ncpus = 0\npids_max = 0", []string{"2:8: sandbox.cpus", "3:12: sandbox.pids_max"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, tt.doc)
			if err == nil {
				t.Fatalf("no error for %q", tt.doc)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "/work/proj/moat.toml" || e.Line == 0 {
				t.Errorf("error %v: want an *Error with file and line, got %#v", err, e)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n  %v\nwant it to contain\n  %s", err, w)
				}
			}
		})
	}
}

func TestErrorFields(t *testing.T) {
	_, err := Parse("moat.toml", []byte("[sandbox]\n\nmemory = \"lots\""))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("got %T %v, want *Error", err, err)
	}
	got := *e
	want := Error{File: "moat.toml", Line: 3, Col: 10, Key: "sandbox.memory", Msg: `"lots" is not a size; write e.g. "512MiB" or "2GiB"`}
	if got != want {
		t.Errorf("got %#v, want %#v", got, want)
	}
	if got, want := e.Error(), `moat.toml:3:10: sandbox.memory: "lots" is not a size; write e.g. "512MiB" or "2GiB"`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}

	_, err = Parse("moat.toml", []byte("\n\n[sandbox]\nimgae = \"x\""))
	if !errors.As(err, &e) {
		t.Fatalf("got %T %v, want *Error", err, err)
	}
	if e.Key != "sandbox.imgae" || e.Line != 4 || e.Col != 1 {
		t.Errorf("got %#v, want key sandbox.imgae at 4:1", e)
	}
	wantMsg := `moat.toml:4:1: unknown key "sandbox.imgae"; known keys in [sandbox]: name, image, runtime, cpus, memory, memory_max, pids_max, idle_timeout, daemon_memory_max, disk, platform (did you mean "image"?)`
	if e.Error() != wantMsg {
		t.Errorf("Error() = %q\nwant      %q", e.Error(), wantMsg)
	}
}

func TestSharePaths(t *testing.T) {
	tests := []struct {
		path, target string
		want         Share
	}{
		{"~", "", Share{Path: "/home/u", Target: "/home/u"}},
		{"~/data", "", Share{Path: "/home/u/data", Target: "/home/u/data"}},
		{"~/data/../other/", "", Share{Path: "/home/u/other", Target: "/home/u/other"}},
		{"data", "/d", Share{Path: "/work/proj/data", Target: "/d"}},
		{"./data", "/d/../e/", Share{Path: "/work/proj/data", Target: "/e"}},
		{"../sibling", "", Share{Path: "/work/sibling", Target: "/work/sibling"}},
		{"/srv/x", "", Share{Path: "/srv/x", Target: "/srv/x"}},
	}
	for _, tt := range tests {
		doc := "[[shares]]\npath = \"" + tt.path + "\"\n"
		if tt.target != "" {
			doc += "target = \"" + tt.target + "\"\n"
		}
		f, err := parse(t, doc)
		if err != nil {
			t.Errorf("%s: %v", tt.path, err)
			continue
		}
		tt.want.Source = "/work/proj/moat.toml"
		if len(f.Shares) != 1 || f.Shares[0] != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.path, f.Shares, tt.want)
		}
	}
}

func TestSharePathNoHome(t *testing.T) {
	t.Setenv("HOME", "")
	_, err := Parse("/p/moat.toml", []byte("[[shares]]\npath = \"~/x\""))
	if err == nil || !strings.Contains(err.Error(), "/p/moat.toml:2:8: shares[0].path: cannot expand \"~/x\"") {
		t.Errorf("got %v, want an error about ~ without a home", err)
	}
}

func TestRelativeFilePath(t *testing.T) {
	// A relative file path anchors at the working directory's view of it.
	dir := t.TempDir()
	t.Chdir(dir)
	f, err := Parse("sub/moat.toml", []byte("[[shares]]\npath = \"data\""))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "sub", "data"); f.Shares[0].Path != want {
		t.Errorf("got %s, want %s", f.Shares[0].Path, want)
	}
}

func TestParseFileAndLoadOptional(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.toml")
	if _, err := ParseFile(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ParseFile(missing) = %v, want fs.ErrNotExist", err)
	}
	if f, err := LoadOptional(missing); f != nil || err != nil {
		t.Errorf("LoadOptional(missing) = %v, %v; want nil, nil", f, err)
	}
	if f, err := LoadOptional(""); f != nil || err != nil {
		t.Errorf("LoadOptional(\"\") = %v, %v; want nil, nil", f, err)
	}
	good := filepath.Join(dir, "moat.toml")
	if err := os.WriteFile(good, []byte("sandbox.cpus = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := LoadOptional(good)
	if err != nil || f == nil || f.Path != good || *f.Sandbox.CPUs != 2 {
		t.Errorf("LoadOptional(good) = %+v, %v", f, err)
	}
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("sandbox.cpu = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOptional(bad); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), bad+":1:1:") {
		t.Errorf("LoadOptional(bad) = %v, want ErrInvalid naming %s:1:1", err, bad)
	}
	// A directory where the file should be is not "missing".
	if _, err := LoadOptional(dir); err == nil {
		t.Errorf("LoadOptional(dir) = nil error, want one")
	}
}

func TestEditDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"image", "image", 0}, {"imgae", "image", 1}, {"imag", "image", 1},
		{"hosts", "host", 1}, {"cpu", "cpus", 1}, {"abc", "xyz", 3},
	}
	for _, tt := range tests {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

// TestSchemaTables keeps knownKeys and wants in step: every known key
// has a type to explain its mistakes with.
func TestSchemaTables(t *testing.T) {
	for table, keys := range knownKeys {
		for _, k := range keys {
			p := k
			if table != "" {
				p = table + "." + k
			}
			if _, ok := wants[p]; !ok {
				t.Errorf("known key %s has no entry in wants", p)
			}
		}
	}
}

// TestNetworkRules checks that network.allow and network.block entries
// go through the gate's parser at load time: a bad rule is an error with
// file, line, column and key, and says what to write instead.
func TestNetworkRules(t *testing.T) {
	_, err := Parse("moat.toml", []byte("[network]\nuse = [\"default\"]\n\nallow = [\"ok.example\", \"http://x.com\"]"))
	if got, want := fmt.Sprint(err), `moat.toml:4:24: network.allow[1]: "http://x.com": a URL, not a rule; write x.com`; got != want {
		t.Errorf("error\n  %s\nwant\n  %s", got, want)
	}

	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"query", "[network]\nallow = [\n  \"a.example\",\n  \"x.com/api?x=1\",\n]", []string{`4:3: network.allow[1]: "x.com/api?x=1": a query or fragment is not matched, only the path; write "x.com/api"`}},
		{"bad port", `network.allow = ["a.example:0"]`, []string{`network.allow[0]: "a.example:0": port 0 is out of range`}},
		{"star", "[network]\nblock = [\"*\"]", []string{`2:10: network.block[0]: "*": a wildcard alone would match every name`}},
		{"partial wildcard", `network.block = ["*ads.example"]`, []string{`network.block[0]: "*ads.example": a wildcard must be a whole first label; write *.ads.example`}},
		{"user info", `network.allow = ["git@github.com"]`, []string{`network.allow[0]: "git@github.com": user info is not part of a rule`}},
		{"host bits", `network.allow = ["10.1.2.3/8"]`, []string{`"10.1.2.3/8": host bits are set; write 10.0.0.0/8`}},
		{"shorthand", `network.allow = ["2130706433"]`, []string{`write the dotted address 127.0.0.1`}},
		{"white space", `network.allow = [" a.example"]`, []string{`network.allow[0]: " a.example": contains white space; write "a.example"`}},
		{"every bad entry", "[network]\nallow = [\"http://a.com\", \"ok.example\", \"b.com:x\"]\nblock = [\"c..com\"]",
			[]string{`2:10: network.allow[0]`, `2:40: network.allow[2]: "b.com:x": port "x" is not a number`, `3:10: network.block[0]: "c..com": empty label`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, tt.doc)
			if err == nil {
				t.Fatalf("no error for %q", tt.doc)
			}
			var e *Error
			if !errors.Is(err, ErrInvalid) || !errors.As(err, &e) || e.Line == 0 {
				t.Errorf("error %v: want an ErrInvalid *Error with a line", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n  %v\nwant it to contain\n  %s", err, w)
				}
			}
		})
	}

	// Good entries are kept as written (the gate normalizes), once.
	f, err := parse(t, `[network]
allow = ["*.Example.com:443", "10.20.0.0/16", "[2001:db8::1]:22", "bücher.example", "*.Example.com:443"]
block = ["Telemetry.Example.com."]
`)
	if err != nil {
		t.Fatal(err)
	}
	wantAllow := []string{"*.Example.com:443", "10.20.0.0/16", "[2001:db8::1]:22", "bücher.example"}
	if !reflect.DeepEqual(f.Network.Allow, wantAllow) {
		t.Errorf("allow = %q, want %q", f.Network.Allow, wantAllow)
	}
	if want := []string{"Telemetry.Example.com."}; !reflect.DeepEqual(f.Network.Block, want) {
		t.Errorf("block = %q, want %q", f.Network.Block, want)
	}

	// Secret hosts are not network rules and keep their own check.
	if _, err := parse(t, "[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"x\"]"); err != nil {
		t.Errorf("secret with host x: %v", err)
	}
}

func TestParseFiles(t *testing.T) {
	f, err := Parse("/work/proj/moat.toml", []byte(`[[files]]
source = "keys/deploy.pem"
target = "/home/agent/.ssh/deploy.pem"
mode = "0600"

[[files]]
source = "/etc/gitconfig"
target = "/etc/gitconfig/"
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []CopyFile{
		{Source: "/work/proj/keys/deploy.pem", Target: "/home/agent/.ssh/deploy.pem", Mode: 0o600, Origin: "/work/proj/moat.toml"},
		{Source: "/etc/gitconfig", Target: "/etc/gitconfig", Mode: 0o644, Origin: "/work/proj/moat.toml"},
	}
	if !reflect.DeepEqual(f.Files, want) {
		t.Errorf("got %+v, want %+v", f.Files, want)
	}
}

func TestParseRuntime(t *testing.T) {
	for _, rt := range []string{"gvisor", "docker"} {
		f, err := parse(t, "[sandbox]\nruntime = \""+rt+"\"\n")
		if err != nil {
			t.Fatalf("runtime %s: %v", rt, err)
		}
		if got := f.Sandbox.Runtime; got == nil || *got != rt {
			t.Errorf("runtime %s: got %v", rt, got)
		}
		if got := Merge(f).Sandbox.Runtime; got != rt {
			t.Errorf("runtime %s merged: got %q", rt, got)
		}
	}
	if got := Merge().Sandbox.Runtime; got != "gvisor" {
		t.Errorf("default runtime = %q, want gvisor", got)
	}
}
