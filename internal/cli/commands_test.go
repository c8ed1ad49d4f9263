package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
)

// These tests run moat's command line in process, as a user types it,
// over every command: argument parsing, help and exit codes. They need
// neither root nor a sandbox: each runs in an empty MOAT_HOME and working
// directory, and the commands that run at all stop at a check (a bad
// name, no such sandbox) before they would start anything.

// moatCLI is a command line's outcome: its exit code as Main computes it,
// and what cobra printed (commands that print to the process's own
// stdout or stderr are not captured).
type moatCLI struct {
	code        int
	out, errOut string
}

// moat runs args as `moat args...` in process.
func moat(args ...string) moatCLI {
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(""))
	err := root.Execute()
	r := moatCLI{out: out.String(), errOut: errOut.String()}
	// As Main: a command's own status passes through; any other error
	// is printed and carries its code.
	var ce commandExit
	switch {
	case err == nil:
		r.code = ExitOK
	case errors.As(err, &ce):
		r.code = int(ce)
	default:
		r.errOut += "moat: " + err.Error() + "\n"
		r.code = exitCode(err)
	}
	return r
}

// isolate gives the test an empty MOAT_HOME and working directory.
func isolate(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("MOAT_HOME", home)
	t.Chdir(t.TempDir())
	return home
}

// visible is every command of the tree a user can see, root first.
func visible() []*cobra.Command {
	var out []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		out = append(out, c)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRoot())
	return out
}

// words is the command line that names c: "network allow" for moat
// network allow.
func words(c *cobra.Command) []string { return strings.Fields(c.CommandPath())[1:] }

// TestHelpExitsZero: --help, -h and `moat help` work on every command,
// print its long help on stdout and nothing on stderr.
func TestHelpExitsZero(t *testing.T) {
	isolate(t)
	for _, c := range visible() {
		first := strings.SplitN(c.Long, "\n", 2)[0]
		lines := [][]string{append(words(c), "--help"), append(words(c), "-h")}
		if c.Name() != "exit-codes" { // moat help exit-codes is the codes themselves
			lines = append(lines, append([]string{"help"}, words(c)...))
		}
		for _, args := range lines {
			r := moat(args...)
			if r.code != ExitOK || !strings.Contains(r.out, first) || !strings.Contains(r.out, "Usage:") || r.errOut != "" {
				t.Errorf("moat %s: exit %d, stdout %.80q..., stderr %q; want 0 and its help on stdout only",
					strings.Join(args, " "), r.code, r.out, r.errOut)
			}
		}
	}
	if r := moat("help", "exit-codes"); r.code != ExitOK || !strings.Contains(r.out, "125") {
		t.Errorf("moat help exit-codes: exit %d, stdout %q", r.code, r.out)
	}
	t.Run("unknown topic", func(t *testing.T) {
		for _, args := range [][]string{{"help", "no-such-topic"}, {"help", "network", "no-such-topic"}} {
			if r := moat(args...); r.code != ExitUsage || !strings.Contains(r.errOut, "unknown help topic") {
				t.Errorf("moat %s: exit %d, stderr %q; want %d and unknown help topic", strings.Join(args, " "), r.code, r.errOut, ExitUsage)
			}
		}
	})
}

// TestUnknownFlagExitsTwo: an unknown flag is bad usage on every command,
// and the error names the flag and the help to read.
func TestUnknownFlagExitsTwo(t *testing.T) {
	isolate(t)
	for _, c := range visible() {
		args := append(words(c), "--no-such-flag")
		r := moat(args...)
		if r.code != ExitUsage || !strings.Contains(r.errOut, "--no-such-flag") || !strings.Contains(r.errOut, "see: "+c.CommandPath()+" --help") {
			t.Errorf("moat %s: exit %d, stderr %q; want %d naming the flag and %s --help", strings.Join(args, " "), r.code, r.errOut, ExitUsage, c.CommandPath())
		}
	}
}

// anyArgs are the commands that take any number of arguments, and why.
var anyArgs = map[string]string{
	// Its words are a preset and a command; presetArgs refuses two
	// words before -- (TestUsageExitCodes).
	"moat run": "preset and command",
}

