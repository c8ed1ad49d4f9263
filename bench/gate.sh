#!/usr/bin/env bash
# Gate benchmarks, each against its direct baseline in the same run: the
# same probe program runs on the host (direct to the test upstream) and in
# a sandbox (through the gate). Prints medians of R rounds and ratios, the
# same operations kept inside the guest ("guest lo": what gVisor alone
# costs) and the gate's turnaround seen on tap0 (its share, none of the
# guest's), and the floor: the same probe in a bare runsc sandbox that
# runsc networks itself over a veth into the test network (gVisor alone, no
# daemon, no gate). Needs root and ./scripts/setup.sh. Talks only to a test network
# namespace.
#   R=3 (rounds)  SIZE_MIB=1024 (download)  READ_KIB=1024 (the client's read size)
#   CONNECTS=1000  PARALLEL=1000
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
export MOAT_BIN=$PWD/bin/moat MOAT_RUNSC=$PWD/bin/runsc MOAT_BENCH_GATE=1
export R=${R:-3} SIZE_MIB=${SIZE_MIB:-1024} READ_KIB=${READ_KIB:-1024} CONNECTS=${CONNECTS:-1000} PARALLEL=${PARALLEL:-1000}
log=$(mktemp /tmp/moat-bench-gate-XXXX.log)
trap 'rm -f "$log"' EXIT
if ! go test -count=1 -timeout 30m -run '^TestBenchGate$' -v "${PKG:-./test/e2e/}" >"$log" 2>&1; then
	tail -40 "$log" >&2
	exit 1
fi
sed -n 's/^ *bench_gate_test.go:[0-9]*: //p' "$log"
