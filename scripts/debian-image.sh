#!/usr/bin/env bash
# Builds a minimal Debian bookworm image for moat's opt-in end-to-end test (apt through the gate):
# debootstrap --variant=minbase from the mirror this host's own apt is configured for, packed as a
# single-layer OCI image layout tarball that `moat image import` accepts, named
# moat-test/debian:bookworm.
#
#   scripts/debian-image.sh [OUT.tar]     build (or reuse) the image; prints its path on stdout
#   scripts/debian-image.sh --print-mirror  print the mirror URL it would use and exit
#
# The mirror is read from the host's apt configuration, never written here: the test must reach
# Debian the way this machine does, and the gate's default policy discovers the same sources.
# The image's /etc/apt/sources.list names that same mirror.
#
# Building takes minutes, so the result is cached in $MOAT_TEST_CACHE (default
# /var/cache/moat-test) under a name that hashes the mirror, this script and the packer, and reused
# as long as none of them changes; OUT, when given, is left alone if it is newer than the script
# and the packer. Progress goes to stderr.
#
# Exit codes: 0 ok, 1 build failed, 2 usage, 3 the mirror is unknown or cannot be reached,
# 4 not root.
set -euo pipefail
self=$(realpath "$0")
caller=$PWD
cd "$(dirname "$self")/.."
export PATH=/usr/local/go/bin:$PATH

readonly ref=moat-test/debian:bookworm
readonly suite=bookworm
cache=${MOAT_TEST_CACHE:-/var/cache/moat-test}

say() { echo "debian-image.sh: $*" >&2; }
die() {
	local code=$1
	shift
	say "$*"
	exit "$code"
}

