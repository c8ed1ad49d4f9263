#!/usr/bin/env bash
# Resource benchmarks (issue 6), each beside its baseline. Needs root and
# ./scripts/setup.sh.
#   density: how many idle sandboxes with a 256 MiB ceiling admission lets
#            start on this host (moat's own admission code, the real RAM
#            and the default reserve: bench/density), beside how many
#            would fit by the PSS that K real idle ones use.
#   cost:    the daemon's CPU time spent on the elastic loop, the idle
#            watchdog and the OOM guard, per sandbox per hour (target:
#            under 1 CPU-second). Five idle sandboxes run side by side for T
#            seconds, R rounds: one with every loop off (the baseline), one
#            with the defaults, and one per loop sampling every 20 ms. Each
#            loop's cost per sample is (its sandbox - baseline) / samples,
#            times its samples per hour at the defaults; the defaults'
#            sandbox minus the baseline is the direct (coarse: clock ticks
#            are 10 ms) measurement. Medians of R.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${K:-3} T=${T:-60} R=${R:-3}
MOAT=${MOAT:-$PWD/bin/moat}
export MOAT_RUNSC=${MOAT_RUNSC:-$PWD/bin/runsc} PATH=/usr/local/go/bin:$PATH
export MOAT_HOME=$(mktemp -d /tmp/moat-bench-res-XXXX)
projs=$(mktemp -d /tmp/moat-bench-res-proj-XXXX)
names=()
cleanup() {
	for n in "${names[@]}"; do "$MOAT" destroy --yes "$n" >/dev/null 2>&1 || true; done
	rm -rf "$MOAT_HOME" "$projs"
}
trap cleanup EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# up NAME TOML [ENV...]: a sandbox from its own project directory.
up() {
	local n=$1 toml=$2; shift 2
	mkdir -p "$projs/$n"
	printf '%b' "$toml" >"$projs/$n/moat.toml"
	(cd "$projs/$n" && env "$@" "$MOAT" up --trust-project >/dev/null 2>"$projs/$n.err") || { cat "$projs/$n.err" >&2; exit 1; }
	names+=("$n")
}
daemon_pid() { cat "$MOAT_HOME/state/sandboxes/$1/daemon.pid"; }

# PSS of one sandbox: the daemon and every process below it, each address
# space once (systrap's stubs share them; kcmp(2) KCMP_VM, syscall 312 on
# x86-64), as bench/lifecycle.sh counts it.
tree() { local c; echo "$1"; for c in $(pgrep -P "$1"); do tree "$c"; done; }
same_mm() { perl -e 'exit(syscall(312, $ARGV[0] + 0, $ARGV[1] + 0, 1, 0, 0) == 0 ? 0 : 1)' "$1" "$2"; }
pss_mib() {
	local p q spaces=()
	for p in $(tree "$(daemon_pid "$1")" | sort -u); do
		for q in "${spaces[@]}"; do same_mm "$p" "$q" && continue 2; done
		spaces+=("$p")
	done
	for p in "${spaces[@]}"; do awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null; done |
		awk '{s+=$1} END {printf "%.1f", s/1024}'
}

# --- density
read -r admitted ram reserve headroom < <(go run ./bench/density 256)
for i in $(seq "$K"); do up "dens$i" '[sandbox]\nmemory = "256MiB"\nmemory_max = "256MiB"\n'; done
sleep 5
pss=()
for i in $(seq "$K"); do pss+=("$(pss_mib "dens$i")"); done
pm=$(printf '%s\n' "${pss[@]}" | median)
for i in $(seq "$K"); do "$MOAT" destroy --yes "dens$i" >/dev/null 2>&1; done

# --- cost: 2 GiB ceilings, so that five fit next to the reserve on a
# 24 GiB host; the guard still samples once a second at idle (GuardWait).
c='[sandbox]\nmemory = "1GiB"\nmemory_max = "2GiB"\n'
off=(MOAT_TEST_ELASTIC_EVERY=1000h MOAT_IDLE_INTERVAL=1000h MOAT_TEST_OOM_GUARD=off)
up cbase "$c" "${off[@]}"
up cdefault "$c"
up celastic "$c" MOAT_TEST_ELASTIC_EVERY=20ms MOAT_IDLE_INTERVAL=1000h MOAT_TEST_OOM_GUARD=off
up cidle "$c" MOAT_TEST_ELASTIC_EVERY=1000h MOAT_IDLE_INTERVAL=20ms MOAT_TEST_OOM_GUARD=off
up cguard "$c" MOAT_TEST_ELASTIC_EVERY=1000h MOAT_IDLE_INTERVAL=1000h MOAT_TEST_OOM_GUARD=20ms
tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$(daemon_pid "$1")/stat"; }
# The whole sandbox: the daemon and every process below it, runsc's
# Sentry and gofer included, which the daemon's loops do not account for.
tree_ticks() { for p in $(tree "$(daemon_pid "$1")"); do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null; done | awk '{s+=$1} END {print s+0}'; }
sleep 5
declare -A res
whole=()
for r in $(seq "$R"); do
	declare -A t0
	for n in cbase cdefault celastic cidle cguard; do t0[$n]=$(cpu_ticks "$n"); done
	w0=$(tree_ticks cdefault)
	sleep "$T"
	for n in cbase cdefault celastic cidle cguard; do res[$n,$r]=$(( $(cpu_ticks "$n") - ${t0[$n]} )); done
	whole+=("$(awk -v a="$(tree_ticks cdefault)" -v b="$w0" -v tck="$tck" -v t="$T" 'BEGIN{printf "%.1f", (a-b)/tck*3600/t}')")
