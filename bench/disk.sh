#!/usr/bin/env bash
# What the writable layer's disk image costs at start, on one binary,
# interleaved; prints medians of N runs and their ratio. Needs root and
# ./scripts/setup.sh.
#   cold:    `moat run -- true` on a never-started sandbox: default disk (mkfs.ext4
#            of a sparse image, then its mount)  vs  disk = "unlimited" (no image)
#   restart: `moat up` after `moat down` (the existing image mounted again)  vs  unlimited
#   setup:   the cold start's setup_ms from daemon.log (the daemon's work before the shim,
#            where mkfs.ext4 runs), less noisy than the whole start
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-10}
MOAT=${MOAT:-$PWD/bin/moat}
export MOAT_HOME=$(mktemp -d /tmp/moat-bench-XXXX)
base=$(mktemp -d /tmp/moat-bench-disk-XXXX)
mkdir -p "$base/dimg" "$base/dnone"
printf '[sandbox]\ndisk = "unlimited"\n' > "$base/dnone/moat.toml"
cleanup() {
	for v in dimg dnone; do "$MOAT" destroy --yes "$v" >/dev/null 2>&1 || true; done
	rm -rf "$MOAT_HOME" "$base"
}
trap cleanup EXIT

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
median() { tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

declare -A cold restart setup
# Which variant goes first alternates, so neither always runs right after
# the other's teardown.
for i in $(seq "$N"); do
	order="dimg dnone"; [ $((i % 2)) = 0 ] && order="dnone dimg"
	for v in $order; do
		"$MOAT" destroy --yes "$v" >/dev/null 2>&1 || true
		t=$(date +%s%N); (cd "$base/$v" && "$MOAT" run --trust-project -- true 2>/dev/null); cold[$v]+="$(ms "$t") "
		setup[$v]+="$(grep 'msg="sandbox running"' "$MOAT_HOME/state/sandboxes/$v/daemon.log" | tail -1 | sed 's/.*setup_ms=\([0-9]*\).*/\1/') "
		"$MOAT" down "$v" >/dev/null 2>&1
		t=$(date +%s%N); "$MOAT" up "$v" >/dev/null 2>&1; restart[$v]+="$(ms "$t") "
	done
done
for k in cold restart setup; do
	declare -n m=$k
	a=$(echo ${m[dimg]} | median) b=$(echo ${m[dnone]} | median)
	printf '%-8s image %6s ms   unlimited %6s ms   ratio %s\n' "$k" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", a/b}')"
done
echo "image of a cold start: $(du -h "$MOAT_HOME/state/sandboxes/dimg/disk.img" 2>/dev/null | cut -f1) on the host"