// TestArgCountExitsTwo: a wrong number of arguments is bad usage on every
// command, found by asking each command's own check which counts it
// refuses, and the error names the help to read.
func TestArgCountExitsTwo(t *testing.T) {
	isolate(t)
	var open []string
	for _, c := range visible() {
		n := -1
		for i := 0; i <= 4 && n < 0; i++ {
			if c.ValidateArgs(placeholders(i)) != nil {
				n = i
			}
		}
		if n < 0 {
			open = append(open, c.CommandPath())
			continue
		}
		args := append(words(c), placeholders(n)...)
		r := moat(args...)
		if r.code != ExitUsage || !strings.Contains(r.errOut, "see: "+c.CommandPath()+" --help") {
			t.Errorf("moat %s: exit %d, stderr %q; want %d and see: %s --help", strings.Join(args, " "), r.code, r.errOut, ExitUsage, c.CommandPath())
		}
	}
	var want []string
	for p := range anyArgs {
		want = append(want, p)
	}
	slices.Sort(open)
	slices.Sort(want)
	if !slices.Equal(open, want) {
		t.Errorf("commands that take any number of arguments: %q, want %q (anyArgs)", open, want)
	}
}

func placeholders(n int) []string {
	out := []string{}
	for i := range n {
		out = append(out, fmt.Sprintf("x%d", i+1))
	}
	return out
}

// TestBadFlagValueExitsTwo: a flag given a value of the wrong kind, or no
// value, is bad usage on every command, and the error names the flag.
func TestBadFlagValueExitsTwo(t *testing.T) {
	isolate(t)
	bad := map[string]string{"bool": "maybe", "duration": "lots", "int": "lots", "uint": "lots", "float64": "lots"}
	kinds := map[string]int{}
	for _, c := range visible() {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			kinds[f.Value.Type()]++
			if v, ok := bad[f.Value.Type()]; ok {
				args := append(words(c), "--"+f.Name+"="+v)
				r := moat(args...)
				if r.code != ExitUsage || !strings.Contains(r.errOut, "--"+f.Name) || !strings.Contains(r.errOut, v) {
					t.Errorf("moat %s: exit %d, stderr %q; want %d naming the flag and the value", strings.Join(args, " "), r.code, r.errOut, ExitUsage)
				}
			}
			if f.NoOptDefVal == "" {
				// A flag that takes a value, given none.
				args := append(words(c), "--"+f.Name)
				r := moat(args...)
				if r.code != ExitUsage || !strings.Contains(r.errOut, "needs an argument: --"+f.Name) {
					t.Errorf("moat %s: exit %d, stderr %q; want %d: flag needs an argument", strings.Join(args, " "), r.code, r.errOut, ExitUsage)
				}
			}
		})
	}
	for kind := range kinds {
		if _, ok := bad[kind]; !ok && kind != "string" {
			t.Errorf("flags of type %s: add a bad value for them to this test", kind)
		}
	}
	if kinds["bool"] == 0 || kinds["duration"] == 0 {
		t.Errorf("flag types found: %v; the test checks nothing it meant to", kinds)
	}
}

// needEnv skips t where sandbox commands cannot run as this user: moat
// without root needs a user namespace with subordinate ids, checked
// before any lookup (exit 4, ExitHost).
func needEnv(t *testing.T) {
	t.Helper()
	if _, err := newEnv(); err != nil {
		t.Skipf("sandbox commands cannot run as uid %d here (%v); run as root or as a user with subordinate ids", os.Geteuid(), err)
	}
}

// sandboxCommands name a sandbox; each line is complete but for it.
var sandboxCommands = [][]string{
	{"shell", "%s"},
	{"exec", "%s", "--", "true"},
	{"up", "%s"},
	{"down", "%s"},
	{"suspend", "%s"},
	{"resume", "%s"},
	{"fork", "%s", "child"},
	{"snapshot", "save", "%s"},
	{"snapshot", "list", "%s"},
	{"snapshot", "restore", "%s", "t1", "--yes"},
	{"snapshot", "rm", "%s", "t1", "--yes"},
	{"destroy", "%s", "--yes"},
	{"status", "%s"},
	{"logs", "%s"},
	{"network", "allow", "%s", "example.com"},
	{"network", "block", "%s", "example.com"},
	{"network", "remove", "%s", "example.com"},
	{"network", "list", "%s"},
	{"network", "denials", "%s"},
	{"network", "audit", "%s"},
	{"network", "suggest", "%s"},
	{"network", "watch", "%s", "--json"},
	{"forward", "add", "%s", "3000"},
	{"forward", "list", "%s"},
	{"forward", "remove", "%s", "3000"},
	{"secrets", "refresh", "%s"},
	{"ssh-config", "%s"},
}

func withName(line []string, name string) []string {
	out := slices.Clone(line)
	for i, w := range out {
		out[i] = strings.ReplaceAll(w, "%s", name)
	}
	return out
}

