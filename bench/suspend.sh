#!/usr/bin/env bash
# Suspend and resume, each against its baseline in the same run; medians of
# N interleaved runs. Needs root and ./scripts/setup.sh.
#   resume: `moat resume` of a suspended sandbox until the guest's HTTP server answers (through a
#           forward)  vs  cold: `moat up` of the stopped sandbox until the same server answers, on_up
#           starting it (target: resume <= 0.5x cold)
#   suspend: `moat suspend` time and the image's size against the guest's memory in use, idle and
#           with a process holding BALLAST_MIB of incompressible memory
#   standby: the same resume after `moat suspend --standby` (the next daemon set up and runsc's
#           sandbox created while suspended)  vs  the same cold start; and the memory (PSS) the
#           standby holds while it waits
#   floor:  gVisor's own restore: bare `runsc restore` of a bare sandbox running the same server
#           (no moat, no network), checkpointed the same way, until runsc returns with it running;
#           its ratio to moat's cold start is the lowest resume ratio moat could reach here
#   parts:  of each start, the daemon's own start_ms (from its record to running; daemon.log) and,
#           for a resume, the shim's `runsc restore` (runsc.log): what is left of the resume is the
#           CLI, the daemon's process start and the forward's first answer; and of a resume's
#           start_ms, the keeper's gate_ms (the gate process's and the shim's starts until the
#           guest's "go") and boot_ms (from "go" to running: runsc restore, then the agent's
#           handshake)
#   fork:   `moat fork` of the running sandbox (its suspend, the copy, its resume)  vs  the same cold
#           start; and `moat snapshot save` of the running sandbox, `moat snapshot restore` of it until
#           the server answers again
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-5}
BALLAST_MIB=${BALLAST_MIB:-64}
MOAT=${MOAT:-$PWD/bin/moat}
export MOAT_RUNSC=${MOAT_RUNSC:-$PWD/bin/runsc}
export MOAT_HOME=$(mktemp -d /tmp/moat-bench-XXXX)
proj=$(mktemp -d /tmp/moat-bench-proj-XXXX)/suspendbench; mkdir -p "$proj"
bare=$(mktemp -d /tmp/moat-bench-bare-XXXX)
rflags=(--root="$bare/state" --platform=systrap --network=none --ignore-cgroups)
cleanup() {
	"$MOAT_RUNSC" "${rflags[@]}" delete --force barefloor >/dev/null 2>&1 || true
	# runsc pins an empty network namespace for its gofers with a bind
	# mount in its root directory.
	while umount -l "$bare/state/null-netns" 2>/dev/null; do :; done
	rm -rf "$bare"
	"$MOAT" destroy --yes suspendbench >/dev/null 2>&1 || true
	"$MOAT" destroy --yes forkbench >/dev/null 2>&1 || true
	rm -rf "$MOAT_HOME" "$(dirname "$proj")"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
guest_port=8124
chmod 0777 "$proj"
cat > "$proj/server.py" <<PY
import http.server
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        n += 1
        b = str(n).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", $guest_port), H).serve_forever()
PY
cat > "$proj/moat.toml" <<TOML
[hooks]
on_up = ["setsid -f python3 server.py </dev/null >/dev/null 2>&1"]

[forwards]
ports = ["$port:$guest_port"]
TOML

# Times come from bash's own clock (EPOCHREALTIME, in µs), not from a
# `date` process, whose start would be counted in every figure.
now() { echo "${EPOCHREALTIME/./}"; }
ms() { echo $(( (${EPOCHREALTIME/./} - $1) / 1000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# answers: polls the server through the forward, every 5 ms, for up to 60 s,
# from a poller started once. A curl per poll counted curl's own start
# (about 30 ms here): in full after a resume, where the server already
# runs, and partly after a cold start, where the polls overlap its start.
poller=$(dirname "$proj")/poller.py
cat > "$poller" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
for _ in sys.stdin:
    deadline, ok = time.monotonic() + 60, False
    while not ok and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"GET / HTTP/1.0\r\n\r\n")
                ok = c.recv(16).startswith((b"HTTP/1.0 200", b"HTTP/1.1 200"))
        except OSError:
            pass
        if not ok:
            time.sleep(0.005)
    print("ok" if ok else "timeout", flush=True)
PY
coproc POLL { exec python3 "$poller" "$port"; }
answers() {
	local reply
	echo go >&"${POLL[1]}"
	read -r reply <&"${POLL[0]}"
	if [ "$reply" != ok ]; then
		echo "the guest's server did not answer within 60 s" >&2
		exit 1
	fi
}
# guest_used_kib: the guest's memory in use, as its kernel (gVisor's) counts it.
guest_used_kib() { "$MOAT" exec suspendbench -- awk '/^MemTotal/ {t=$2} /^MemAvailable/ {a=$2} END {print t-a}' /proc/meminfo; }
image_kib() { du -sk "$MOAT_HOME/state/sandboxes/suspendbench/suspend" | awk '{print $1}'; }
# The last start's parts, from its logs: the daemon's start_ms (from its
# record to running, runsc's part included) and, for a restore, the shim's
# `runsc restore` (runsc.log is rewritten at each start).
sdir=$MOAT_HOME/state/sandboxes/suspendbench
keeper_ms() { grep 'keeper: sandbox running' "$sdir/daemon.log" | tail -1 | sed -n "s/.* $1=\([0-9]*\).*/\1/p"; }
daemon_ms() { keeper_ms start_ms; }
# held_kib: the proportional memory (PSS) of the sandbox's processes, a
# standby's while it waits: its daemon, gate process, shim and runsc's.
held_kib() { for p in $(pgrep -f "$sdir"); do awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null; done | awk '{s+=$1} END {print s+0}'; }
restore_ms() { grep -o 'guest restored in [0-9]*' "$sdir/runsc.log" | tail -1 | awk '{print $4}'; }

(cd "$proj" && "$MOAT" up --trust-project >/dev/null 2>&1)
answers
cold=() resume=() ssusp=() sresume=() sheld=() susp=() img=() used=() fork=() ssave=() srestore=() dcold=() dresume=() rrestore=() rgate=() rboot=()
for i in $(seq "$N"); do
	# Cold: from stopped (down drops any image) to the server's answer.
	"$MOAT" down suspendbench >/dev/null 2>&1
	t=$(now); "$MOAT" up suspendbench >/dev/null 2>&1; answers; cold+=("$(ms "$t")"); dcold+=("$(daemon_ms)")
	used+=("$(guest_used_kib)")
	t=$(now); "$MOAT" suspend suspendbench >/dev/null 2>&1; susp+=("$(ms "$t")")
	img+=("$(image_kib)")
	t=$(now); "$MOAT" resume suspendbench >/dev/null 2>&1; answers; resume+=("$(ms "$t")")
	dresume+=("$(daemon_ms)") rrestore+=("$(restore_ms)") rgate+=("$(keeper_ms gate_ms)") rboot+=("$(keeper_ms boot_ms)")
	# The same resume through a standby, and what the standby holds.
	t=$(now); "$MOAT" suspend --standby suspendbench >/dev/null 2>&1; ssusp+=("$(ms "$t")")
	sheld+=("$(held_kib)")
	t=$(now); "$MOAT" resume suspendbench >/dev/null 2>&1; answers; sresume+=("$(ms "$t")")
	grep -q 'standby: go' <(tail -20 "$sdir/daemon.log") || { echo "the resume did not go through the standby" >&2; exit 1; }
	t=$(now); "$MOAT" fork suspendbench forkbench >/dev/null 2>&1; fork+=("$(ms "$t")")
	"$MOAT" destroy --yes forkbench >/dev/null 2>&1
	t=$(now); "$MOAT" snapshot save suspendbench "s$i" >/dev/null 2>&1; ssave+=("$(ms "$t")")
	t=$(now); "$MOAT" snapshot restore suspendbench "s$i" --yes >/dev/null 2>&1; answers; srestore+=("$(ms "$t")")
	"$MOAT" snapshot rm suspendbench "s$i" --yes >/dev/null 2>&1
done

# The floor: the same server in a bare runsc sandbox (the host's / read-only,
# /tmp included, where the server is; no network but loopback),
# checkpointed and restored N times. runsc restore
# --detach returns once the restored sandbox runs.
cat > "$bare/config.json" <<JSON
{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["python3","$proj/server.py"],"cwd":"/","env":["PATH=/usr/bin:/bin"]},
 "root":{"path":"/","readonly":true},"hostname":"bare",
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"}],
 "linux":{"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"},{"type":"network"}]}}
