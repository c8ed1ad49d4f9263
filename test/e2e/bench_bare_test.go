package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/netstack"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/test/inet"
)

// bareRunsc is the floor under the gate benchmarks' figures: the same probe run in a bare runsc
// sandbox that runsc networks itself, over a veth pair straight into the test internet's
// namespace. No daemon, no tap0, no gate: gVisor's own cost for the same operation on this host,
// with the flags moat gives runsc, less two: the checksum offload, which only a tap0 whose reader
// ignores checksums allows, and --overlay2=none, as the bare sandbox's root is the host's / read-only
// (runsc's default overlay keeps its writes in memory).
type bareRunsc struct {
	runsc  string
	ns     string // the sandbox's network namespace
	root   string // runsc's state directory
	bundle string
	flags  []string
	runs   int
}

// The link between the bare sandbox's namespace and the test internet's.
const (
	bareAddr = "10.77.0.2/30"
	bareGW   = "10.77.0.1"
	bareLink = "eth0"
)

// startBare builds the bare sandbox's namespace and bundle. It fails t when MOAT_RUNSC, which
// the benchmarks' scripts set, does not name runsc.
func startBare(t *testing.T, n *inet.Net) *bareRunsc {
	t.Helper()
	b := &bareRunsc{runsc: os.Getenv("MOAT_RUNSC"), ns: fmt.Sprintf("moat-bare-%d", os.Getpid())}
	if b.runsc == "" {
		t.Fatal("MOAT_RUNSC is not set: run the benchmark through its script in bench/")
	}
	dir := t.TempDir()
	b.root, b.bundle = filepath.Join(dir, "state"), filepath.Join(dir, "bundle")
	host := "mbare" + strconv.FormatInt(int64(os.Getpid()), 36)
	ip(t, "netns", "add", b.ns)
	t.Cleanup(func() {
		// runsc pins an empty namespace for its gofers with a bind mount in its root.
		for unix.Unmount(filepath.Join(b.root, "null-netns"), unix.MNT_DETACH) == nil {
		}
		exec.Command("ip", "netns", "del", b.ns).Run()
	})
	ip(t, "link", "add", host, "type", "veth", "peer", "name", bareLink, "netns", b.ns)
	ip(t, "link", "set", host, "netns", n.NS)
	ip(t, "-n", n.NS, "addr", "add", bareGW+"/30", "dev", host)
	ip(t, "-n", n.NS, "link", "set", host, "mtu", strconv.Itoa(netstack.MTU), "up")
	ip(t, "-n", b.ns, "link", "set", bareLink, "mtu", strconv.Itoa(netstack.MTU), "up")
	ip(t, "-n", b.ns, "link", "set", "lo", "up")

	for _, f := range runtime.RunscArgs(dir, "", false) {
		if f != "--tx-checksum-offload" && f != "--overlay2=none" && !strings.HasPrefix(f, "--root=") {
			b.flags = append(b.flags, f)
		}
	}
	b.flags = append(b.flags, "--root="+b.root)
	if err := os.MkdirAll(b.bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	return b
}

// run runs args in a new bare sandbox and returns its standard output.
func (b *bareRunsc) run(t *testing.T, args ...string) []byte {
	t.Helper()
	// runsc takes the interface's address and routes for its own stack and removes them from
	// the host's: give them back before every run.
	ip(t, "-n", b.ns, "addr", "replace", bareAddr, "dev", bareLink)
	ip(t, "-n", b.ns, "route", "replace", "default", "via", bareGW)
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	spec := `{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":[` + strings.Join(q, ",") + `],"cwd":"/","env":["PATH=/usr/bin:/bin"]},
 "root":{"path":"/","readonly":true},"hostname":"bare",
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"}],
 "linux":{"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"},{"type":"network","path":"/var/run/netns/` + b.ns + `"}]}}`
	if err := os.WriteFile(filepath.Join(b.bundle, "config.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	b.runs++
	id := fmt.Sprintf("bare%d", b.runs)
	cmd := exec.Command(b.runsc, append(b.flags, "run", "--bundle="+b.bundle, id)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bare runsc %v: %v\n%s", args, err, stderr.String())
	}
	return out
}

// ip runs iproute2's ip and fails t if it fails.
func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