# one_line_sources prints "URI" for every one-line-style entry (sources.list, *.list) that is a
# plain "deb" line for $suite with the main component, in file order.
one_line_sources() {
	awk -v suite="$suite" '
		{ sub(/#.*/, "") }
		$1 != "deb" { next }
		{
			line = $0
			sub(/^[ \t]*deb[ \t]+/, "", line)
			if (line ~ /^\[/) sub(/^\[[^]]*\][ \t]*/, "", line)   # [arch=amd64 signed-by=...]
			n = split(line, f, /[ \t]+/)
			if (n < 3 || f[2] != suite) next
			for (i = 3; i <= n; i++) if (f[i] == "main") { print f[1]; next }
		}' "$@"
}

# deb822_sources does the same for deb822 *.sources stanzas (Types/URIs/Suites/Components,
# continuation lines, Enabled: no).
deb822_sources() {
	awk -v suite="$suite" '
		function has(list, word,   n, a, i) {
			n = split(list, a, /[ \t]+/)
			for (i = 1; i <= n; i++) if (a[i] == word) return 1
			return 0
		}
		function flush(   n, u, i) {
			if (has(v["types"], "deb") && has(v["suites"], suite) && has(v["components"], "main") && tolower(v["enabled"]) != "no") {
				n = split(v["uris"], u, /[ \t]+/)
				for (i = 1; i <= n; i++) if (u[i] != "") print u[i]
			}
			delete v; key = ""
		}
		/^[ \t]*#/ { next }
		/^[ \t]*$/ { flush(); next }
		/^[ \t]/ { if (key != "") v[key] = v[key] " " $0; next }   # continuation line
		{
			key = tolower($0); sub(/:.*/, "", key)
			val = $0; sub(/^[^:]*:[ \t]*/, "", val)
			v[key] = val
		}
		END { flush() }' "$@"
}

# find_mirror prints the first http(s) URI apt on this host uses for $suite main, in the order apt
# reads its sources: sources.list, then sources.list.d/ by name.
find_mirror() {
	local f
	{
		[ -r /etc/apt/sources.list ] && one_line_sources /etc/apt/sources.list
		for f in /etc/apt/sources.list.d/*; do
			[ -r "$f" ] || continue
			case $f in
			*.list) one_line_sources "$f" ;;
			*.sources) deb822_sources "$f" ;;
			esac
		done
	} | grep -E '^https?://' | head -n 1 | sed 's:/*$::'
}

case ${1:-} in
-h | --help)
	sed -n '2,/^set -euo/p' "$self" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 0
	;;
--print-mirror) [ $# -eq 1 ] || die 2 "usage: $0 [--print-mirror] [OUT.tar]" ;;
-*) die 2 "unknown option $1; usage: $0 [--print-mirror] [OUT.tar]" ;;
esac
[ $# -le 1 ] || die 2 "usage: $0 [--print-mirror] [OUT.tar]"

mirror=$(find_mirror || true)
[ -n "$mirror" ] || die 3 "no 'deb' source for $suite main in /etc/apt/sources.list or /etc/apt/sources.list.d/; this image is built from the host's own Debian mirror"
if [ "${1:-}" = --print-mirror ]; then
	echo "$mirror"
	exit 0
fi

# fresh FILE: FILE exists and is newer than everything that decides its contents.
fresh() {
	local dep
	[ -s "$1" ] || return 1
	for dep in "$self" internal/tools/ociimage/*.go; do
		[ "$1" -nt "$dep" ] || return 1
	done
}

# The cache is keyed by content, not mtime, so a fresh checkout (new mtimes, same files) or a
# second worktree reuses it: the mirror, this script and the packer decide what is built.
key=$( (echo "$mirror"; cat "$self" internal/tools/ociimage/*.go) | sha256sum | cut -c1-12)
cached=$cache/debian-$suite-$key.tar
out=${1:-$cached}
case $out in /*) ;; *) out=$caller/$out ;; esac # relative to where we were called, not the repo root

if [ "$out" = "$cached" ] && [ -s "$cached" ] || fresh "$out"; then
	say "$out is up to date"
	echo "$out"
	exit 0
fi
[ "$(id -u)" -eq 0 ] || die 4 "run as root (debootstrap needs it): sudo $self $*"

mkdir -p "$cache"
chmod 0755 "$cache"
# Two test runs at once build once: the second waits here, then finds the cache fresh.
exec 9>"$cache/debian-$suite.lock"
flock 9

if [ ! -s "$cached" ]; then
	probe=$mirror/dists/$suite/Release
	say "checking $probe"
	if command -v curl >/dev/null; then
		err=$(curl -fsS -o /dev/null --max-time 15 "$probe" 2>&1) || die 3 "cannot reach the apt mirror $mirror (from this host's apt sources): $err"
	else
		err=$(wget -q -O /dev/null --timeout=15 "$probe" 2>&1) || die 3 "cannot reach the apt mirror $mirror (from this host's apt sources): ${err:-wget failed}"
	fi

	if ! command -v debootstrap >/dev/null; then
		say "installing debootstrap"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
	fi

	start=$(date +%s)
	root=$(mktemp -d "$cache/build-XXXXXX")
	cleanup() {
		# debootstrap mounts /proc and /sys in the target; a failed run can leave them behind.
		awk -v r="$root" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
			umount -l "$m" || true
		done
		rm -rf "$root"
	}
	trap cleanup EXIT
	chmod 0755 "$root"

	# sudo: the guest's agent user gets root through it (moat's init writes its sudoers entry);
	# minbase has none. ca-certificates: apt and curl over https.
	say "debootstrap --variant=minbase $suite from $mirror (takes a few minutes)"
	debootstrap --variant=minbase --arch=amd64 --include=sudo,ca-certificates \
		"$suite" "$root" "$mirror" >&2 || die 1 "debootstrap failed; its log is above"

	echo "deb $mirror $suite main" >"$root/etc/apt/sources.list"
	rm -f "$root"/etc/apt/sources.list.d/*
	# Caches and host leftovers: the image's apt lists must come from the sandbox's own
	# apt-get update, and init writes hostname and resolv.conf for each sandbox.
	find "$root/var/lib/apt/lists" -mindepth 1 -maxdepth 1 ! -name partial ! -name lock -exec rm -rf {} +
	rm -f "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
	rm -f "$root/etc/hostname" "$root/etc/resolv.conf"
	rm -rf "$root/debootstrap"
	say "debootstrap done in $(($(date +%s) - start))s ($(du -sh "$root" | cut -f1))"

	say "packing $ref"
	go run ./internal/tools/ociimage "$root" "$cached.tmp" "$ref"
	mv "$cached.tmp" "$cached"
	# Images built by older versions of this script or from another mirror are never used again.
	find "$cache" -maxdepth 1 -name "debian-$suite-*.tar" ! -path "$cached" -delete
	say "built $cached ($(du -h "$cached" | cut -f1)) in $(($(date +%s) - start))s"
fi

if [ "$out" != "$cached" ]; then
	mkdir -p "$(dirname "$out")"
	cp "$cached" "$out.tmp"
	mv "$out.tmp" "$out"
fi
echo "$out"