JSON
floor=()
"$MOAT_RUNSC" "${rflags[@]}" run --detach --bundle="$bare" barefloor >/dev/null
sleep 1
for i in $(seq "$N"); do
	rm -rf "$bare/image"
	"$MOAT_RUNSC" "${rflags[@]}" checkpoint --image-path="$bare/image" barefloor >/dev/null
	"$MOAT_RUNSC" "${rflags[@]}" delete --force barefloor >/dev/null 2>&1 || true
	t=$(now); "$MOAT_RUNSC" "${rflags[@]}" restore --detach --image-path="$bare/image" --bundle="$bare" barefloor >/dev/null; floor+=("$(ms "$t")")
done
"$MOAT_RUNSC" "${rflags[@]}" kill barefloor KILL >/dev/null 2>&1 || true
"$MOAT_RUNSC" "${rflags[@]}" delete --force barefloor >/dev/null 2>&1 || true

# The same with BALLAST_MIB of random bytes held by a process in the guest.
"$MOAT" exec suspendbench -- sh -c "setsid -f python3 -c 'import os, time; b = os.urandom($BALLAST_MIB << 20); time.sleep(1e9)' </dev/null >/dev/null 2>&1"
sleep 3
bsusp=() bimg=() bused=()
for i in $(seq "$N"); do
	bused+=("$(guest_used_kib)")
	t=$(now); "$MOAT" suspend suspendbench >/dev/null 2>&1; bsusp+=("$(ms "$t")")
	bimg+=("$(image_kib)")
	"$MOAT" resume suspendbench >/dev/null 2>&1; answers
