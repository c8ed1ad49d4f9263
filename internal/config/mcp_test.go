package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestMCPParse(t *testing.T) {
	f, err := Parse("/p/moat.toml", []byte(`
[mcp.gh]
url = "https://MCP.Example.com/mcp/"
secret = "GH_TOKEN"
tools = ["search_*", "read_file", "!delete_*"]
resources = ["repo://*"]
audit_arguments = true

[mcp.root]
url = "https://root.example.com:8443"
`))
	if err != nil {
		t.Fatal(err)
	}
	gh := f.MCP["gh"]
	if gh.Host != "mcp.example.com" || gh.Port != 443 || gh.Path != "/mcp" || gh.Secret != "GH_TOKEN" ||
		!gh.AuditArguments || len(gh.Tools) != 3 || gh.Source != "/p/moat.toml" {
		t.Errorf("gh = %+v", gh)
	}
	root := f.MCP["root"]
	if root.Port != 8443 || root.Path != "/" || len(root.Tools) != 0 {
		t.Errorf("root = %+v", root)
	}
	want := []string{"mcp.example.com:443/mcp", "mcp.example.com:443/mcp/*", "root.example.com:8443/*"}
	if !slices.Equal(f.Network.Allow, want) {
		t.Errorf("network.allow = %q, want %q", f.Network.Allow, want)
	}
}

func TestMCPParseRefuses(t *testing.T) {
	for _, tc := range []struct{ toml, want string }{
		{`url = "https://user:pw@mcp.example.com/mcp"`, "put the credential in a secret instead"},
		{`url = "https://mcp.example.com/mcp?access_token=abc"`, `query parameter "access_token" looks like a credential`},
		{`url = "https://mcp.example.com/mcp?x=abcdefghijklmnopqrstuvwxyz"`, "looks like a credential"},
		{`url = "http://mcp.example.com/mcp"`, "https only"},
		{`url = "https://192.0.2.1/mcp"`, "host name"},
		{`url = "https://mcp.example.com/mcp#x"`, "fragment"},
		{`url = "mcp.example.com"`, "not a URL"},
		{`tools = ["x"]`, "no url"},
		{"url = \"https://a.example.com\"\ntools = [\"!\"]", "empty pattern"},
		{"url = \"https://a.example.com\"\ntools = [\"!!x\"]", `one "!" refuses`},
		{"url = \"https://a.example.com\"\ntools = [\"a b\"]", "white space"},
		{"url = \"https://a.example.com\"\nsecret = \"a-b\"", "not a secret's name"},
		{"url = \"https://a.example.com\"\ntool = [\"x\"]", "tool"},
		{"url = \"https://a.example.com\"\ntools = \"x\"", "expected a list of strings"},
	} {
		_, err := Parse("moat.toml", []byte("[mcp.s]\n"+tc.toml+"\n"))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.toml, err, tc.want)
			continue
		}
		if !strings.HasPrefix(err.Error(), "moat.toml:") {
			t.Errorf("%s: %v names no file and line", tc.toml, err)
		}
	}
	if _, err := Parse("moat.toml", []byte("[mcp.Bad]\nurl = \"https://a.example.com\"\n")); err == nil {
		t.Error("an upper-case server name was accepted")
	}
}

func TestMCPCommand(t *testing.T) {
	f, err := Parse("/p/moat.toml", []byte("[mcp.local]\ncommand = [\"/usr/bin/srv\", \"--stdio\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := f.MCP["local"]; !slices.Equal(s.Command, []string{"/usr/bin/srv", "--stdio"}) || s.URL != "" || len(f.Network.Allow) != 0 {
		t.Errorf("local = %+v, network.allow %q", s, f.Network.Allow)
	}
	// The keys that would pretend the gate decides its calls are refused.
	for _, k := range []string{`tools = ["x"]`, `secret = "A"`, `url = "https://a.example.com"`, `audit_arguments = true`} {
		_, err := Parse("moat.toml", []byte("[mcp.local]\ncommand = [\"srv\"]\n"+k+"\n"))
		if err == nil || !strings.Contains(err.Error(), "the gate does not see its calls") {
			t.Errorf("%s with a command: %v", k, err)
		}
	}
}

func TestMCPValidateSecret(t *testing.T) {
	user := mustParse(t, "/u/config.toml", `
[secrets.GH_TOKEN]
from = "env:GH_TOKEN"
hosts = ["api.example.com"]

[secrets.WILD]
from = "env:WILD"
hosts = ["*.example.com"]
`)
	for _, tc := range []struct{ proj, want string }{
		{"[mcp.gh]\nurl = \"https://mcp.example.com/mcp\"\nsecret = \"NOPE\"", "no secret NOPE is defined"},
		{"[mcp.gh]\nurl = \"https://mcp.example.com/mcp\"\nsecret = \"GH_TOKEN\"", `add "mcp.example.com" to its hosts`},
		{"[mcp.gh]\nurl = \"https://mcp.example.com/mcp\"\nsecret = \"WILD\"", ""},
		{"[mcp.gh]\nurl = \"https://api.example.com/mcp\"\nsecret = \"GH_TOKEN\"", ""},
	} {
		err := Merge(user, mustParse(t, "/p/moat.toml", tc.proj)).Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.proj, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err = %v, want %q", tc.proj, err, tc.want)
		case tc.want != "" && !strings.HasPrefix(err.Error(), "/p/moat.toml:3"):
			t.Errorf("%s: %v does not point at the secret's line", tc.proj, err)
		}
	}
}

