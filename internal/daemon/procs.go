package daemon

import (
	"os"
	"runtime"
)

// servingProcs runs the daemon on one processor once its sandbox runs, on
// a small host.
//
// From then on its work is the gate's: a packet in, a decision, a dial, a
// copy, each short and most of it waiting. With a second processor each
// hand-off between goroutines (tap0's reader to a connection's handler, a
// resolver's reader to the DNS answer) wakes another thread, and on a small
// host the guest's Sentry is spinning on the other core while the guest
// waits for the gate (systrap's fast path): the woken thread waits to be
// scheduled. On one processor the hand-off stays on the running thread.
// Measured with bench/gate.sh on 2 cores, four pairs interleaved with
// the default: the gate's own turnaround on tap0 for a cached DNS answer
// 79-101 us against 118-151, a connect from the guest 1.27-1.70 ms
// against 1.43-2.21, downloads (plain and TLS) no slower.
//
// The start keeps every processor: it does several things at once (the
// shim, the gate, the guest's first handshake), and on one processor it
// was about 10% slower. A host with more cores keeps them all: there the
// Sentry's spinning has cores of its own, and a bulk transfer through one
// processor would be capped by it (about 1 GiB/s plain, less intercepted).
// A GOMAXPROCS the user set is left alone.
func (d *daemon) servingProcs() {
	if n := servingProcsFor(runtime.NumCPU(), os.Getenv("GOMAXPROCS")); n > 0 {
		runtime.GOMAXPROCS(n)
		d.log.Info("serving on one processor", "host_cpus", runtime.NumCPU())
	}
}

// smallHost is the most CPUs a host may have for the daemon to serve on
// one processor.
const smallHost = 4

// servingProcsFor is servingProcs' decision: the processors to serve on,
// or 0 to leave them as they are.
func servingProcsFor(cpus int, env string) int {
	if env != "" || cpus > smallHost {
		return 0
	}
	return 1
}