// TestNoSuchSandbox: every command that names a sandbox exits 3 for one
// that does not exist, saying which and how to see those that do; a name
// that cannot be a sandbox's (a path) is bad usage, refused before it is
// used as one; and the commands that default to the current directory's
// sandbox say there is none and how to make it.
func TestNoSuchSandbox(t *testing.T) {
	isolate(t)
	needEnv(t)
	covered := map[string]bool{}
	for _, line := range sandboxCommands {
		args := withName(line, "nosuch")
		c, _, _ := newRoot().Find(args)
		covered[c.CommandPath()] = true
		r := moat(args...)
		if r.code != ExitNotFound || !strings.Contains(r.errOut, `"nosuch"`) || !strings.Contains(r.errOut, "moat list") {
			t.Errorf("moat %s: exit %d, stderr %q; want %d naming the sandbox and moat list", strings.Join(args, " "), r.code, r.errOut, ExitNotFound)
		}
		args = withName(line, "../state")
		if r := moat(args...); r.code != ExitUsage || !strings.Contains(r.errOut, "contains") {
			t.Errorf("moat %s: exit %d, stderr %q; want %d, a bad name", strings.Join(args, " "), r.code, r.errOut, ExitUsage)
		}
	}
	// Every command whose argument is a sandbox's NAME is in the table.
	for _, c := range visible() {
		if strings.Contains(c.Use, "NAME") && c.Parent().Name() != "policy" && !covered[c.CommandPath()] {
			t.Errorf("%s takes a NAME: add it to sandboxCommands", c.CommandPath())
		}
	}
	for _, args := range [][]string{{"down"}, {"destroy", "--yes"}, {"status"}, {"secrets", "refresh"}} {
		if r := moat(args...); r.code != ExitNotFound || !strings.Contains(r.errOut, "no sandbox for") || !strings.Contains(r.errOut, "moat up") {
			t.Errorf("moat %s in an empty directory: exit %d, stderr %q; want %d and moat up", strings.Join(args, " "), r.code, r.errOut, ExitNotFound)
		}
	}
	// Named policies and images: not found either.
	for _, args := range [][]string{{"policy", "show", "nosuch"}, {"policy", "rm", "nosuch"}, {"policy", "refresh", "nosuch"}, {"image", "rm", "nosuch"}} {
		if r := moat(args...); r.code != ExitNotFound || !strings.Contains(r.errOut, "nosuch") {
			t.Errorf("moat %s: exit %d, stderr %q; want %d naming it", strings.Join(args, " "), r.code, r.errOut, ExitNotFound)
		}
	}
	// Nothing was made on the way.
	if recs, err := state.List(mustDirs(t)); err != nil || len(recs) != 0 {
		t.Errorf("sandboxes after the test: %v (%v), want none", recs, err)
	}
}

func mustDirs(t *testing.T) state.Dirs {
	t.Helper()
	d, err := state.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// runningSandbox makes a sandbox record whose "daemon" is the test: it holds
// the daemon's lock, and, with h, answers on the control socket.
func runningSandbox(t *testing.T, name string, h http.Handler) string {
	t.Helper()
	dir := mustDirs(t).Sandbox(name)
	ws := t.TempDir()
	if err := state.Create(dir, &state.Record{Name: name, Workspace: ws, Image: "host", Runtime: "gvisor", Desired: "running", State: state.StateRunning}); err != nil {
		t.Fatal(err)
	}
	release, ok, err := state.TryLock(state.DaemonLock(dir))
	if err != nil || !ok {
		t.Fatalf("taking the daemon lock: %v", err)
	}
	t.Cleanup(release)
	if h == nil {
		return dir
	}
	ln, err := net.Listen("unix", control.Socket(dir))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return dir
}

// TestDaemonFailureExitCodes: a running sandbox's daemon refusing a
// change (4xx) is bad usage, exit 2; the daemon failing (5xx), or not
// answering at all, is exit 1, never 2. The daemon's message reaches the
// user either way.
func TestDaemonFailureExitCodes(t *testing.T) {
	isolate(t)
	needEnv(t)
	tests := []struct {
		name   string
		status int // 0: no daemon on the socket
		want   int
	}{
		{"refused", http.StatusBadRequest, ExitUsage},
		{"conflict", http.StatusConflict, ExitUsage},
		{"failed", http.StatusInternalServerError, ExitError},
		{"stopping", http.StatusServiceUnavailable, ExitError},
		{"not answering", 0, ExitError},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := "the daemon says " + tt.name
			var h http.Handler
			var hits atomic.Int32
			if tt.status != 0 {
				h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					hits.Add(1)
					w.WriteHeader(tt.status)
					fmt.Fprintf(w, `{"schema":1,"error":%q}`, msg)
				})
			} else {
				msg = "calling daemon"
			}
			name := fmt.Sprintf("sb%d", i)
			dir := runningSandbox(t, name, h)
			for _, args := range [][]string{
				{"network", "allow", name, "example.com"},
				{"network", "remove", name, "example.com"},
				{"forward", "add", name, "3000"},
				{"forward", "remove", name, "3000"},
			} {
				r := moat(args...)
				if r.code != tt.want || !strings.Contains(r.errOut, msg) {
					t.Errorf("moat %s: exit %d, stderr %q; want %d with %q", strings.Join(args, " "), r.code, r.errOut, tt.want, msg)
				}
			}
			// Each change went to the daemon, none to the record behind it.
			if want := map[bool]int32{true: 4, false: 0}[tt.status != 0]; hits.Load() != want {
				t.Errorf("the daemon answered %d requests, want %d", hits.Load(), want)
			}
			if rec, err := state.Load(dir); err != nil || rec.Rules != nil || rec.Forwards != nil {
				t.Errorf("the record behind a running daemon was changed: %+v (%v)", rec, err)
			}
		})
	}
}

