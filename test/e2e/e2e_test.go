// Package e2e drives the built moat binary exactly as a user types it,
// against real gVisor, real namespaces and the real daemon. All tests share
// one binary (MOAT_BIN, built by scripts/setup.sh) and one MOAT_HOME.
package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var (
	moatBin  string
	moatHome string
)

func TestMain(m *testing.M) {
	moatBin = os.Getenv("MOAT_BIN")
	if moatBin == "" || os.Geteuid() != 0 {
		fmt.Println("e2e: skipped: needs root and MOAT_BIN (the built moat); run ./scripts/test.sh")
		os.Exit(0)
	}
	// moat runs a sandbox's processes from the moat-sandbox beside it:
	// without one every test would fail the same way.
	if sb := filepath.Join(filepath.Dir(moatBin), "moat-sandbox"); !fileExists(sb) {
		fmt.Printf("e2e: MOAT_BIN is %s, but %s is missing; build moat's binaries together: go build -o DIR/ ./cmd/...\n", moatBin, sb)
		os.Exit(1)
	}
	var err error
	moatHome, err = os.MkdirTemp("", "moat-e2e-home-")
	if err != nil {
		panic(err)
	}
	code := m.Run()
	// Tear down whatever a failed test left running.
	out, _ := exec.Command(moatBin, "list", "--json").Output()
	for _, f := range strings.Split(string(out), `"name":"`)[1:] {
		name := f[:strings.IndexByte(f, '"')]
		c := exec.Command(moatBin, "destroy", "--yes", name)
		c.Env = moatEnv(nil)
		c.Run()
	}
	os.RemoveAll(moatHome)
	os.Exit(code)
}

func moatEnv(extra []string) []string {
	return append(append(os.Environ(), "MOAT_HOME="+moatHome), extra...)
}

type result struct {
	stdout, stderr string
	code           int
}

// trusting adds --trust-project to run and up: the tests' project files are the tests' own,
// so they accept what they ask for, as a user would at the prompt (TestProjectConsent checks
// the asking itself).
func trusting(args []string) []string {
	if len(args) > 0 && (args[0] == "run" || args[0] == "up") {
		return append([]string{args[0], "--trust-project"}, args[1:]...)
	}
	return args
}

