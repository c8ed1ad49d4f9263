package dockerrt

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"moat.dev/moat/internal/state"
)

// Port forwards on Docker ([forwards] and `moat forward`, both
// directions) are held by a forwarder, `moat-docker forward DIR PID`,
// one per running sandbox: `moat-docker up` starts it, detached, once
// the workload answers, and it ends when the workload's init (PID, on
// the host) exits, so it lives exactly as long as the workload does:
// `moat down`, `moat destroy`, a host reboot, a workload that died or
// that Docker restarted all end it, with no cleanup code, and the next
// start starts a new one. A Docker sandbox has no per-sandbox daemon to
// hold the listeners, and the gate container cannot: the host's
// 127.0.0.1 is not in its namespace, and Docker publishes a port only
// when a container is created, so `moat forward add` could not be live.
//
//	host → guest  the forwarder listens on the host (127.0.0.1 unless
//	              --address) and dials the workload's address on the
//	              internal bridge, as the CLI reaches the guest agent:
//	              the host's connections and their replies are what the
//	              host's INPUT guard lets through.
//	guest → host  the forwarder listens inside the workload's network
//	              namespace, on ReverseAddr, which it gives to the
//	              namespace's side of the reverse link (a veth pair moat
//	              makes before the workload starts; under runsc gVisor
//	              holds the other side, ReverseLocal), and a nat rule
//	              there sends every port of ReverseAddr to its one
//	              listener: a port a reverse forward lists is dialed on
//	              the host's 127.0.0.1:HOST, any other is reset and
//	              audited, as a gVisor sandbox's gateway does. The
//	              listener is a socket the workload can connect to but
//	              not touch, no packet crosses the bridge, and the
//	              host's guard stays as it is.
//
// Each connection, both ways, and each refusal gets an audit record of
// the gate's schema (internal/forward's, as the daemon writes them) in
// ForwardAuditPath.
//
// The forwarder answers the control API's forward endpoints
// (internal/control: GET and POST /v1/forwards, the same bodies as a
// gVisor daemon's) on ForwardSocket, so `moat forward add|remove|list`
// act on it as on a daemon; while it does not run they edit the
// record, which the next start reads.

// ReverseAddr is where the workload reaches its reverse forwards: the
// address a gVisor sandbox's gateway has (netstack.Gateway), so that a
// project's settings (DATABASE_URL=...@10.88.0.1:5432) work on both
// runtimes.
var ReverseAddr = netip.MustParseAddr("10.88.0.1")

// ReverseLocal is the workload's own address on the link that reaches
// ReverseAddr (engine/netns_linux.go's reverse link): under runsc, gVisor
// copies an interface only if it has an address when the workload starts.
var ReverseLocal = netip.MustParseAddr("10.88.0.2")

// ForwardSocket is the forwarder's control socket, root's alone.
func ForwardSocket(dir string) string { return filepath.Join(dir, "docker-forward.sock") }

// ForwardLock is held by the forwarder for its whole life.
func ForwardLock(dir string) string { return filepath.Join(dir, "docker-forward.lock") }

// ForwardPID holds the host PID of the workload init the forwarder
// serves, written once it holds ForwardLock.
func ForwardPID(dir string) string { return filepath.Join(dir, "docker-forward.pid") }

// ForwardAuditPath is the audit log of the forwards' connections and
// refusals, which the forwarder writes (its rotations beside it): the
// gate's is the gate container's to write.
func ForwardAuditPath(dir string) string {
	return filepath.Join(dir, "docker-forward-audit", "forward.jsonl")
}

// ForwardLog is the forwarder's log (its stderr), replaced at each start.
func ForwardLog(dir string) string { return filepath.Join(dir, "docker-forward.log") }

// ForwarderAlive says whether a forwarder holds dir's lock: the kernel
// lets go of a flock when its process dies, so it cannot be stale.
func ForwarderAlive(dir string) bool {
	release, ok, err := state.TryLock(ForwardLock(dir))
	if err != nil {
		return false
	}
	if ok {
		release()
		return false
	}
	return true
}

// ForwarderServes says whether a forwarder runs for the workload whose
// init is pid: one left from an earlier start is ending with its own
// workload and does not count.
func ForwarderServes(dir string, pid int) bool {
	b, err := os.ReadFile(ForwardPID(dir))
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && n == pid && ForwarderAlive(dir)
}