done

m() { printf '%s\n' "$@" | median; }
# sub: a - b; medians of an even N end in .5, which $(( )) refuses.
sub() { awk -v a="$1" -v b="$2" 'BEGIN{print a - b}'; }
mib() { awk -v k="$1" 'BEGIN{printf "%d", k / 1024}'; }
# per: a / b, to two places.
per() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
c=$(m "${cold[@]}") r=$(m "${resume[@]}")
printf 'runs: %d each, interleaved, medians\n' "$N"
printf 'to the server answering: resume %s ms  vs  cold start %s ms  ratio %s (target <= 0.5)\n' "$r" "$c" "$(per "$r" "$c")"
sr=$(m "${sresume[@]}")
printf 'with a standby (moat suspend --standby): resume %s ms  vs  cold start %s ms  ratio %s (target <= 0.5); suspend --standby %s ms, the standby holds %d MiB (PSS) while it waits\n' "$sr" "$c" "$(per "$sr" "$c")" "$(m "${ssusp[@]}")" "$(mib "$(m "${sheld[@]}")")"
fl=$(m "${floor[@]}")
printf "floor: gVisor's own restore of the same server, bare runsc, %s ms, %s of moat's cold start; moat's resume is %s ms above it\n" "$fl" "$(per "$fl" "$c")" "$(sub "$r" "$fl")"
dc=$(m "${dcold[@]}") dr=$(m "${dresume[@]}") rr=$(m "${rrestore[@]}")
printf "parts: the daemon's start to running: resume %s ms (runsc restore in the shim %s ms), cold %s ms; before and after it (the CLI, the daemon's process, the forward's first answer): resume %s ms, cold %s ms\n" "$dr" "$rr" "$dc" "$(sub "$r" "$dr")" "$(sub "$c" "$dc")"
rg=$(m "${rgate[@]}") rb=$(m "${rboot[@]}")
printf "parts of the resume's daemon start: to the guest's go (the gate process's and the shim's starts) %s ms, go to running %s ms (runsc restore, then the agent's handshake: about %s ms after runsc)\n" "$rg" "$rb" "$(sub "$rb" "$rr")"
su=$(m "${used[@]}") si=$(m "${img[@]}") bu=$(m "${bused[@]}") bi=$(m "${bimg[@]}")
printf 'suspend, idle guest:          %s ms, image %d MiB for %d MiB in use (%s MiB of image per MiB)\n' "$(m "${susp[@]}")" "$(mib "$si")" "$(mib "$su")" "$(per "$si" "$su")"
printf 'suspend, %d MiB held:         %s ms, image %d MiB for %d MiB in use (%s MiB of image per MiB)\n' "$BALLAST_MIB" "$(m "${bsusp[@]}")" "$(mib "$bi")" "$(mib "$bu")" "$(per "$bi" "$bu")"
f=$(m "${fork[@]}")
printf 'fork of the running sandbox:  %s ms  vs  cold start %s ms  ratio %s\n' "$f" "$c" "$(per "$f" "$c")"
printf 'snapshot save (running):      %s ms; snapshot restore to the server answering: %s ms\n' "$(m "${ssave[@]}")" "$(m "${srestore[@]}")"
printf 'raw: daemon start cold %s | daemon start resume %s | runsc restore %s | to go %s | go to running %s\n' "${dcold[*]}" "${dresume[*]}" "${rrestore[*]}" "${rgate[*]}" "${rboot[*]}"
printf 'raw: standby resume %s | suspend --standby %s | standby held KiB %s\n' "${sresume[*]}" "${ssusp[*]}" "${sheld[*]}"
printf 'raw: floor %s | cold %s | resume %s | suspend %s | suspend+ballast %s | fork %s | snapshot save %s | snapshot restore %s\n' "${floor[*]}" "${cold[*]}" "${resume[*]}" "${susp[*]}" "${bsusp[*]}" "${fork[*]}" "${ssave[*]}" "${srestore[*]}"
