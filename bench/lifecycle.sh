#!/usr/bin/env bash
# Lifecycle benchmarks, each against its baseline in the same run; prints
# medians of N runs and their ratio. Needs root and ./scripts/setup.sh.
#   cold: `moat run -- true` on a never-started sandbox  vs  bare `runsc run` of the host's rootfs
#         (and a floor: bare `runsc run` of `moat version`, the guest init's start)
#   warm: `moat exec N -- true`                           vs  `runsc exec` into the same sandbox
#         (and two floors: /usr/bin/true started inside the guest, moat's CLI start on the host)
#   mem:  PSS of one idle sandbox (the daemon and every process below it)  vs  an idle bare runsc sandbox
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-10}
MOAT=$PWD/bin/moat RUNSC=$PWD/bin/runsc
# A sandbox's own processes, and the guest's init, run moat-sandbox.
SANDBOX=$PWD/bin/moat-sandbox
export MOAT_HOME=$(mktemp -d /tmp/moat-bench-XXXX)
proj=$(mktemp -d /tmp/moat-bench-proj-XXXX)/benchproj; mkdir -p "$proj"
# runsc pins an empty network namespace for its gofers with a bind mount in
# its root directory (null-netns); the bare runs' root is on the host.
unpin() { while umount -l "$bare/state/null-netns" 2>/dev/null; do :; done; }
bare= barego= idle=
cleanup() {
	"$MOAT" destroy --yes benchproj >/dev/null 2>&1 || true
	[ -z "$bare" ] || "$RUNSC" --root="$bare/state" delete --force bareidle >/dev/null 2>&1 || true
	unpin
	rm -rf "$MOAT_HOME" "$(dirname "$proj")" $bare $barego $idle
}
trap cleanup EXIT

# Other sandboxes share runsc's and moat's text with this one's processes,
# which lowers the PSS measured below: say so with the figures.
others=$(pgrep -c -f '^runsc-sandbox' || true)
[ "${others:-0}" -gt 0 ] && echo "warning: $others other gVisor sandbox(es) running: the PSS below is lowered by the text they share"

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# Bare runsc: the host's / as a read-only root with a memory overlay, no network.
bare=$(mktemp -d /tmp/moat-bench-bare-XXXX)
cat > "$bare/config.json" <<JSON
{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["/bin/true"],"cwd":"/","env":["PATH=/usr/bin:/bin"]},
 "root":{"path":"/","readonly":true},"hostname":"bare",
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/tmp","type":"tmpfs","source":"tmpfs"}],
 "linux":{"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"},{"type":"network"}]}}
JSON
rflags=(--root="$bare/state" --platform=systrap --network=none --ignore-cgroups)
# variant ARGS: a bundle like the bare one running ARGS (a JSON list); prints its directory.
variant() { local d; d=$(mktemp -d /tmp/moat-bench-bare-XXXX); sed 's|"args":\["/bin/true"\]|"args":'"$1"'|' "$bare/config.json" > "$d/config.json"; echo "$d"; }
# The same running the guest init's binary (`moat-sandbox version`): what
# starting the guest's init, that same static Go binary, costs inside
# gVisor; and
# running sleep, for the runtime's own idle memory.
barego=$(variant '["'"$SANDBOX"'","version"]')
idle=$(variant '["/bin/sleep","1000"]')

# The bare run goes first in each pair, right after the destroy: a running
# sandbox's daemon keeps working after `moat run` returns (it asks the host's
# tools for package registries, `npm config get` among them), and a bare run
# timed during that would be slowed by it.
cold_moat=() cold_bare=() cold_barego=()
for i in $(seq "$N"); do
	"$MOAT" destroy --yes benchproj >/dev/null 2>&1 || true
	t=$(date +%s%N); "$RUNSC" "${rflags[@]}" run --bundle="$bare" "bare$i" >/dev/null; cold_bare+=("$(ms "$t")")
	t=$(date +%s%N); "$RUNSC" "${rflags[@]}" run --bundle="$barego" "barego$i" >/dev/null; cold_barego+=("$(ms "$t")")
	t=$(date +%s%N); (cd "$proj" && "$MOAT" run --name benchproj -- true 2>/dev/null); cold_moat+=("$(ms "$t")")
done

# Warm: the sandbox from the last cold run is up.
shim=$(pgrep -f "__shim $MOAT_HOME/state/sandboxes/benchproj/" | head -1)
sroot=$MOAT_HOME/state/sandboxes/benchproj/runsc
warm_moat=() warm_bare=()
for i in $(seq "$N"); do
	t=$(date +%s%N); "$MOAT" exec benchproj -- true; warm_moat+=("$(ms "$t")")
	t=$(date +%s%N); nsenter -t "$shim" -p -m -n "$RUNSC" --root="$sroot" exec moat-benchproj /bin/true; warm_bare+=("$(ms "$t")")
done

