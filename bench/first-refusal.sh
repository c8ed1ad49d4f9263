#!/usr/bin/env bash
# The first refusal after a start while the sandbox's own host processes are busy, against a
# baseline build in the same run. A destination no rule decides waits for the host's package
# tools (npm config, go env), which the keeper runs at the lowest CPU priority in its cgroup;
# LOAD busy loops in that cgroup stand for a busy gate process (a guest downloading at full
# speed). Busy loops elsewhere on the host do not compete with the tools by priority: the
# sandbox's cgroup has its own share. Each run: `moat up` of a stopped sandbox, the loops put
# into the keeper's CPU cgroup, then one curl in the guest to a name no rule allows, timed by
# curl (time_total: until the gate's 403). Medians of N interleaved runs of each build. Needs
# root, ./scripts/setup.sh and BASE, a baseline moat binary (its moat-sandbox beside it).
#   BASE=/path/to/old/bin/moat  N=5  LOAD=2
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BASE:?BASE=/path/to/a baseline bin/moat}"
NEW=${NEW:-$PWD/bin/moat}
N=${N:-5}
LOAD=${LOAD:-2}
export MOAT_RUNSC=${MOAT_RUNSC:-$PWD/bin/runsc}
tmp=$(mktemp -d /tmp/moat-bench-refusal-XXXX)
loads=()
cleanup() {
	for p in "${loads[@]}"; do kill "$p" 2>/dev/null || true; done
	for w in base new; do
		MOAT_HOME=$tmp/home-$w "$([ $w = base ] && echo "$BASE" || echo "$NEW")" destroy --yes refusal-$w >/dev/null 2>&1 || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

for w in base new; do
	mkdir -p "$tmp/refusal-$w"
	printf '[sandbox]\nname = "refusal-%s"\n' "$w" > "$tmp/refusal-$w/moat.toml"
done
# cgroup_procs PID: the cgroup.procs file of PID's CPU cgroup (v1 cpu controller, else v2).
cgroup_procs() {
	local v1 v2
	v1=$(sed -n 's/^[0-9]*:[^:]*\bcpu\b[^:]*://p' "/proc/$1/cgroup")
	if [ -n "$v1" ] && [ -d "/sys/fs/cgroup/cpu$v1" ]; then
		echo "/sys/fs/cgroup/cpu$v1/cgroup.procs"
		return
	fi
	v2=$(sed -n 's/^0:://p' "/proc/$1/cgroup")
	echo "/sys/fs/cgroup$v2/cgroup.procs"
}
declare -A got
for i in $(seq "$N"); do
	for w in base new; do
		m=$NEW; [ $w = base ] && m=$BASE
		export MOAT_HOME=$tmp/home-$w
		(cd "$tmp/refusal-$w" && "$m" down refusal-$w >/dev/null 2>&1 || true
		 "$m" up >/dev/null)
		procs=$(cgroup_procs "$(cat "$MOAT_HOME/state/sandboxes/refusal-$w/daemon.pid")")
		loads=()
		for _ in $(seq "$LOAD"); do
			timeout 120 sh -c 'while :; do :; done' &
			loads+=($!)
			echo $! > "$procs"
		done
		t=$(cd "$tmp/refusal-$w" && "$m" run -- curl -s -o /dev/null -m 20 -w '%{time_total}' http://first-refusal.test/ || true)
		for p in "${loads[@]}"; do kill "$p" 2>/dev/null || true; done
		wait "${loads[@]}" 2>/dev/null || true
		got[$w]+="$(awk -v t="$t" 'BEGIN {printf "%d", t*1000}') "
	done
done
b=$(echo ${got[base]} | tr ' ' '\n' | median)
n=$(echo ${got[new]} | tr ' ' '\n' | median)
echo "the first refusal after a start, $LOAD busy loops in the keeper's cgroup, $(nproc) processors, medians of $N:"
echo "  baseline $b ms  vs  this build $n ms  ratio $(awk -v a="$n" -v b="$b" 'BEGIN {printf "%.2f", a/b}')"
echo "raw: baseline ${got[base]}| this build ${got[new]}"
