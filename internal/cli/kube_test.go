package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/kubert"
	"moat.dev/moat/internal/state"
)

// kubeRun decides, before anything reaches a cluster, which sandbox a
// run is for and refuses flags that do not fit it, naming them. (The
// claim itself is the cluster tests', test/cluster/cli_test.go.)
func TestKubeRunRefuses(t *testing.T) {
	home := isolate(t)
	e, err := newEnv()
	if err != nil {
		t.Fatal(err)
	}
	ws, _ := cwd()
	mk := func(name, runtime string, kr *kubert.Record) {
		dir := e.dirs.Sandbox(name)
		if err := state.Create(dir, &state.Record{Name: name, Workspace: filepath.Join(home, name), Runtime: runtime, Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if kr != nil {
			if err := kubert.WriteRecord(dir, *kr); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("gv", "", nil)
	mk("kb", runtimeKube, &kubert.Record{Namespace: "agents", Template: "a", Claim: "moat-kb-x", ClaimUID: "u"})

	for _, tc := range []struct {
		what    string
		name    string
		runtime string
		flags   kubeFlags
		preset  bool
		toml    string
		handled bool
		code    int
		say     string // in the error
	}{
		{what: "a gVisor run", handled: false},
		{what: "--template without the runtime", flags: kubeFlags{template: "t"}, handled: true, code: ExitUsage, say: "--template is for a sandbox on Kubernetes"},
		{what: "--context without the runtime", flags: kubeFlags{context: "c"}, handled: true, code: ExitUsage, say: "--context"},
		{what: "no --template for a new one", runtime: runtimeKube, handled: true, code: ExitUsage, say: "--template"},
		{what: "an unknown runtime, before anything is asked", runtime: "nosuch", handled: true, code: ExitUsage, say: `--runtime "nosuch"`},
		{what: "the runtime from moat.toml", toml: "[sandbox]\nruntime = \"kubernetes\"\n", handled: true, code: ExitUsage, say: "--template"},
		{what: "a preset", runtime: runtimeKube, flags: kubeFlags{template: "t"}, preset: true, handled: true, code: ExitUsage, say: "presets"},
		{what: "a gVisor sandbox by name, with the runtime", name: "gv", runtime: runtimeKube, handled: true, code: ExitUsage, say: "keeps its runtime"},
		{what: "a gVisor sandbox by name, with --namespace", name: "gv", flags: kubeFlags{namespace: "n"}, handled: true, code: ExitUsage, say: "--namespace is for a sandbox on Kubernetes"},
		{what: "a gVisor sandbox by name", name: "gv", handled: false},
		{what: "another template for a claim", name: "kb", flags: kubeFlags{template: "b"}, handled: true, code: ExitUsage, say: `--template b: sandbox "kb" is a claim with --template "a"`},
		{what: "another namespace for a claim", name: "kb", flags: kubeFlags{namespace: "other"}, handled: true, code: ExitUsage, say: "--namespace other"},
		{what: "a preset in a claim", name: "kb", preset: true, handled: true, code: ExitUsage, say: "presets"},
	} {
		os.Remove(filepath.Join(ws, "moat.toml"))
		if tc.toml != "" {
			if err := os.WriteFile(filepath.Join(ws, "moat.toml"), []byte(tc.toml), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		e.runtime = tc.runtime
		handled, err := e.kubeRun(tc.name, tc.flags, tc.preset, []string{"true"})
		if handled != tc.handled {
			t.Errorf("%s: handled %v, want %v (%v)", tc.what, handled, tc.handled, err)
			continue
		}
		if !tc.handled {
			if err != nil {
				t.Errorf("%s: %v", tc.what, err)
			}
			continue
		}
		if err == nil || exitCode(err) != tc.code || !strings.Contains(err.Error(), tc.say) {
			t.Errorf("%s: %v (exit %d); want exit %d saying %q", tc.what, err, exitCode(err), tc.code, tc.say)
		}
	}
	// Nothing refused made a sandbox.
	recs, err := state.List(e.dirs)
	if err != nil || len(recs) != 2 {
		t.Errorf("after refusals: %d sandboxes (%v); want the two made here", len(recs), err)
	}
}

// A Kubernetes sandbox has no daemon: up, down and a start are refused
// with the commands that apply; list shows its claim and runtime.
func TestKubeNoDaemon(t *testing.T) {
	isolate(t)
	e, err := newEnv()
	if err != nil {
		t.Fatal(err)
	}
	dir := e.dirs.Sandbox("kb")
	if err := state.Create(dir, &state.Record{Name: "kb", Runtime: runtimeKube, State: kubeClaimed, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := kubert.WriteRecord(dir, kubert.Record{Namespace: "agents", Template: "a", Claim: "moat-kb-x", ClaimUID: "u"}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"up", "kb"}, {"down", "kb"}} {
		r := moat(args...)
		if r.code != ExitUsage || !strings.Contains(r.errOut, "moat destroy kb") {
			t.Errorf("moat %q: exit %d %q; want %d naming moat destroy", args, r.code, r.errOut, ExitUsage)
		}
	}
	// What would change only this machine's record, or needs a daemon
	// here, is refused rather than done for nothing.
	for _, args := range [][]string{{"network", "allow", "kb", "example.com"}, {"network", "block", "kb", "example.com"},
		{"network", "list", "kb"}, {"network", "suggest", "kb"}, {"forward", "list", "kb"}, {"ssh-config", "kb"}, {"logs", "kb"}} {
		r := moat(args...)
		if r.code != ExitUsage || !strings.Contains(r.errOut, "policy is its template's") {
			t.Errorf("moat %q: exit %d %q; want %d saying where the policy is", args, r.code, r.errOut, ExitUsage)
		}
	}
	if err := gvisorOnly(dir); err == nil || exitCode(err) != ExitUsage {
		t.Errorf("gvisorOnly of a claim: %v; want it refused", err)
	}
	r := moat("list")
	if !strings.Contains(r.out, "claimed") || !strings.Contains(r.out, "template agents/a") || !strings.Contains(r.out, "kubernetes") {
		t.Errorf("moat list: %q; want the claim, its template and runtime", r.out)
	}
}

// A Kubernetes sandbox whose claim was never recorded (a create cut
// short) is destroyed here without asking any cluster.
func TestKubeDestroyWithoutClaim(t *testing.T) {
	isolate(t)
	e, err := newEnv()
	if err != nil {
		t.Fatal(err)
	}
	dir := e.dirs.Sandbox("half")
	if err := state.Create(dir, &state.Record{Name: "half", Runtime: runtimeKube, State: kubeClaimed, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if r := moat("destroy", "half", "--yes"); r.code != ExitOK {
		t.Fatalf("moat destroy half: exit %d %q", r.code, r.errOut)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("after destroy, %s: %v; want it gone", dir, err)
	}
}
