package e2e

// What moat leaves running keeps none of the user's environment (threat model
// 23): the daemon lives as long as the sandbox, and its initial
// environment stays readable in /proc/PID/environ all that time.

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"moat.dev/moat/internal/preset"
)

const envToml = `[env]
GREETING = "${E2E_GREETING}"

[hooks]
on_up = ["echo \"$GREETING\" > .greeting"]
`

func TestDaemonKeepsNoUserEnvironment(t *testing.T) {
	dir := project(t, "secrets-env-e2e")
	name := "secrets-env-e2e"
	os.Chmod(dir, 0o777) // the hook writes as the guest's agent user
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(envToml), 0o644); err != nil {
		t.Fatal(err)
	}
	// A canary for every key a preset reads, one for a token no preset
	// knows, and one [env] reads.
	canaries := map[string]string{}
	for _, n := range preset.Names() {
		p, err := preset.Lookup(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Secrets {
			canaries[s.Env] = "mc-" + strings.ToLower(s.Env) + "-" + randHex(t, 12)
		}
	}
	canaries["ACME_CLOUD_TOKEN"] = "mc-made-up-" + randHex(t, 12)
	canaries["E2E_GREETING"] = "mc-greeting-" + randHex(t, 12)
	var env []string
	for k, v := range canaries {
		env = append(env, k+"="+v)
	}

	// The first run, through the claude preset; claude need not be
	// installed: the sandbox is started either way.
	r := moat(t, dir, env, "run", "claude", "--", "--version")
	if r.code != 0 && r.code != 127 {
		t.Fatalf("run claude: exit %d\n%s", r.code, r.stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ".greeting")); strings.TrimSpace(string(b)) != canaries["E2E_GREETING"] {
		t.Errorf("the on_up hook saw GREETING=%q, want the [env] value handed over", b)
	}

	// A preset used later gets its key from that command's environment.
	r = moat(t, dir, env, "run", "codex", "--", "--version")
	if r.code != 0 && r.code != 127 {
		t.Fatalf("run codex: exit %d\n%s", r.code, r.stderr)
	}
	out := mustMoat(t, dir, "run", "--", "sh", "-c", "echo OPENAI=$OPENAI_API_KEY")
	if !strings.Contains(out, "OPENAI=moat-ph-") {
		t.Errorf("after moat run codex a session sees %q, want the OpenAI key's placeholder", out)
	}

	daemons, runscs := 0, 0
	for _, p := range moatProcesses(t) {
		if bytes.Contains(p.cmdline, []byte("__daemon")) && bytes.Contains(p.cmdline, []byte(name)) {
			daemons++
		}
		if p.runsc {
			runscs++
		}
		for k, v := range canaries {
			if bytes.Contains(p.environ, []byte(v)) || bytes.Contains(p.cmdline, []byte(v)) {
				t.Errorf("pid %d (%s) holds %s in its environment or argv", p.pid, strings.ReplaceAll(string(p.cmdline), "\x00", " "), k)
			}
		}
	}
	if daemons != 1 || runscs == 0 {
		t.Fatalf("found %d daemons of %s and %d runsc processes; want 1 and some", daemons, name, runscs)
	}
}

type procInfo struct {
	pid              int
	cmdline, environ []byte
	runsc            bool
}

// moatProcesses is every process running the moat binary or runsc.
func moatProcesses(t *testing.T) []procInfo {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []procInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		base := filepath.Join("/proc", e.Name())
		exe, _ := os.Readlink(filepath.Join(base, "exe"))
		cmdline, _ := os.ReadFile(filepath.Join(base, "cmdline"))
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		isRunsc := strings.Contains(filepath.Base(exe), "runsc") || bytes.Contains(argv0, []byte("runsc"))
		if !isMoatExe(exe) && !isRunsc {
			continue
		}
		environ, err := os.ReadFile(filepath.Join(base, "environ"))
		if err != nil {
			continue // gone meanwhile
		}
		out = append(out, procInfo{pid: pid, cmdline: cmdline, environ: environ, runsc: isRunsc})
	}
	return out
}
