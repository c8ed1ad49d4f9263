package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/seccomp"
	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	"gvisor.dev/gvisor/pkg/sentry/platform"
	"gvisor.dev/gvisor/pkg/sentry/platform/kvm"
	"gvisor.dev/gvisor/pkg/sentry/platform/systrap"
	bootconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	runscconfig "gvisor.dev/gvisor/runsc/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"

	"moat.dev/moat/internal/runtime"
)

// TestKeysCoverRunsc: for every platform moat chooses, with and without
// --debug, the sentry's and the gofer's program names as runsc itself
// computes them from moat's flags (runsc/boot/loader.go,
// runsc/cmd/gofer.go, the platform's own SeccompInfo) are among those
// generated. A name missing here is a runsc that compiles that filter at
// every start.
func TestKeysCoverRunsc(t *testing.T) {
	bootOpts, goferOpts, err := moatOptions()
	if err != nil {
		t.Fatal(err)
	}
	boot, gofer := keys(bootOpts), keys(goferOpts)
	seccompInfo := map[string]platform.SeccompInfo{
		runtime.PlatformSystrap: (*systrap.Systrap)(nil).SeccompInfo(),
		runtime.PlatformKVM:     (*kvm.KVM)(nil).SeccompInfo(),
	}
	for _, p := range []string{runtime.PlatformSystrap, runtime.PlatformKVM} {
		for _, debug := range []bool{false, true} {
			fs := flag.NewFlagSet("runsc", flag.ContinueOnError)
			runscconfig.RegisterFlags(fs)
			if err := fs.Parse(runtime.RunscArgs(t.TempDir(), p, debug)); err != nil {
				t.Fatal(err)
			}
			conf, err := runscconfig.NewFromFlags(fs)
			if err != nil {
				t.Fatal(err)
			}
			if conf.Platform != p {
				t.Fatalf("moat's flags for %s give runsc platform %q", p, conf.Platform)
			}
			hostnet := conf.Network == runscconfig.NetworkHost
			sentry := bootconfig.Options{
				Platform:              seccompInfo[p],
				HostNetwork:           hostnet,
				HostNetworkRawSockets: hostnet && conf.EnableRaw,
				HostFilesystem:        conf.DirectFS,
				ProfileEnable:         conf.ProfileEnable,
				NVProxy:               conf.NVProxy,
				TPUProxy:              conf.TPUProxy,
				RDMAProxy:             conf.RDMAProxy,
				CgoEnabled:            runscconfig.CgoEnabled,
				PluginNetwork:         conf.Network == runscconfig.NetworkPlugin,
			}
			if k := sentry.ConfigKey(); !slices.Contains(boot, k) {
				t.Errorf("%s, debug %t: the sentry's %q is not among the generated %q", p, debug, k, boot)
			}
			for _, lisafs := range []bool{true, false} {
				g := goferconfig.Options{
					UDSOpenEnabled:   conf.GetHostUDS().AllowOpen(),
					UDSCreateEnabled: conf.GetHostUDS().AllowCreate(),
					ProfileEnabled:   conf.ProfileEnable,
					DirectFS:         conf.DirectFS,
					LisafsNeeded:     lisafs,
					CgoEnabled:       runscconfig.CgoEnabled,
				}
				if k := g.ConfigKey(); !slices.Contains(gofer, k) {
					t.Errorf("%s, debug %t: the gofer's %q is not among the generated %q", p, debug, k, gofer)
				}
			}
		}
	}
}

