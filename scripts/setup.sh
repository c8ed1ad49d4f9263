#!/usr/bin/env bash
# Installs what moat needs on a fresh Debian 12 host and builds moat, the
# binaries it runs from its own directory (moat-sandbox, moat-gate,
# moat-docker, moat-kube), moat-cni and
# gVisor's runsc, all static, into ./bin. Safe to run again: every step is
# skipped when already done, and Go's build cache makes rebuilds quick.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
	echo "setup.sh: run as root (it installs packages and loads kernel modules): sudo $0" >&2
	exit 4
fi

need=()
command -v sudo >/dev/null || need+=(sudo)               # passwordless sudo inside host-image sandboxes
[ -x /bin/busybox ] || need+=(busybox-static)             # tests build a tiny OCI image from it
command -v ip >/dev/null || need+=(iproute2)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)     # each sandbox's disk image (internal/disk); "required" on Debian, absent from some minimal images
if [ ${#need[@]} -gt 0 ]; then
	echo "setup.sh: installing ${need[*]}" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
modprobe tun 2>/dev/null || true
modprobe overlay 2>/dev/null || true
modprobe loop 2>/dev/null || true

export PATH=/usr/local/go/bin:$PATH CGO_ENABLED=0
mkdir -p bin
version=$(git describe --always --dirty 2>/dev/null || echo dev)
# moat and the binaries it runs from its own directory, in one link step
# each and one go command: moat-sandbox (a sandbox's own processes and the
# guest's init, without the command line), moat-gate (the gate service,
# `moat gate serve`) and moat-docker (runtime = "docker"), the last two
# holding libraries moat must not link (docs/architecture.md). -X
# main.version stamps those two; moat's and moat-sandbox's version is
# internal/roles.Version, and a daemon refuses a moat of another build.
go build -trimpath -ldflags "-s -w -X moat.dev/moat/internal/roles.Version=$version -X main.version=$version" -o bin/ ./cmd/...
# gVisor at the version pinned in go.mod (tool directive). Static: a
# dynamically linked runsc fails after pivot_root.
# Stamped with that version, which `runsc --version` and `moat doctor` show.
# Man pages, generated from the commands' own help: man -l bin/man/man1/moat-run.1
go run ./internal/tools/manpages bin/man >/dev/null
gvisor=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
# With its seccomp filters precompiled, as gVisor's own (Bazel) release
# build has them: the Go module holds stubs without programs, and runsc
# then compiled the sentry's filter at every sandbox start and restore,
# tens of milliseconds on a resume's critical path (docs/benchmarks.md).
# internal/tools/runscfilters runs gVisor's precompiler for the flags moat
# gives runsc (as root: it precompiles as PID 1 of a PID namespace, where
# the sentry runs) and keeps the programs in bin/.runsc-filters, one
# directory per gVisor version. go build refuses to overlay files in the
# module cache, so runsc is built from a private tree of gVisor's module
# (hard links into the cache, read-only and never written: the overlay
# replaces the two stubs) that a go.work puts in the module's place.
filters=$PWD/bin/.runsc-filters/$gvisor
mkdir -p "$filters"
find "$(dirname "$filters")" -mindepth 1 -maxdepth 1 ! -name "$gvisor" -exec rm -rf {} +   # other gVisor versions'
if [ ! -d "$filters/gvisor" ]; then
	rm -rf "$filters/gvisor.tmp"
	gvisor_dir=$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)
	cp -al "$gvisor_dir" "$filters/gvisor.tmp" 2>/dev/null || { rm -rf "$filters/gvisor.tmp"; cp -a "$gvisor_dir" "$filters/gvisor.tmp"; }
	mv "$filters/gvisor.tmp" "$filters/gvisor"
fi
overlay=$(go run ./internal/tools/runscfilters -gvisor "$filters/gvisor" -o "$filters")
printf 'go %s\n\nuse "%s"\n\nreplace gvisor.dev/gvisor %s => "%s"\n' "$(go list -m -f '{{.GoVersion}}')" "$PWD" "$gvisor" "$filters/gvisor" >"$filters/go.work"
GOWORK=$filters/go.work go build -overlay "$overlay" -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$gvisor" -o bin/runsc gvisor.dev/gvisor/runsc
echo "setup.sh: built $(cd bin && echo moat moat-*) and runsc ($(bin/runsc --version | head -1)) in bin/" >&2