func TestMCPMergeReplacesWhole(t *testing.T) {
	user := mustParse(t, "/u/config.toml", "[mcp.gh]\nurl = \"https://mcp.example.com/mcp\"\ntools = [\"*\"]\n")
	proj := mustParse(t, "/p/moat.toml", "[mcp.gh]\nurl = \"https://mcp.example.com/mcp\"\ntools = [\"read_*\"]\n")
	c := Merge(user, proj)
	if got := c.Network.MCP["gh"]; !slices.Equal(got.Tools, []string{"read_*"}) || got.Source != "/p/moat.toml" {
		t.Errorf("merged gh = %+v", got)
	}
	// Each file's layer allows the URL it declared: the project's needs consent as its own.
	var layers []string
	for _, l := range c.Network.Layers {
		if slices.Contains(l.Allow, "mcp.example.com:443/mcp") {
			layers = append(layers, l.Source)
		}
	}
	if !slices.Equal(layers, []string{"/u/config.toml", "/p/moat.toml"}) {
		t.Errorf("layers allowing the URL: %q", layers)
	}
}

func TestMCPLocal(t *testing.T) {
	f, err := Parse("/p/moat.toml", []byte("[mcp.ed]\nurl = \"http://127.0.0.1:7777/mcp\"\ntools = [\"read_*\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := f.MCP["ed"]
	if !s.Local || s.Host != LocalHost || s.Port != 7777 || s.Path != "/mcp" || len(f.Network.Allow) != 0 {
		t.Errorf("ed = %+v, network.allow %q (a local server allows nothing in the policy)", s, f.Network.Allow)
	}
	if got, want := s.GuestURL("10.88.0.1"), "http://10.88.0.1:7777/mcp"; got != want {
		t.Errorf("GuestURL = %q, want %q", got, want)
	}
	if r := (MCPServer{URL: "https://a.example.com/mcp"}); r.GuestURL("10.88.0.1") != r.URL {
		t.Errorf("a remote server's GuestURL changed: %q", r.GuestURL("10.88.0.1"))
	}
	for _, tc := range []struct{ toml, want string }{
		{`url = "http://localhost:7777/mcp"`, `write the host's loopback as 127.0.0.1, e.g. "http://127.0.0.1:7777/mcp"`},
		{`url = "http://[::1]:7777/mcp"`, "as 127.0.0.1"},
		{`url = "http://127.0.0.2:7777/mcp"`, "as 127.0.0.1"},
		{`url = "http://0.0.0.0:7777/mcp"`, "as 127.0.0.1"},
		{`url = "http://a.localhost:7777/mcp"`, "as 127.0.0.1"},
		{`url = "https://127.0.0.1:7777/mcp"`, `plain http`},
		{`url = "http://127.0.0.1/mcp"`, "name the port"},
		{`url = "http://127.0.0.1:53/mcp"`, "DNS"},
		{`url = "http://u:p@127.0.0.1:7777/mcp"`, "credentials"},
		{`url = "http://127.0.0.1:7777/mcp?token=abc"`, "looks like a credential"},
		{"url = \"http://127.0.0.1:7777/mcp\"\nsecret = \"A\"", "gets no secret"},
	} {
		_, err := Parse("moat.toml", []byte("[mcp.s]\n"+tc.toml+"\n"))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "moat.toml:") {
			t.Errorf("%s: err = %v, want one naming the file and containing %q", tc.toml, err, tc.want)
		}
	}
}

func TestMCPLocalMeetsForwards(t *testing.T) {
	user := mustParse(t, "/u/config.toml", "[forwards]\nreverse = [\"5432\"]\n")
	for _, tc := range []struct{ proj, want string }{
		{"[mcp.ed]\nurl = \"http://127.0.0.1:7777/mcp\"", ""},
		{"[mcp.ed]\nurl = \"http://127.0.0.1:5432/mcp\"", "gateway port 5432 is both"},
		{"[forwards]\nreverse = [\"7777:17777\"]\n\n[mcp.ed]\nurl = \"http://127.0.0.1:7777/mcp\"", "around its rules"},
		{"[mcp.a]\nurl = \"http://127.0.0.1:7777/mcp\"\n\n[mcp.b]\nurl = \"http://127.0.0.1:7777/MCP/\"", "both at 127.0.0.1:7777/mcp"},
		{"[mcp.a]\nurl = \"http://127.0.0.1:7777/a\"\n\n[mcp.b]\nurl = \"http://127.0.0.1:7777/b\"", ""},
	} {
		err := Merge(user, mustParse(t, "/p/moat.toml", tc.proj)).Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.proj, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err = %v, want %q", tc.proj, err, tc.want)
		case tc.want != "" && !strings.HasPrefix(err.Error(), "/p/moat.toml:"):
			t.Errorf("%s: %v does not name the declaring file", tc.proj, err)
		}
	}
}
