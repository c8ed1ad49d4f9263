#!/usr/bin/env bash
# The gate's memory benchmark: the daemon's resident memory per open idle
# connection and per stalled download (a GET the guest never reads), and
# the gate's download and connect figures, for the previous head's binary
# and this tree's in the same run, rounds alternating which goes first.
# Prints medians of R rounds and new/previous ratios. Needs root and
# ./scripts/setup.sh. Talks only to a test network namespace.
#   OLD=HEAD~1 (the commit to compare with)  R=3 (rounds)  IDLE=500  STALLED=200
#   SIZE_MIB=1024 (download)  CONNECTS=1000
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
OLD=${OLD:-HEAD~1}
work=$(mktemp -d /tmp/moat-bench-memory-XXXX)
log=$work/log
cleanup() {
	git worktree remove --force "$work/old" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
git worktree add --detach "$work/old" "$OLD" >/dev/null
# Every binary of each: moat runs a sandbox's processes from the
# moat-sandbox beside it.
(cd "$work/old" && CGO_ENABLED=0 go build -o "$work/bin-old/" ./cmd/...)
CGO_ENABLED=0 go build -o "$work/bin-new/" ./cmd/...
export MOAT_BIN=$work/bin-new/moat MOAT_BIN_OLD=$work/bin-old/moat MOAT_RUNSC=$PWD/bin/runsc MOAT_BENCH_MEMORY=1
export R=${R:-3} IDLE=${IDLE:-500} STALLED=${STALLED:-200} SIZE_MIB=${SIZE_MIB:-1024} CONNECTS=${CONNECTS:-1000}
echo "previous: $(git rev-parse --short "$OLD"), new: this tree" >&2
if ! go test -count=1 -timeout 60m -run '^TestBenchMemory$' -v ./test/e2e/ >"$log" 2>&1; then
	tail -40 "$log" >&2
	exit 1
fi
sed -n 's/^ *bench_memory_test.go:[0-9]*: //p' "$log"