// TestStoppedSandbox: the commands that change a stopped sandbox write
// its record; a value that cannot be right is bad usage, named, and
// leaves the record as it was; what needs the sandbox running says so
// and how to start it; stdout carries only the result.
func TestStoppedSandbox(t *testing.T) {
	isolate(t)
	needEnv(t)
	dir := mustDirs(t).Sandbox("sb")
	if err := state.Create(dir, &state.Record{Name: "sb", Workspace: t.TempDir(), Image: "host", Runtime: "gvisor",
		Desired: "stopped", State: state.StateStopped, StopReason: state.StopUser}); err != nil {
		t.Fatal(err)
	}
	record := func() *state.Record {
		t.Helper()
		r, err := state.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tt := range []struct {
		args []string
		code int
		has  string // in stderr
	}{
		{[]string{"network", "allow", "sb", "not a rule!"}, ExitUsage, `"not a rule!"`},
		{[]string{"network", "block", "sb", "example.com", "a..b"}, ExitUsage, `"a..b"`},
		{[]string{"forward", "add", "sb", "99999"}, ExitUsage, "99999"},
		{[]string{"forward", "add", "sb", "3000", "--address", "nonsense"}, ExitUsage, "--address"},
		{[]string{"forward", "remove", "sb", "0"}, ExitUsage, `"0"`},
		{[]string{"secrets", "refresh", "sb"}, ExitError, "moat up sb"},
	} {
		r := moat(tt.args...)
		if r.code != tt.code || !strings.Contains(r.errOut, tt.has) {
			t.Errorf("moat %s: exit %d, stderr %q; want %d with %s", strings.Join(tt.args, " "), r.code, r.errOut, tt.code, tt.has)
		}
		if r.out != "" {
			t.Errorf("moat %s printed %q on stdout", strings.Join(tt.args, " "), r.out)
		}
	}
	if rec := record(); rec.Rules != nil || rec.Forwards != nil {
		t.Errorf("refused changes were written: rules %+v, forwards %+v", rec.Rules, rec.Forwards)
	}

	for _, args := range [][]string{
		{"network", "allow", "sb", "example.com", "*.example.org:443"},
		{"network", "block", "sb", "ads.example"},
		{"network", "remove", "sb", "example.com"},
		{"forward", "add", "sb", "8080:80"},
		{"forward", "add", "--reverse", "sb", "5432"},
	} {
		if r := moat(args...); r.code != ExitOK || r.out != "" {
			t.Errorf("moat %s: exit %d, stdout %q, stderr %q; want 0 and nothing on stdout", strings.Join(args, " "), r.code, r.out, r.errOut)
		}
	}
	rec := record()
	if rec.Rules == nil || !slices.Equal(rec.Rules.Allow, []string{"*.example.org:443"}) || !slices.Equal(rec.Rules.Block, []string{"ads.example"}) {
		t.Errorf("runtime rules %+v, want allow *.example.org:443 and block ads.example", rec.Rules)
	}
	if f := rec.Forwards; f == nil || len(f.Ports) != 1 || f.Ports[0].Host != 8080 || f.Ports[0].Guest != 80 || len(f.Reverse) != 1 || f.Reverse[0].Host != 5432 {
		t.Errorf("runtime forwards %+v, want 8080:80 and reverse 5432", rec.Forwards)
	}

	// --json: one object with "schema": 1 on stdout, nothing else.
	for _, args := range [][]string{{"status", "sb", "--json"}, {"list", "--json"}, {"network", "list", "sb", "--json"}, {"forward", "list", "sb", "--json"}} {
		r := moat(args...)
		var v map[string]any
		if err := json.Unmarshal([]byte(r.out), &v); r.code != ExitOK || err != nil || v["schema"] != 1.0 {
			t.Errorf("moat %s: exit %d, stdout %q (%v); want one JSON object with schema 1", strings.Join(args, " "), r.code, r.out, err)
		}
	}
}
