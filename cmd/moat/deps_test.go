package main

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// heavy are libraries that moat and moat-sandbox must not link: every
// moat process (the CLI, and a sandbox's keeper, gate process and shim,
// which run moat-sandbox) pays their package init. Each belongs to
// one front end, which is a binary of its own, its owner
// (docs/architecture.md, "Moat's binaries"); the other binaries leave it
// out too.
var heavy = []struct {
	prefix, why string
	owners      []string
}{
	{"github.com/docker/docker", "the Docker SDK", []string{"moat-docker"}},
	{"github.com/distribution/reference", "the Docker SDK's image references: regexps compiled at init", []string{"moat-docker"}},
	{"go.opentelemetry.io/", "the Docker SDK's tracing", []string{"moat-docker"}},
	{"github.com/prometheus/", "the gate service's metrics", []string{"moat-gate"}},
	{"google.golang.org/protobuf", "Prometheus's and client-go's wire format", []string{"moat-gate", "moat-kube"}},
	{"k8s.io/client-go", "the gate service's informers, and moat run's claims and exec", []string{"moat-gate", "moat-kube"}},
	{"sigs.k8s.io/agent-sandbox/clients", "agent-sandbox's clients and informers", []string{"moat-gate", "moat-kube"}},
	{"github.com/containernetworking/", "the CNI plugin's skeleton and types", []string{"moat-cni"}},
	{"github.com/google/nftables", "the CNI plugin's nftables rules", []string{"moat-cni"}},
}

// commands are the binaries checked.
var commands = []string{"moat", "moat-docker", "moat-gate", "moat-sandbox", "moat-cni", "moat-kube"}

// TestHeavyDepsStayOut fails when a command links a library it must not,
// and names the import chain that pulls it in, shortest first.
func TestHeavyDepsStayOut(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH (go test puts its own there): %v", err)
	}
	var roots []string
	for _, c := range commands {
		roots = append(roots, "moat.dev/moat/cmd/"+c)
	}
	// One go list for them all: the union of their graphs, each package
	// with what it imports (for the build's own GOOS and tags).
	out, err := exec.Command(gobin, append([]string{"list", "-deps", "-f", "{{.ImportPath}}:{{join .Imports \" \"}}"}, roots...)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	graph := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imps, _ := strings.Cut(l, ":")
		graph[pkg] = strings.Fields(imps)
	}
	for i, root := range roots {
		if _, ok := graph[root]; !ok {
			t.Fatalf("go list did not list %s", root)
		}
		for _, h := range heavy {
			if slices.Contains(h.owners, commands[i]) {
				continue
			}
			if chain := chainTo(graph, root, h.prefix); chain != nil {
				t.Errorf("%s links %s (%s), which belongs in %s only; the import chain:\n  %s",
					commands[i], chain[len(chain)-1], h.why, strings.Join(h.owners, " and "), strings.Join(chain, "\n  -> "))
			}
		}
	}
}

// TestRolesSplit fails when moat-sandbox links moat's command line
// (internal/cli, cobra and the terminal UI it uses), whose package
// initialisation, code and data every process of a sandbox would carry
// for nothing, or when the linker keeps in moat the roles that
// moat-sandbox runs.
func TestRolesSplit(t *testing.T) {
	if testing.Short() {
		t.Skip("links moat and moat-sandbox (some seconds); run without -short")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH (go test puts its own there): %v", err)
	}
	dir := t.TempDir()
	build := exec.Command(gobin, "build", "-o", dir+"/", "moat.dev/moat/cmd/moat", "moat.dev/moat/cmd/moat-sandbox")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building moat and moat-sandbox: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		binary string
		absent []string // functions its entry point must not reach
		// packages none of whose symbols (package init included) it
		// may hold: the linker keeps a package's init whenever the
		// package is imported at all, used or not
		absentPkgs []string
	}{
		{"moat-sandbox", []string{"moat.dev/moat/internal/cli.newRoot", "github.com/spf13/cobra.(*Command).ExecuteC"},
			[]string{"moat.dev/moat/internal/cli", "github.com/spf13/cobra", "github.com/spf13/pflag", "github.com/mattn/go-runewidth"}},
		{"moat", []string{"moat.dev/moat/internal/roles.RoleMain", "moat.dev/moat/internal/guest.Init", "moat.dev/moat/internal/runtime.Shim"},
			// client-go and the exec stream are moat-kube's (runtime = "kubernetes")
			[]string{"k8s.io/client-go/rest", "k8s.io/client-go/tools/remotecommand", "moat.dev/moat/internal/kubert/engine"}},
	} {
		out, err := exec.Command(gobin, "tool", "nm", filepath.Join(dir, tc.binary)).Output()
		if err != nil {
			t.Fatalf("go tool nm %s: %v", tc.binary, err)
		}
		syms := map[string]bool{}
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) >= 3 {
				syms[f[len(f)-1]] = true
			}
		}
		if len(syms) < 1000 {
			t.Fatalf("go tool nm %s listed %d symbols; is the binary stripped?", tc.binary, len(syms))
		}
		for _, s := range tc.absent {
			if syms[s] {
				t.Errorf("%s links %s", tc.binary, s)
			}
		}
		for _, p := range tc.absentPkgs {
			for s := range syms {
				if strings.HasPrefix(s, p+".") {
					t.Errorf("%s links package %s (%s among its symbols); see the import chain with: go list -deps ./cmd/%s", tc.binary, p, s, tc.binary)
					break
				}
			}
		}
	}
}

// chainTo is the shortest import chain from root to a package whose path
// is prefix or lies under it, or nil.
func chainTo(graph map[string][]string, root, prefix string) []string {
	match := func(p string) bool { return p == prefix || strings.HasPrefix(p, strings.TrimSuffix(prefix, "/")+"/") }
	parent := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if match(p) {
			var chain []string
			for q := p; q != ""; q = parent[q] {
				chain = append(chain, q)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, imp := range graph[p] {
			if _, seen := parent[imp]; !seen {
				parent[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return nil
}

func TestChainTo(t *testing.T) {
	graph := map[string][]string{
		"a": {"b", "c"}, "b": {"github.com/docker/docker-credential-helpers/client"},
		"c": {"d"}, "d": {"github.com/docker/docker/client"},
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"github.com/docker/docker", []string{"a", "c", "d", "github.com/docker/docker/client"}},
		{"go.opentelemetry.io/", nil},
		{"d", []string{"a", "c", "d"}},
	} {
		if got := chainTo(graph, "a", tc.prefix); !slices.Equal(got, tc.want) {
			t.Errorf("chainTo(%q) = %v, want %v", tc.prefix, got, tc.want)
		}
	}
}