done
# per hour at the defaults: elastic every 5 s (720), idle every minute (60),
# the guard once a minute when idle (its notifier wait's timeout: v1's
# threshold, v2's memory.events; without a notifier, once a second: 3600).
samples=$(awk -v t="$T" 'BEGIN{print t/0.020}')
per() { # name, samples per hour at the defaults -> CPU ms per sample, CPU s per hour
	local v=() r
	for r in $(seq "$R"); do v+=("$(awk -v a="${res[$1,$r]}" -v b="${res[cbase,$r]}" -v tck="$tck" -v s="$samples" 'BEGIN{printf "%.6f", (a-b)/tck/s*1000}')"); done
	local ms; ms=$(printf '%s\n' "${v[@]}" | median)
	echo "$ms $(awk -v ms="$ms" -v n="$2" 'BEGIN{printf "%.3f", ms*n/1000}')"
}
read -r e_ms e_h < <(per celastic 720)
read -r i_ms i_h < <(per cidle 60)
read -r g_ms g_h < <(per cguard 60)
g2_h=$(awk -v ms="$g_ms" 'BEGIN{printf "%.3f", ms*3600/1000}')
direct=() base=()
for r in $(seq "$R"); do
	direct+=("$(awk -v a="${res[cdefault,$r]}" -v b="${res[cbase,$r]}" -v tck="$tck" -v t="$T" 'BEGIN{printf "%.2f", (a-b)/tck*3600/t}')")
	base+=("$(awk -v b="${res[cbase,$r]}" -v tck="$tck" -v t="$T" 'BEGIN{printf "%.2f", b/tck*3600/t}')")
done

printf 'density, memory_max 256 MiB, default reserve: host RAM %d MiB, reserve %d MiB\n' "$ram" "$reserve"
printf '  admitted by admission           %4d sandboxes   (RAM - reserve) / ceiling\n' "$admitted"
printf '  idle PSS per sandbox (median of %d) %6s MiB   -> %d would fit by PSS in RAM - reserve (%.1fx the admitted)\n' \
	"$K" "$pm" "$(awk -v f="$((ram - reserve))" -v p="$pm" 'BEGIN{print int(f/p)}')" "$(awk -v f="$((ram - reserve))" -v p="$pm" -v a="$admitted" 'BEGIN{print f/p/a}')"
printf '  cgroup hard limit per sandbox   %4d MiB        (ceiling + %d MiB OOM-guard headroom, from the reserve)\n' "$((256 + headroom))" "$headroom"
printf 'cost per idle sandbox, daemon CPU (T=%ss x R=%s, medians; baseline: all three loops off)\n' "$T" "$R"
printf '  elastic loop    %8.4f ms/sample x  720/h = %6.3f CPU-s/h\n' "$e_ms" "$e_h"
printf '  idle watchdog   %8.4f ms/sample x   60/h = %6.3f CPU-s/h\n' "$i_ms" "$i_h"
printf '  OOM guard       %8.4f ms/sample x   60/h = %6.3f CPU-s/h (asleep on the kernel notifier below half the ceiling; sampling 1/s instead: %s)\n' "$g_ms" "$g_h" "$g2_h"
printf '  sum             %s CPU-s/h (target < 1)\n' "$(awk -v a="$e_h" -v b="$i_h" -v c="$g_h" 'BEGIN{printf "%.3f", a+b+c}')"
printf '  direct: defaults minus baseline %s CPU-s/h (rounds: %s; 10 ms ticks); the baseline daemon itself %s CPU-s/h\n' \
	"$(printf '%s\n' "${direct[@]}" | median)" "${direct[*]}" "$(printf '%s\n' "${base[@]}" | median)"
wh=$(printf '%s\n' "${whole[@]}" | median)
printf 'the whole idle sandbox at the defaults (daemon and every process below it, runsc included): %s CPU-s/h, %.1f%% of a core (rounds: %s)\n' \
	"$wh" "$(awk -v h="$wh" 'BEGIN{print h/36}')" "${whole[*]}"
