#!/usr/bin/env bash
# The gate as a network service (moat gate serve), against its direct
# baseline in the same run: a client network namespace reaches the test
# upstream through the service (DNS, TLS interception by the service's CA,
# host sockets) and, by a second veth into the upstream's namespace, directly
# (the upstream's own DNS and CA, no gate). Prints medians of R rounds:
# HTTPS download (target >= 0.7x direct) beside its floor in the same
# rounds (a bare TLS-terminating relay, io.Copy between two crypto/tls
# connections, on the service's address, port 8443: the least any
# intercepting relay does) and the CPU this process (the upstream and the
# service or the relay) spent per GiB, added connect p50 (<= 0.3 ms),
# PARALLEL connects at once (<= 2x direct, no SYN retransmits in the client
# namespace), and small HTTPS requests through interception (requests/s,
# p50, p95) against direct; and a non-web port (an SSH-like server on 2222)
# reached through the service's names range against direct: connect p50 and
# first-byte p50. Needs root; no gVisor, no sandbox. Talks only to the network
# namespaces it creates (internal/gateserve's TestBenchService and
# TestBenchServiceNames).
#   R=3 (rounds)  SIZE_MIB=256 (download)  CONNECTS=1000 (sequential, for p50)
#   PARALLEL=1000  REQS=2000 (small requests)  CONC=8 (their connections)
#   DOWNLOAD_ONLY=1 (the download figures alone)
#   PROFILE=dir (created if need be: a CPU profile of each download, PATH-ROUND.pprof; the
#   service's goroutines carry the label moat=service, the relay's
#   moat=floor: go tool pprof -tagfocus moat=service DIR/service-*.pprof)
set -euo pipefail
if [ -n "${PROFILE:-}" ]; then
	mkdir -p "$PROFILE"
	PROFILE=$(cd "$PROFILE" && pwd) # go test runs in the package's directory
	export PROFILE
fi
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH MOAT_BENCH_GATESERVICE=1
export R=${R:-3} SIZE_MIB=${SIZE_MIB:-256} CONNECTS=${CONNECTS:-1000} PARALLEL=${PARALLEL:-1000} REQS=${REQS:-2000} CONC=${CONC:-8}
log=$(mktemp /tmp/moat-bench-gate-service-XXXX.log)
trap 'rm -f "$log"' EXIT
run='^TestBenchService(Names)?$'
if [ -n "${DOWNLOAD_ONLY:-}" ]; then run='^TestBenchService$'; fi
if ! go test -count=1 -timeout 20m -run "$run" -v ./internal/gateserve >"$log" 2>&1; then
	tail -40 "$log" >&2
	exit 1
fi
sed -n 's/^ *bench[a-z_]*_linux_test.go:[0-9]*: //p' "$log"
