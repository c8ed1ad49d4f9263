#!/usr/bin/env bash
# Rootless against root: `moat up` of a stopped sandbox, as an unprivileged
# user without sudo and as root, interleaved; prints each side's median and
# their ratio (target: rootless <= 1.2x root). Needs root (it creates the
# user and its subordinate ranges, and removes them) and ./scripts/setup.sh;
# installs uidmap if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-7}
MOAT=$PWD/bin/moat RUNSC=$PWD/bin/runsc
command -v newuidmap >/dev/null || { apt-get install -y -qq uidmap >/dev/null; }
user=moatbench$$
B=$(mktemp -d /var/tmp/moat-bench-rootless-XXXX); chmod 755 "$B"
mkdir -p "$B/rl/home" "$B/rl/ws" "$B/root/home" "$B/root/ws"; chmod 755 "$B/rl" "$B/root"
cp "$MOAT" "$B/moat"; chmod 755 "$B/moat"
tun=$(stat -c %a /dev/net/tun)
useradd --no-create-home --shell /usr/sbin/nologin --user-group "$user"
usermod --add-subuids 400000-465535 --add-subgids 400000-465535 "$user"
chown -R "$user:$user" "$B/rl/home" "$B/rl/ws"
chmod 0666 /dev/net/tun # what Debian's udev sets; some VMs leave it 0600
RL() { (cd "$B/rl/ws" && setpriv --reuid="$user" --regid="$user" --clear-groups env -i PATH=/usr/bin:/bin HOME="$B/rl/home" MOAT_HOME="$B/rl/home" MOAT_RUNSC="$RUNSC" "$B/moat" "$@"); }
RT() { (cd "$B/root/ws" && env MOAT_HOME="$B/root/home" MOAT_RUNSC="$RUNSC" "$B/moat" "$@"); }
cleanup() {
	RL destroy --yes ws >/dev/null 2>&1 || true
	RT destroy --yes ws >/dev/null 2>&1 || true
	chmod "$tun" /dev/net/tun
	sleep 1; userdel "$user" 2>/dev/null || true
	sed -i "/^$user:/d" /etc/subuid /etc/subgid
	rm -rf "$B"
}
trap cleanup EXIT
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
RL up --trust-project >/dev/null; RT up --trust-project >/dev/null
rl=() rt=()
for i in $(seq "$N"); do
	RL down ws >/dev/null 2>&1; t=$(date +%s%N); RL up ws >/dev/null 2>&1; rl+=("$(ms "$t")")
	RT down ws >/dev/null 2>&1; t=$(date +%s%N); RT up ws >/dev/null 2>&1; rt+=("$(ms "$t")")
done
a=$(printf '%s\n' "${rl[@]}" | median) b=$(printf '%s\n' "${rt[@]}" | median)
echo "runs: $N each, medians in ms"
printf 'cold  rootless moat up %7s   root moat up %7s   ratio %.2f (target <= 1.2)\n' "$a" "$b" "$(echo "$a / $b" | bc -l)"
