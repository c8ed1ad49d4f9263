#!/usr/bin/env bash
# Runs every test tier: unit, integration (real namespaces, real gVisor) and
# end-to-end through the built bin/moat. Needs root, like moat itself.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH=/usr/local/go/bin:$PATH
go vet ./...
# One built moat and one runsc shared by every end-to-end test: bin/test/
# holds moat and moat-sandbox with the test-only hooks (-tags moattest: the
# gate process's escape attempts, see internal/daemon/escape_moattest.go),
# and links to the other binaries that setup.sh just built (moat-gate,
# moat-docker), which moat runs from its own directory like moat-sandbox.
# The test hooks are in a sandbox's control API, which none of those
# serves, so moattest links of them would add hooks nothing calls, at more
# links' cost in CI.
mkdir -p bin/test
CGO_ENABLED=0 go build -trimpath -tags moattest -o bin/test/ ./cmd/moat ./cmd/moat-sandbox
for b in bin/moat-*; do
	[ "$b" = bin/moat-sandbox ] || ln -sfn "../${b#bin/}" bin/test/
done
export MOAT_BIN=$PWD/bin/test/moat MOAT_RUNSC=$PWD/bin/runsc
# test/docker needs a Docker engine: scripts/docker.sh installs Debian's
# docker.io when it is missing and starts dockerd. Its outcome reaches the
# tests in MOAT_DOCKER: a failed set-up fails them with its reason; only a
# host without apt-get at all skips them, said here and in the test log.
dstart=$(date +%s)
if derr=$(./scripts/docker.sh 2>&1); then
	export MOAT_DOCKER=ready
	# The run below has the workload on runsc, which docker.sh registers
	# (a new sandbox fails, naming the runtime, if it did not); test/docker
	# runs again on runc after it: the same checks on both runtimes (what
	# a pass costs: docs/docker.md, "Tests").
	export MOAT_DOCKER_RUNTIME=runsc
elif [ $? -eq 3 ]; then
	export MOAT_DOCKER="skip: $(printf '%s\n' "$derr" | tail -1)"
	echo "test.sh: SKIPPING test/docker: $MOAT_DOCKER" >&2
else
	export MOAT_DOCKER="fail: $(printf '%s\n' "$derr" | tail -1)"
	printf 'test.sh: scripts/docker.sh failed; test/docker will fail:\n%s\n' "$derr" >&2
fi
echo "test.sh: scripts/docker.sh: $(( $(date +%s) - dstart )) s" >&2
# -v so that every skipped test says why in the log; the full output is in
# /tmp/moat-test.log, and what is printed here is the skips with their
# reasons, every failure with its output, and each package's result line.
log=/tmp/moat-test.log
rc=0
# test/cluster runs below, on its cluster, not here (where it would only
# say it was not asked).
go test -count=1 -timeout 40m -v $(go list ./... | grep -v '/test/cluster') >"$log" 2>&1 || rc=$?
# test/docker again, the workload on runc (see the Docker section above).
if [ "${MOAT_DOCKER:-}" = ready ]; then
	MOAT_DOCKER_RUNTIME=runc go test -count=1 -timeout 15m -v ./test/docker >>"$log" 2>&1 || rc=$?
fi
# The daemon package again under the race detector: its start-and-stop
# test runs the keeper in the test process, so the keeper's start, stop
# and goroutines are raced (about 15 s).
go test -race -count=1 -timeout 10m -v ./internal/daemon >>"$log" 2>&1 || rc=$?
# The Kubernetes tier on a real single-node cluster, after the rest so that
# its control plane does not load the host under the timed tests:
# scripts/cluster.sh builds it (cached under /var/cache/moat-cluster, a few
# minutes when deploy/cluster changed) and starts it; the moat-cni and gate
# tests (test/cluster) and the build's own smoke test run on it; it stops
# after. Like Docker's, only a host without apt-get skips it, loudly.
cstart=$(date +%s)
if cerr=$(./scripts/cluster.sh up 2>&1); then
	MOAT_CLUSTER=1 go test -count=1 -timeout 20m -v ./test/cluster/... >>"$log" 2>&1 || rc=$?
	(cd deploy/cluster/build && go test -count=1 -timeout 10m -v ./smoke) >>"$log" 2>&1 || rc=$?
elif [ $? -eq 3 ]; then
	echo "test.sh: SKIPPING test/cluster: $(printf '%s\n' "$cerr" | tail -1)" >&2
else
	printf 'test.sh: scripts/cluster.sh up failed:\n%s\n' "$(printf '%s\n' "$cerr" | tail -20)" | tee -a "$log" >&2
	rc=1
fi
./scripts/cluster.sh down >/dev/null 2>&1 || echo "test.sh: scripts/cluster.sh down failed" >&2
echo "test.sh: the cluster tier: $(( $(date +%s) - cstart )) s" >&2
grep -E -B1 '^\s*--- SKIP' "$log" | grep -v '^--$' || true
if [ "$rc" -ne 0 ]; then
	# Each failed test's and subtest's own output, at most its last 150
	# lines (go test -v streams a test's lines after its "=== RUN", "=== CONT"
	# or "=== NAME" line); then panics and build failures.
	for t in $(grep -E '^\s*--- FAIL: ' "$log" | awk '{print $3}' | sort -u | head -20); do
		echo "--- the output of $t:"
		awk -v t="$t" '/^=== (RUN|CONT|NAME) /{in_t = ($3 == t); next} /^--- /{in_t = 0} in_t' "$log" | tail -150
	done
	grep -E -A40 '^panic:|\[build failed\]' "$log" | head -200 || true
fi
grep -E '^(ok|FAIL|\?) ' "$log" || true
exit "$rc"