# Memory of the idle sandbox: every process from the daemon down, however
# deep (runsc's sandbox has children of its own: systrap's stub processes,
# which hold the guest's address spaces). Several stub processes can share
# one address space, and each then reports all of its pages: each address
# space is counted once (kcmp(2) KCMP_VM, syscall 312 on x86-64).
sleep 2
tree() { local c; echo "$1"; for c in $(pgrep -P "$1"); do tree "$c"; done; }
same_mm() { perl -e 'exit(syscall(312, $ARGV[0] + 0, $ARGV[1] + 0, 1, 0, 0) == 0 ? 0 : 1)' "$1" "$2"; }
# pss ROOT...: sets pids, spaces and pss_kb for every process under the roots.
pss() {
	local p q
	pids=() spaces=()
	for p in $(for q in "$@"; do tree "$q"; done | sort -u); do
		pids+=("$p")
		for q in "${spaces[@]}"; do same_mm "$p" "$q" && continue 2; done
		spaces+=("$p")
	done
	pss_kb=$(for p in "${spaces[@]}"; do awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null; done | awk '{s+=$1} END {print s}')
}
pss "$(cat "$MOAT_HOME/state/sandboxes/benchproj/daemon.pid")"
moat_pss=$pss_kb moat_pids=${#pids[@]} moat_spaces=${#spaces[@]}
# moat's own host processes (the daemon's keeper and gate process, the
# shim): each runs moat-sandbox (the check takes moat or any moat-* in
# moat's directory, never runsc), and is named by its role.
# In tenths: whole MiB rounded down read 20.9 as 20, under a 20 MiB target.
mib() { awk -v k="$1" 'BEGIN{printf "%.1f", k / 1024}'; }
bindir=$(dirname "$(readlink -f "$MOAT")")
own=() own_kb=0
for p in "${pids[@]}"; do
	case "$(readlink "/proc/$p/exe" 2>/dev/null)" in "$bindir"/moat | "$bindir"/moat-*) ;; *) continue ;; esac
	kb=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)
	own+=("$(tr '\0' ' ' < "/proc/$p/cmdline" | awk '{print $2}')=$(mib "$kb")")
	own_kb=$((own_kb + kb))
done

# Two floors under a warm exec, each measured N times: a shell already in
# the guest starting /usr/bin/true (bash's EPOCHREALTIME around it: what
# gVisor costs for the command itself, whoever asks for it), and the start
# and exit of moat's CLI on the host (`moat version`). After the memory: the
# guest's shell leaves systrap's stub processes pooled.
guest_true=$("$MOAT" exec benchproj -- bash -c 'for i in $(seq '"$N"'); do s=$EPOCHREALTIME; /usr/bin/true; e=$EPOCHREALTIME; echo "${s/./} ${e/./}"; done' |
	awk '{printf "%.1f\n", ($2 - $1) / 1000}' | median)
cli_start=$(for i in $(seq "$N"); do t=$(date +%s%N); "$MOAT" version >/dev/null; echo $(( ($(date +%s%N) - t) / 100000 )); done |
	median | awk '{printf "%.1f", $1 / 10}')

# The runtime's own floor, in the same run: a bare runsc sandbox running
# sleep, idle, measured the same way once moat's sandbox is gone (they
# would share runsc's text, which lowers both).
"$MOAT" destroy --yes benchproj >/dev/null 2>&1
"$RUNSC" "${rflags[@]}" run --detach --bundle="$idle" bareidle >/dev/null
sleep 2
sandbox=$("$RUNSC" "${rflags[@]}" state bareidle | sed -n 's/^ *"pid": \([0-9]*\),*$/\1/p')
gofer=$(pgrep -f '^runsc-gofer .*--root='"$bare/state" || true)
pss "$sandbox" $gofer
bare_pss=$pss_kb bare_spaces=${#spaces[@]} bare_pids=${#pids[@]}
"$RUNSC" "${rflags[@]}" kill bareidle KILL >/dev/null 2>&1 || true
sleep 0.5
"$RUNSC" "${rflags[@]}" delete --force bareidle >/dev/null 2>&1 || true

cm=$(printf '%s\n' "${cold_moat[@]}" | median); cb=$(printf '%s\n' "${cold_bare[@]}" | median)
cg=$(printf '%s\n' "${cold_barego[@]}" | median)
wm=$(printf '%s\n' "${warm_moat[@]}" | median); wb=$(printf '%s\n' "${warm_bare[@]}" | median)
printf 'runs: %d each, medians in ms\n' "$N"
printf 'cold  moat run -- true   %6s   bare runsc run   %6s   ratio %s (target <= 1.5)\n' "$cm" "$cb" "$(awk -v a="$cm" -v b="$cb" 'BEGIN{printf "%.2f", a/b}')"
printf '      floor: bare runsc run of moat version %s ms, %s more than of /bin/true (moat'"'"'s binary, the guest init, starting in gVisor), of the %s ms 1.5x leaves moat\n' "$cg" "$(awk -v a="$cg" -v b="$cb" 'BEGIN{print a-b}')" "$(awk -v b="$cb" 'BEGIN{print b/2}')"
printf 'warm  moat exec -- true  %6s   runsc exec       %6s   ratio %s (target <= 0.5)\n' "$wm" "$wb" "$(awk -v a="$wm" -v b="$wb" 'BEGIN{printf "%.2f", a/b}')"
printf '      floors: /usr/bin/true from a shell in the guest %s ms, moat CLI start and exit on the host %s ms; 0.5 x runsc exec is %s ms\n' "$guest_true" "$cli_start" "$(awk -v b="$wb" 'BEGIN{printf "%.1f", b/2}')"
printf 'idle sandbox PSS: %d MiB over %d processes, %d address spaces (target <= 40 MiB)\n' "$((moat_pss / 1024))" "$moat_pids" "$moat_spaces"
printf "moat's own processes: %s MiB PSS (%s)\n" "$(mib "$own_kb")" "${own[*]}"
printf 'idle bare runsc:  %d MiB over %d processes, %d address spaces (runsc running sleep: the runtime alone)\n' "$((bare_pss / 1024))" "$bare_pids" "$bare_spaces"
