// Command runscfilters writes runsc's seccomp programs, precompiled, for
// the ways moat runs runsc, and a go build -overlay file that puts them in
// place of gVisor's stubs; scripts/setup.sh runs it and builds runsc with
// that overlay.
//
// gVisor's release build (Bazel) precompiles the sentry's and the gofer's
// seccomp programs into runsc; a plain go build of its Go module gets
// stubs that hold none (PrecompilationDisabledAtBuildTime), so runsc
// compiled its filters at every sandbox start and restore, the sentry's
// on the resume's critical path (docs/benchmarks.md). This command
// precompiles the programs for moat's options only, with gVisor's own
// precompiler (pkg/seccomp/precompiledseccomp): gVisor's full set covers
// every platform, networking mode and device proxy, megabytes of Go
// source in runsc's build for programs moat never loads.
//
// Usage:
//
//	runscfilters -gvisor DIR -o CACHE
//
// DIR is the tree of gVisor's module runsc is built from, whose stubs the
// overlay replaces (setup.sh's private copy: go build refuses to overlay
// files in the module cache); CACHE is a directory for this gVisor
// version. The programs go into CACHE/SELECTION/ (SELECTION: a hash of
// the programs' names, so a change in moat's runsc flags makes new ones)
// and are kept: a second run only writes the overlay again. The overlay
// file's path is printed on stdout; counts, sizes and times go to stderr.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"

	"moat.dev/moat/internal/state"
)

// formatVersion is part of the selection's hash: a change to what this
// command writes must not find the old files in the cache.
const formatVersion = "2"

func main() {
	if os.Getenv(sentryChildEnv) != "" {
		if err := sentryChild(); err != nil {
			fmt.Fprintln(os.Stderr, "runscfilters:", err)
			os.Exit(1)
		}
		return
	}
	gvisorDir := flag.String("gvisor", "", "the tree of gVisor's module runsc is built from, outside the module cache")
	out := flag.String("o", "", "cache directory for this gVisor version, e.g. bin/.runsc-filters/VERSION")
	flag.Parse()
	if *gvisorDir == "" || *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: runscfilters -gvisor DIR -o CACHE")
		os.Exit(2)
	}
	sets, err := moatSets()
	if err != nil {
		fmt.Fprintln(os.Stderr, "runscfilters:", err)
		os.Exit(1)
	}
	overlay, err := run(*gvisorDir, *out, sets, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "runscfilters:", err)
		os.Exit(1)
	}
	fmt.Println(overlay)
}

// programSet is one of runsc's two filter packages and the programs moat
// needs in it.
type programSet struct {
	name     string   // the cache's subdirectory
	stub     string   // the file replaced, in gVisor's module
	keys     []string // the programs' names, sorted
	generate func() ([]precompiledseccomp.Program, error)
}

// Where gVisor's stubs are, in its module.
const (
	sentryStub = "runsc/boot/filter/filter_precompiled.go"
	goferStub  = "runsc/fsgofer/filter/filter_precompiled.go"
)

// moatSets are the sentry's and the gofer's programs for moat's options.
// The gofer's come from gVisor's own precompiler, whose whole set (a few
// dozen) takes well under a second; the sentry's are precompiled for
// moat's options alone (precompileSentry), as PID 1
// (precompileSentryAsPID1).
func moatSets() ([]programSet, error) {
	boot, gofer, err := moatOptions()
	if err != nil {
		return nil, err
	}
	return []programSet{
		{"boot", sentryStub, keys(boot), precompileSentryAsPID1},
		{"gofer", goferStub, keys(gofer), goferconfig.PrecompiledPrograms},
	}, nil
}

// run writes the programs of sets that moat's options need under cache,
// unless there already, and the overlay file, whose path it returns.
func run(gvisorDir, cache string, sets []programSet, log io.Writer) (string, error) {
	dir, err := filepath.Abs(filepath.Join(cache, selection(sets)))
	if err != nil {
		return "", err
	}
	replace := map[string]string{}
	for _, set := range sets {
		stub := filepath.Join(gvisorDir, filepath.FromSlash(set.stub))
		if _, err := os.Stat(stub); err != nil {
			return "", fmt.Errorf("gVisor's tree at %s has no %s to replace (%w); its seccomp precompilation has moved: update internal/tools/runscfilters", gvisorDir, set.stub, err)
		}
		stub, err = filepath.Abs(stub)
		if err != nil {
			return "", err
		}
		gen := filepath.Join(dir, set.name, "filter_precompiled.go")
		replace[stub] = gen
		if _, err := os.Stat(gen); err == nil {
			fmt.Fprintf(log, "runscfilters: %s: %d programs, kept from %s\n", set.name, len(set.keys), gen)
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		start := time.Now()
		all, err := set.generate()
		if err != nil {
			return "", fmt.Errorf("precompiling gVisor's %s programs: %w", set.name, err)
		}
		picked, err := pick(all, set.keys)
		if err != nil {
			return "", fmt.Errorf("%s: %w", set.name, err)
		}
		src, err := render(set.stub, picked)
		if err != nil {
			return "", err
		}
		if err := writeFile(gen, src); err != nil {
			return "", err
		}
		fmt.Fprintf(log, "runscfilters: %s: %d programs of %d precompiled, %d bytes of Go, in %.1f s\n",
			set.name, len(picked), len(all), len(src), time.Since(start).Seconds())
	}
	// Written every time: it names gVisor's tree by its path, which
	// moves with the checkout while the programs stay the same.
	overlay, err := json.MarshalIndent(struct{ Replace map[string]string }{replace}, "", "\t")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "overlay.json")
	if err := writeFile(path, append(overlay, '\n')); err != nil {
		return "", err
	}
	return path, pruneSelections(cache, filepath.Base(dir))
}

// pruneSelections removes the programs of other selections from cache,
// made before moat's flags or this command changed; nothing else there
// (setup.sh keeps its tree of gVisor's module beside them).
func pruneSelections(cache, keep string) error {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if name := e.Name(); e.IsDir() && name != keep && isSelection(name) {
			if err := os.RemoveAll(filepath.Join(cache, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// isSelection says whether name is a selection's directory name.
func isSelection(name string) bool {
	_, err := hex.DecodeString(name)
	return len(name) == len(selection(nil)) && err == nil
}

// selection names a set of programs by their names (and this command's
// format), for the cache.
func selection(sets []programSet) string {
	h := sha256.New()
	fmt.Fprintf(h, "format %s\n", formatVersion)
	for _, set := range sets {
		fmt.Fprintf(h, "%s\n%s\n\n", set.name, strings.Join(set.keys, "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// pick is the programs named keys, in keys' order; a key gVisor's
// precompiler made no program for is an error, as a runsc that quietly
// compiled its filters again at every start is what this command exists
// to prevent.
func pick(all []precompiledseccomp.Program, keys []string) ([]precompiledseccomp.Program, error) {
	byName := make(map[string]precompiledseccomp.Program, len(all))
	for _, p := range all {
		byName[p.Name] = p
	}
	var picked []precompiledseccomp.Program
	var missing []string
	for _, k := range keys {
		p, ok := byName[k]
		if !ok {
			missing = append(missing, k)
			continue
		}
		picked = append(picked, p)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("gVisor precompiles no program for %q, which moat's runsc flags (internal/runtime.RunscArgs) need; change the flag, or the options in internal/tools/runscfilters/options.go", missing)
	}
	return picked, nil
}

// writeFile writes path whole or not at all (state.WriteAtomic), so an
// interrupted run leaves nothing a later one would take as done.
func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return state.WriteAtomic(path, data, 0o644)
}
