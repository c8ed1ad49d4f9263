package preset

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"moat.dev/moat/internal/secret"
	"moat.dev/moat/internal/state"
)

// SeedRole is the hidden role of the moat binary that `moat run PRESET`
// runs in the guest, as the session's user, in front of the agent:
//
//	/.moat/moat __seed NAME WORKSPACE -- AGENT ARGS...
//
// It merges the first-run answers into the agent's settings (seed.go),
// says once per version when the installed agent is newer than the one
// the preset was checked with, sets the preset's key aliases, and execs
// the agent. It runs in the guest because that is where the agent's
// files are, and because the only values it sees there are placeholders.
const SeedRole = "__seed"

// SeedArgv wraps a preset's command line in the seeding role.
func SeedArgv(binary string, p *Preset, workspace string, argv []string) []string {
	if len(argv) == 0 || len(p.Command) == 0 {
		return argv
	}
	out := []string{binary, SeedRole, p.Name, workspace, "--"}
	return append(out, argv...)
}

// SeedMain is the role's entry point; args follow the role's name. A
// failure to seed is reported and the agent runs anyway: the settings
// only save questions. It returns only when the agent cannot be started.
func SeedMain(args []string, stderr io.Writer) int {
	if len(args) < 4 || args[2] != "--" {
		fmt.Fprintln(stderr, "moat __seed: usage: __seed NAME WORKSPACE -- COMMAND...")
		return 2
	}
	name, ws, argv := args[0], args[1], args[3:]
	p, err := Lookup(name)
	if err != nil {
		fmt.Fprintln(stderr, "moat:", err)
		return 2
	}
	env := os.Environ()
	for alias, from := range p.Aliases {
		if v := os.Getenv(from); strings.HasPrefix(v, secret.PlaceholderPrefix) && os.Getenv(alias) == "" {
			env = append(env, alias+"="+v)
			os.Setenv(alias, v)
		}
	}
	path, lookErr := exec.LookPath(argv[0])
	if lookErr == nil {
		if err := seed(p, ws, path, stderr); err != nil {
			fmt.Fprintf(stderr, "moat: seeding %s's settings: %v (it may ask its first-run questions)\n", name, err)
		}
	}
	if lookErr != nil {
		fmt.Fprintf(stderr, "moat: %s: command not found\n", argv[0])
		return 127
	}
	err = syscall.Exec(path, argv, env)
	fmt.Fprintf(stderr, "moat: starting %s: %v\n", argv[0], err)
	return 126
}

// seed merges p's settings in the user's home and notes a newer version.
func seed(p *Preset, ws, path string, stderr io.Writer) error {
	home, err := os.UserHomeDir()
	if err != nil {
		return err
	}
	in := SeedInput{Dirs: dirs(ws), Env: p.Env, Version: installedVersion(path, p.Package),
		MCP: mcpFromEnv(func(s string) { fmt.Fprintln(stderr, "moat:", s) })}
	if in.Version != "" && p.Checked != "" && NewerThan(in.Version, p.Checked) {
		noteNewer(p, home, in.Version, stderr)
	}
	switch p.Name {
	case "claude":
		in.Key = placeholderOf("ANTHROPIC_API_KEY")
		cfgDir := os.Getenv("CLAUDE_CONFIG_DIR")
		cfgFile := filepath.Join(home, ".claude.json")
		if cfgDir == "" {
			cfgDir = filepath.Join(home, ".claude")
		} else {
			cfgFile = filepath.Join(cfgDir, ".claude.json")
		}
		if err := mergeFile(cfgFile, in, MergeClaudeConfig); err != nil {
			return err
		}
		return mergeFile(filepath.Join(cfgDir, "settings.json"), in, MergeClaudeSettings)
	case "codex":
		in.Key = placeholderOf("CODEX_API_KEY")
		dir := os.Getenv("CODEX_HOME")
		if dir == "" {
			dir = filepath.Join(home, ".codex")
		}
		if err := mergeFile(filepath.Join(dir, "config.toml"), in, MergeCodexConfig); err != nil {
			return err
		}
		return mergeFile(filepath.Join(dir, "auth.json"), in, MergeCodexAuth)
	}
	return nil
}

// placeholderOf is the variable's value if it is a placeholder, else "":
// a value that is not one came from elsewhere and is not moat's to store.
func placeholderOf(k string) string {
	if v := os.Getenv(k); strings.HasPrefix(v, secret.PlaceholderPrefix) {
		return v
	}
	return ""
}

// dirs are the directories to trust: the workspace and the session's own.
func dirs(ws string) []string {
	out := []string{ws}
	if wd, err := os.Getwd(); err == nil && wd != ws {
		out = append(out, wd)
	}
	return out
}

// mergeFile applies merge to path's content and writes the result, 0600
// (the agents keep their logins there), atomically.
func mergeFile(path string, in SeedInput, merge func([]byte, SeedInput) ([]byte, bool, error)) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	out, changed, err := merge(old, in)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if !changed {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return state.WriteAtomic(path, out, 0o600)
}

// installedVersion reads the version of the npm package pkg that the
// program at path belongs to (npm links bin/<name> into the package), or
// "" when it is not one.
func installedVersion(path, pkg string) string {
	if pkg == "" {
		return ""
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return ""
	}
	for d, i := filepath.Dir(real), 0; i < 4 && d != "/"; d, i = filepath.Dir(d), i+1 {
		b, err := os.ReadFile(filepath.Join(d, "package.json"))
		if err != nil {
			continue
		}
		var m struct{ Name, Version string }
		if json.Unmarshal(b, &m) == nil && m.Name == pkg {
			return m.Version
		}
	}
	return ""
}

// noteNewer tells the user, once per installed version, that the preset
// was checked with an older one.
func noteNewer(p *Preset, home, version string, stderr io.Writer) {
	mark := filepath.Join(home, ".cache", "moat", p.Name+"-version-noted")
	if b, err := os.ReadFile(mark); err == nil && strings.TrimSpace(string(b)) == version {
		return
	}
	fmt.Fprintf(stderr, "moat: %s %s is newer than %s, the version the %s preset was checked with; "+
		"if it fails to reach a host, moat network denials says which, and moat network allow HOST allows it\n",
		p.Command[0], version, p.Checked, p.Name)
	if os.MkdirAll(filepath.Dir(mark), 0o700) == nil {
		os.WriteFile(mark, []byte(version+"\n"), 0o600)
	}
}