// moat runs the binary in dir with a bounded time.
func moat(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(moatBin, trusting(args)...)
	cmd.Dir = dir
	cmd.Env = moatEnv(env)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(120 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("moat %v timed out; stderr: %s", args, se.String())
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{so.String(), se.String(), code}
}

func mustMoat(t *testing.T, dir string, args ...string) string {
	t.Helper()
	r := moat(t, dir, nil, args...)
	if r.code != 0 {
		t.Fatalf("moat %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// project makes a fresh project directory owned by uid.
func project(t *testing.T, name string) string {
	t.Helper()
	base, err := os.MkdirTemp("", "moat-e2e-proj-")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(dir, 1234, 1234)
	t.Cleanup(func() {
		c := exec.Command(moatBin, "destroy", "--yes", name)
		c.Env = moatEnv(nil)
		c.Run()
		os.RemoveAll(base)
	})
	return dir
}

func TestRunAsAgentInWorkspace(t *testing.T) {
	dir := project(t, "runbasic")
	r := moat(t, dir, []string{"SUDO_UID=1234", "SUDO_GID=1234"}, "run", "--", "sh", "-c", "id -un; id -u; pwd; echo hi > f; sudo -n id -u")
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	got := strings.Fields(r.stdout)
	want := []string{"agent", "1234", dir, "0"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got %q, want %q", got, want)
	}
	fi, err := os.Stat(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatalf("file written in the guest is not on the host: %v", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 1234 || st.Gid != 1234 {
		t.Fatalf("f owned by %d:%d, want 1234:1234", st.Uid, st.Gid)
	}
	if r := moat(t, dir, nil, "run", "--", "sh", "-c", "exit 7"); r.code != 7 {
		t.Fatalf("exit code %d, want 7 (stderr %s)", r.code, r.stderr)
	}
}

// TestNoWayOut: with a policy that allows nothing, the guest reaches
// nothing, fast, and sees exactly one interface. The gate's own tests
// (gate_*_test.go) cover what an allow opens and every way around it.
func TestNoWayOut(t *testing.T) {
	dir := project(t, "noway")
	os.WriteFile(filepath.Join(dir, "moat.toml"), []byte("[network]\nuse = [\"none\"]\n"), 0o644)
	mustMoat(t, dir, "up")
	start := time.Now()
	// bash's /dev/tcp dials a real TCP connection from the guest. Port 22:
	// the gate reads nothing there, so a refusal is a reset at once (on 80
	// and 443 it first reads the request or ClientHello, then refuses).
	script := `for a in 203.0.113.9:22 10.88.0.1:80 127.0.0.2:1; do h=${a%:*}; p=${a#*:}; if timeout 5 bash -c "echo > /dev/tcp/$h/$p" 2>/dev/null; then echo "OPEN $a"; else echo "closed $a"; fi; done
echo "DNS $(timeout 5 getent hosts example.com | cut -d' ' -f1)"
grep -c : /proc/net/dev; grep -v lo: /proc/net/dev | grep : | cut -d: -f1 | tr -d ' '`
	out := mustMoat(t, dir, "run", "--", "bash", "-c", script)
	if strings.Contains(out, "OPEN") {
		t.Fatalf("guest reached out:\n%s", out)
	}
	// A denied name resolves, but only to the gate's private pool
	// (198.18.0.0/15), never to its real address: the name never left.
	if !strings.Contains(out, "DNS 198.18.") && !strings.Contains(out, "DNS 198.19.") {
		t.Fatalf("a denied name did not get a pool address:\n%s", out)
	}
	lines := strings.Fields(out)
	if n := len(lines); n < 2 || lines[n-2] != "2" || lines[n-1] != "tap0" {
		t.Fatalf("want exactly lo and one other interface (tap0), got:\n%s", out)
	}
	// Fail fast: one probe that ran into its 5 s timeout alone would exceed
	// this; refused connections and lookups must all come back at once.
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("probes took %v: a refusal was not prompt", el)
	}
}

func TestDownKeepsUpperDestroyCleans(t *testing.T) {
	dir := project(t, "persist")
	mustMoat(t, dir, "run", "--", "sudo", "sh", "-c", "echo kept > /usr/local/moat-e2e-marker")
	if _, err := os.Stat("/usr/local/moat-e2e-marker"); err == nil {
		t.Fatal("the guest's write under /usr/local reached the host")
	}
	mustMoat(t, dir, "down")
	if out := mustMoat(t, dir, "list"); !strings.Contains(out, "stopped (user)") {
		t.Fatalf("list after down:\n%s", out)
	}
	if out := mustMoat(t, dir, "run", "--", "cat", "/usr/local/moat-e2e-marker"); strings.TrimSpace(out) != "kept" {
		t.Fatalf("after down/up got %q", out)
	}
	mustMoat(t, dir, "destroy", "--yes")
	assertNothingLeft(t)
}

// assertNothingLeft checks mounts, namespaces' processes, runsc, and the
// cgroups of this MOAT_HOME's sandboxes in every hierarchy (v1 and v2).
func assertNothingLeft(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mounts, _ := os.ReadFile("/proc/mounts")
		ps, _ := exec.Command("ps", "-eo", "args").Output()
		var left []string
		if strings.Contains(string(mounts), moatHome) {
			left = append(left, "mounts under MOAT_HOME")
		}
		for _, l := range strings.Split(string(ps), "\n") {
			if strings.Contains(l, moatHome) && (strings.Contains(l, "runsc") || strings.Contains(l, "__daemon") || strings.Contains(l, "__shim") || strings.Contains(l, "__gate")) {
				left = append(left, l)
			}
		}
		left = append(left, ourCgroups()...)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v\n%s", left, cgroupDiagnosis())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cgroupDiagnosis says what is still in this MOAT_HOME's cgroups (pid, state
// and name of each process, whatever its command line) and what the
// sandboxes' shims logged once their daemon was gone: for a test that
// finds a cgroup left behind.
func cgroupDiagnosis() string {
	var b strings.Builder
	for _, g := range ourCgroups() {
		dir := strings.TrimPrefix(g, "cgroup ")
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		subs, _ := filepath.Glob(filepath.Join(dir, "*", "cgroup.procs"))
		fmt.Fprintf(&b, "%s: %d child groups, processes:", dir, len(subs))
		for _, pid := range strings.Fields(string(procs)) {
			st, _ := os.ReadFile(filepath.Join("/proc", pid, "stat"))
			fmt.Fprintf(&b, " [%s]", strings.TrimSpace(string(st[:min(len(st), 40)])))
		}
		b.WriteString("\n")
	}
	logs, _ := filepath.Glob(filepath.Join(moatHome, "state", "sandboxes", "*", "daemon.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "component=shim") {
				fmt.Fprintf(&b, "%s: %s\n", filepath.Base(filepath.Dir(l)), line)
			}
		}
	}
	return b.String()
}

// ourCgroups lists the cgroups of this MOAT_HOME's sandboxes, in every
// hierarchy under /sys/fs/cgroup: a directory moat/<name>-<hash> (and
// its daemon's, moat/<name>-<hash>.daemon), where
// hash is the first 4 bytes of the SHA-256 of the sandbox's state dir
// (resources.groupID), so other MOAT_HOMEs' groups on a shared host are
// not ours. Bounded in depth.
func ourCgroups() []string {
	var out []string
	const maxDepth = 6
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel("/sys/fs/cgroup", p)
		if strings.Count(rel, "/") >= maxDepth {
			return filepath.SkipDir
		}
		if filepath.Base(filepath.Dir(p)) != "moat" {
			return nil
		}
		// A sandbox's daemon group is its group's name and ".daemon".
		name := strings.TrimSuffix(filepath.Base(p), ".daemon")
		i := strings.LastIndexByte(name, '-')
		if i < 0 {
			return nil
		}
		sum := sha256.Sum256([]byte(filepath.Join(moatHome, "state", "sandboxes", name[:i])))
		if name[i+1:] == hex.EncodeToString(sum[:4]) {
			out = append(out, "cgroup "+p)
		}
		return filepath.SkipDir
	})
	return out
}

func TestSIGKILLDaemonCrashesAndRecovers(t *testing.T) {
	dir := project(t, "crashy")
	mustMoat(t, dir, "up")
	b, err := os.ReadFile(filepath.Join(moatHome, "state/sandboxes/crashy/daemon.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if len(ourCgroups()) == 0 {
		t.Fatal("no cgroup of the running sandbox found under /sys/fs/cgroup: the check below would prove nothing")
	}
	t.Cleanup(func() {
		// What the shim said, before the project's clean-up removes it.
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(moatHome, "state/sandboxes/crashy/daemon.log"))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("daemon.log, last lines:\n%s", strings.Join(lines[max(0, len(lines)-25):], "\n"))
		}
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	// Nothing left, the sandbox's cgroup included, before any moat
	// command runs again: the killed daemon's shim removed it.
	assertNothingLeft(t)
	if out := mustMoat(t, dir, "list"); !strings.Contains(out, "crashed") {
		t.Fatalf("list after SIGKILL:\n%s", out)
	}
	mustMoat(t, dir, "up")
	if out := mustMoat(t, dir, "run", "--", "echo", "back"); strings.TrimSpace(out) != "back" {
		t.Fatalf("after recovery: %q", out)
	}

	// A daemon killed together with its shim leaves its cgroups behind:
	// destroy removes them with the rest. (The shim is stopped first, so
	// that it cannot act between the two kills.)
	b, err = os.ReadFile(filepath.Join(moatHome, "state/sandboxes/crashy/daemon.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	out, err := exec.Command("pgrep", "-f", "__shim "+filepath.Join(moatHome, "state/sandboxes/crashy/shim.json")).Output()
	shim, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || shim <= 0 {
		t.Fatalf("finding the daemon's shim: %v %q", err, out)
	}
	syscall.Kill(shim, syscall.SIGSTOP)
	syscall.Kill(pid, syscall.SIGKILL)
	syscall.Kill(shim, syscall.SIGKILL)
	for i := 0; i < 100 && (syscall.Kill(pid, 0) == nil || syscall.Kill(shim, 0) == nil); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if len(ourCgroups()) == 0 {
		t.Fatal("the cgroup is gone without its shim: the destroy below would prove nothing")
	}
	mustMoat(t, dir, "destroy", "--yes")
	assertNothingLeft(t)
}

func TestTwoSandboxesIsolated(t *testing.T) {
	a, b := project(t, "iso-a"), project(t, "iso-b")
	mustMoat(t, a, "run", "--", "sh", "-c", "echo secret > /tmp/a-only; (sleep 300 >/dev/null 2>&1 &)")
	out := mustMoat(t, b, "run", "--", "sh", "-c", "ls /tmp; ls "+a+" 2>&1; ps -eo args")
	if strings.Contains(out, "a-only") || strings.Contains(out, "sleep 300") {
		t.Fatalf("sandbox b sees a's files or processes:\n%s", out)
	}
}

func TestBadInput(t *testing.T) {
	dir := project(t, "badcfg")
	os.WriteFile(filepath.Join(dir, "moat.toml"), []byte("[sandbox]\nimgae = \"host\"\n"), 0o644)
	r := moat(t, dir, nil, "run", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "moat.toml:2") || !strings.Contains(r.stderr, "imgae") {
		t.Fatalf("unknown key: exit %d, stderr %q", r.code, r.stderr)
	}
	os.WriteFile(filepath.Join(dir, "moat.toml"), []byte("[sandbox]\nimage = \"no-such-image:1\"\n"), 0o644)
	r = moat(t, dir, nil, "run", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "moat image") {
		t.Fatalf("missing image: exit %d, stderr %q", r.code, r.stderr)
	}
	os.Remove(filepath.Join(dir, "moat.toml"))
	other := project(t, "taken")
	mustMoat(t, other, "up")
	// Taking an existing sandbox's name for a second workspace must fail.
	os.WriteFile(filepath.Join(dir, "moat.toml"), []byte("[sandbox]\nname = \"taken\"\n"), 0o644)
	r = moat(t, dir, nil, "up")
	if r.code == 0 || !strings.Contains(r.stderr, "taken") {
		t.Fatalf("taken name: exit %d, stderr %q", r.code, r.stderr)
	}
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", moatBin, "run", "--", "true")
	cmd.Dir, cmd.Env = "/", moatEnv(nil)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 4 || !strings.Contains(string(out), "needs root") {
		t.Fatalf("without root: %v %s", err, out)
	}
}