// TestMain lets the test binary be the generator's PID 1 child
// (precompileSentryAsPID1 runs its own executable).
func TestMain(m *testing.M) {
	if os.Getenv(sentryChildEnv) != "" {
		if err := sentryChild(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// verifyEnv names the programs file TestProgramsAreRunscs's PID 1 child
// checks.
const verifyEnv = "MOAT_RUNSCFILTERS_TEST_VERIFY"

// TestProgramsAreRunscs: every program moat's runsc gets, rendered with a
// process's own variables, is the filter runsc would build at start for
// the same options without it (runsc/boot/filter.Install,
// runsc/fsgofer/filter.Install): the same instructions, only not compiled
// then. The comparison runs as PID 1 of a new PID namespace, as the
// sentry does; and precompiling twice, in two processes, gives the same
// programs.
func TestProgramsAreRunscs(t *testing.T) {
	if path := os.Getenv(verifyEnv); path != "" {
		verifyPrograms(t, path)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root, to precompile and compare as PID 1 of a new PID namespace (the sentry's place); run as root, as scripts/test.sh does")
	}
	sets, err := moatSets()
	if err != nil {
		t.Fatal(err)
	}
	var programs []precompiledseccomp.Program
	for _, set := range sets {
		all, err := set.generate()
		if err != nil {
			t.Fatal(err)
		}
		picked, err := pick(all, set.keys)
		if err != nil {
			t.Fatal(err)
		}
		again, err := set.generate()
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := pick(again, set.keys); !reflect.DeepEqual(again, picked) {
			t.Errorf("%s: precompiled twice, the programs differ: something of the precompiling process is in them", set.name)
		}
		programs = append(programs, picked...)
	}
	data, err := json.Marshal(programs)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "programs.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestProgramsAreRunscs$", "-test.v")
	cmd.Env = append(os.Environ(), verifyEnv+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("checking the programs as PID 1: %v\n%s", err, out)
	}
}

// verifyPrograms is TestProgramsAreRunscs's PID 1 child: each program in
// the file at path against runsc's own build for its options.
func verifyPrograms(t *testing.T, path string) {
	if os.Getpid() != 1 {
		t.Fatalf("checking as pid %d, not as PID 1 of a PID namespace", os.Getpid())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var list []precompiledseccomp.Program
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatal(err)
	}
	programs := map[string]precompiledseccomp.Program{}
	for _, p := range list {
		programs[p.Name] = p
	}
	boot, gofer, err := moatOptions()
	if err != nil {
		t.Fatal(err)
	}
	same := func(key string, vars precompiledseccomp.Values, build *seccomp.Program) {
		t.Helper()
		p, ok := programs[key]
		if !ok {
			t.Errorf("no program for %s", key)
			return
		}
		got, err := p.RenderInstructions(vars)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		want, _, err := build.Build()
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s with %v: the precompiled program (%d instructions) is not runsc's own build (%d)", key, vars, len(got), len(want))
		}
	}
	for _, opt := range boot {
		opt.ControllerFD = 7 // runsc's control socket; any descriptor
		rules, denyRules := bootconfig.Rules(opt)
		same(opt.ConfigKey(), opt.Vars(), &seccomp.Program{
			RuleSets: []seccomp.RuleSet{{Rules: denyRules}, {Rules: rules, Action: seccomp.Allow}},
			Options:  bootconfig.SeccompOptions(opt),
		})
	}
	for _, opt := range gofer {
		rules, denyRules := goferconfig.Rules(opt)
		same(opt.ConfigKey(), opt.Vars(), &seccomp.Program{
			RuleSets: []seccomp.RuleSet{{Rules: denyRules}, {Rules: rules, Action: seccomp.Allow}},
		})
	}
	if len(programs) != len(boot)+len(gofer) {
		t.Errorf("%d programs for %d options", len(programs), len(boot)+len(gofer))
	}
}

// TestRenderKeepsStubAPI: the generated file declares what gVisor's stub
// declares, for both packages, and turns precompilation on.
func TestRenderKeepsStubAPI(t *testing.T) {
	all, err := goferconfig.PrecompiledPrograms()
	if err != nil {
		t.Fatal(err)
	}
	dir := gvisorDir(t)
	for _, path := range []string{sentryStub, goferStub} {
		stubSrc, err := os.ReadFile(filepath.Join(dir, path))
		if err != nil {
			t.Fatal(err)
		}
		src, err := render(path, all[:2])
		if err != nil {
			t.Fatal(err)
		}
		stub, gen := parse(t, path, stubSrc), parse(t, "generated "+path, src)
		if got, want := decls(gen), decls(stub); !slices.Equal(got, want) {
			t.Errorf("%s: generated declares %q, the stub %q", path, got, want)
		}
		if gen.Name.Name != stub.Name.Name {
			t.Errorf("%s: generated is package %s, the stub %s", path, gen.Name.Name, stub.Name.Name)
		}
		if !strings.Contains(string(src), "const PrecompilationDisabledAtBuildTime = false") {
			t.Errorf("%s: generated does not set PrecompilationDisabledAtBuildTime = false", path)
		}
		for _, p := range all[:2] {
			if !strings.Contains(string(src), "programs["+strconv.Quote(p.Name)+"] = precompiledseccomp.Program{") {
				t.Errorf("%s: generated does not register %q", path, p.Name)
			}
		}
	}
}

// TestRunCaches: the first run writes the programs moat needs, only
// those, and an overlay naming the stubs; a second run precompiles
// nothing; a program gVisor does not make, or a stub that is not there,
// stops it with what is missing.
func TestRunCaches(t *testing.T) {
	boot, gofer := []string{"boot 1", "boot 2"}, []string{"gofer 1", "gofer 2"}
	gvisor, cache := t.TempDir(), t.TempDir()
	calls := 0
	fake := func(names ...string) func() ([]precompiledseccomp.Program, error) {
		return func() ([]precompiledseccomp.Program, error) {
			calls++
			ps := []precompiledseccomp.Program{{Name: "not moat's", Bytecode32: []uint32{1}}}
			for _, n := range names {
				ps = append(ps, precompiledseccomp.Program{Name: n, Bytecode32: []uint32{2, 3}, VarOffsets: map[string][]int{"self_pid": {1}}})
			}
			return ps, nil
		}
	}
	sets := []programSet{
		{"boot", sentryStub, boot, fake(boot...)},
		{"gofer", goferStub, gofer, fake(gofer...)},
	}
	for _, s := range sets {
		writeStub(t, filepath.Join(gvisor, s.stub))
	}
	// An older selection's programs, and setup.sh's tree beside them.
	stale, tree := filepath.Join(cache, "0123456789ab"), filepath.Join(cache, "gvisor")
	for _, d := range []string{stale, tree} {
		writeStub(t, filepath.Join(d, "x.go"))
	}

	overlay, err := run(gvisor, cache, sets, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an older selection's programs are still there: %v", err)
	}
	if _, err := os.Stat(tree); err != nil {
		t.Errorf("the run removed what is not a selection's: %v", err)
	}
	if calls != 2 {
		t.Fatalf("first run precompiled %d sets, want 2", calls)
	}
	var o struct{ Replace map[string]string }
	data, err := os.ReadFile(overlay)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &o); err != nil {
		t.Fatalf("overlay %s: %v", overlay, err)
	}
	if len(o.Replace) != len(sets) {
		t.Errorf("overlay replaces %d files, want %d: %s", len(o.Replace), len(sets), data)
	}
	for _, s := range sets {
		gen, ok := o.Replace[filepath.Join(gvisor, s.stub)]
		if !ok {
			t.Errorf("overlay does not replace %s: %s", s.stub, data)
			continue
		}
		src, err := os.ReadFile(gen)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range s.keys {
			if !strings.Contains(string(src), strconv.Quote(k)) {
				t.Errorf("%s: %s lacks %q", s.name, gen, k)
			}
		}
		if strings.Contains(string(src), "not moat's") {
			t.Errorf("%s: %s holds a program moat does not use", s.name, gen)
		}
	}

	if again, err := run(gvisor, cache, sets, io.Discard); err != nil || again != overlay {
		t.Fatalf("second run: %q, %v; want %q", again, err, overlay)
	}
	if calls != 2 {
		t.Errorf("second run precompiled again (%d sets in all)", calls)
	}

	short := []programSet{sets[0], {"gofer", goferStub, gofer, fake(gofer[1:]...)}}
	if _, err := run(gvisor, t.TempDir(), short, io.Discard); err == nil || !strings.Contains(err.Error(), strconv.Quote(gofer[0])) {
		t.Errorf("a program gVisor does not make: %v; want an error naming %q", err, gofer[0])
	}
	if _, err := run(t.TempDir(), t.TempDir(), sets, io.Discard); err == nil || !strings.Contains(err.Error(), sets[0].stub) {
		t.Errorf("no stub: %v; want an error naming %s", err, sets[0].stub)
	}
}

func writeStub(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("package filter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// gvisorDir is gVisor's module directory, where its stubs are.
func gvisorDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gvisor.dev/gvisor").Output()
	if err != nil {
		t.Fatalf("finding gVisor's module: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func parse(t *testing.T, name string, src []byte) *ast.File {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), name, src, 0)
	if err != nil {
		t.Fatalf("parsing %s: %v", name, err)
	}
	return f
}

// decls are a file's top-level names, sorted.
func decls(f *ast.File) []string {
	var names []string
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			names = append(names, d.Name.Name)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names = append(names, n.Name)
					}
				case *ast.TypeSpec:
					names = append(names, s.Name.Name)
				}
			}
		}
	}
	slices.Sort(names)
	return names
}
