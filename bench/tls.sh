#!/usr/bin/env bash
# TLS benchmarks, each against its direct baseline in the same run: the
# same probe program runs on the host (straight into the test internet)
# and in two sandboxes, one intercepting every allowed HTTPS host and one
# splicing them. Prints medians of R rounds: 1 GiB download throughput and
# ratios (targets: intercepted >= 0.3 of direct, spliced >= 0.5), and TLS
# handshake latency p50/p99 through interception (new name: a leaf is
# minted; cached name) against splicing. The floor under both: the same
# probe in a bare runsc sandbox that runsc networks itself over a veth into
# the test internet (gVisor alone, no gate, TLS end to end). Needs root
# and ./scripts/setup.sh.
# Talks only to a test network namespace.
#   R=3 (rounds)  SIZE_MIB=1024 (download)  HANDSHAKES=200 (per figure and round)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
export MOAT_BIN=${MOAT_BIN:-$PWD/bin/moat} MOAT_RUNSC=${MOAT_RUNSC:-$PWD/bin/runsc} MOAT_BENCH_TLS=1
export R=${R:-3} SIZE_MIB=${SIZE_MIB:-1024} HANDSHAKES=${HANDSHAKES:-200}
log=$(mktemp /tmp/moat-bench-tls-XXXX.log)
trap 'rm -f "$log"' EXIT
if ! go test -count=1 -timeout 30m -run '^TestBenchTLS$' -v "${PKG:-./test/e2e/}" >"$log" 2>&1; then
	tail -40 "$log" >&2
	exit 1
fi
sed -n 's/^ *tls_bench_test.go:[0-9]*: //p' "$log"
