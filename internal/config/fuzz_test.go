package config

import (
	"errors"
	"testing"
)

// FuzzParse feeds arbitrary documents to Parse. A project's moat.toml
// comes with the repository, so it is input moat does not control: Parse
// must never panic, and every failure must be a positioned *Error.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"",
		"[sandbox]\nname = \"api\"\nmemory = \"1GiB\"\nidle_timeout = \"off\"",
		"[[shares]]\npath = \"~/x\"\n[[shares]]\npath = \"y\"\n[shares.z]\n",
		"shares = [{path = \"a\", target = \"/a\"}, \"x\", [[1]]]",
		"[forwards]\nports = [1, \"2:3\", 2.5, {a = 1}, [[]]]",
		"[secrets.A]\nfrom = \"env:A\"\nhosts = [\"h\"]\n[secrets.\"b.c\"]\nx = 1",
		"[env]\nA = \"${X:-${Y}}\"\n\"\" = \"\"",
		"sandbox.memory.max.x = 1\na.b.c = [\n1,\n2]",
		"[sandbox]\ncpus = 1\ncpus = 2\n[sandbox]",
		"x = [[[[[[[[[[1]]]]]]]]]]",
		"[[a.b]]\n[[a]]\n[a.b.c]",
		"[mcp.a]\nurl = \"http://127.0.0.1:7777/mcp\"\n[mcp.b]\nurl = \"http://127.0.0.1:7777/MCP/\"\n[forwards]\nreverse = [7777]",
		"[mcp.a]\nurl = \"http://[::1]:7/\"\n[mcp.b]\nurl = \"http://127.0.0.1:53\"\nsecret = \"X\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("/p/moat.toml", data)
		if err == nil {
			if file == nil {
				t.Fatal("nil File and nil error")
			}
			Merge(file, file).Validate() //nolint:errcheck // must not panic; errors are fine
			return
		}
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("error %v is not ErrInvalid", err)
		}
		var e *Error
		if !errors.As(err, &e) || e.File != "/p/moat.toml" {
			t.Fatalf("error %v: want an *Error naming the file", err)
		}
	})
}
