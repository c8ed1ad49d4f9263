#!/usr/bin/env bash
# Test-only: a single-node Kubernetes cluster built here from sources, for
# moat's gate in front of agent-sandbox (issue 21). No registry is used:
# every binary is built from Go modules, every image a pod runs is made
# here and imported into containerd.
#
#   scripts/cluster.sh up       build what is missing, start what is not running
#   scripts/cluster.sh status   which components run; the admin kubeconfig's path
#   scripts/cluster.sh down     stop it all; pods' network namespaces and mounts go
#   scripts/cluster.sh down --purge   also forget the cluster (etcd, PKI, images)
#
# Each is safe to run again. Components run as host processes (no systemd
# here), each with a pid file under /run/moat-cluster and a log under
# /var/log/moat-cluster. docs/kubernetes.md says what it costs and why it
# is built the way it is.
#
# Exit codes: 0 done (status: every component runs); 3 no apt-get and
# containerd missing (the caller skips cluster tests loudly); 5 status: some
# component is down; anything else is a failure whose reason is on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

state=/var/lib/moat-cluster
run=/run/moat-cluster
logs=/var/log/moat-cluster
cache=/var/cache/moat-cluster
pki=$state/pki
admin_kc=$pki/admin.kubeconfig

node=moat-node
# The node's address is on an interface of its own (an empty bridge), so the API server
# and kubelet listen on nothing that leaves the machine, and a pod reaches
# the API server (through the kubernetes Service) at a local address.
node_if=moat-k8s0
node_ip=10.243.0.1
pod_cidr=10.244.0.0/16      # docs/kubernetes.md: the gate's tenant covers it
node_pod_cidr=10.244.0.0/24
service_cidr=10.96.0.0/12   # holds the gate's fixed clusterIP 10.96.0.53
service_ip=10.96.0.1
gate_ip=10.96.0.53          # deploy/kubernetes/gate-service.yaml; moat-cni fences to it
bridge=moat-cni0
etcd_url=http://127.0.0.1:12379 # not 2379: a developer's own etcd may have it
cni_version=v1.10.0
containerd_version=v2.4.2

log() { echo "cluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
	echo "cluster.sh: run as root (it installs packages, starts a kubelet and changes iptables): sudo $0 ${1:-}" >&2
	exit 4
fi
export PATH=/usr/local/go/bin:$PATH

# --- building -------------------------------------------------------------

mod_version() { go list -m -f '{{.Version}}' "$1"; }

# The cache key names every input: the build module (Kubernetes, etcd and
# our tools), the versions taken from moat's go.mod (gVisor, agent-sandbox),
# the CNI plugins' version and Go's. A change to any builds a new directory;
# an unchanged key builds nothing.
cache_key() {
	{
		go version
		echo "gvisor $(mod_version gvisor.dev/gvisor) agent-sandbox $(mod_version sigs.k8s.io/agent-sandbox) cni $cni_version containerd $containerd_version"
		find deploy/cluster/build deploy/cluster/manifests -type f -print0 | sort -z | xargs -0 sha256sum
	} | sha256sum | cut -c1-16
}

build() {
	local dir=$1 t0 t
	local b=$dir.partial/bin
	rm -rf "$dir.partial"
	mkdir -p "$b/cni" "$dir.partial/images" "$dir.partial/agent-sandbox"
	t0=$(date +%s)
	local gobuild=(nice -n 19 env CGO_ENABLED=0 go)
	local kube
	kube=$(cd deploy/cluster/build && go list -m -f '{{.Version}}' k8s.io/kubernetes)
	local minor=${kube#v1.}
	minor=${minor%%.*}
	# Stamped like a release, or each component reports v0.0.0 and the
	# kubelet's and API server's version checks see a skew.
	local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
	log "building Kubernetes $kube, etcd and the cluster's tools (cold: about 30 CPU-minutes; docs/kubernetes.md)"
	(cd deploy/cluster/build && "${gobuild[@]}" build -trimpath -ldflags "$ldflags" -o "$b/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
		go.etcd.io/etcd/server/v3 ./cmd/clustertool ./cmd/pause ./cmd/hello)
	mv "$b/server" "$b/etcd"
	t=$(date +%s); log "  Kubernetes and etcd: $((t - t0)) s"

	# gVisor at the version moat pins, built as scripts/setup.sh builds
	# runsc (from moat's module, so Go's build cache has it), and its
	# containerd shim from gVisor's own module: moat's go.sum does not hold
	# the shim's dependencies, and go.mod is not to grow for a test cluster.
	local gvisor
	gvisor=$(mod_version gvisor.dev/gvisor)
	"${gobuild[@]}" build -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$gvisor" -o "$b/runsc" gvisor.dev/gvisor/runsc
	# One change to the shim: it sets its own OOM score to -999, which
	# needs CAP_SYS_RESOURCE, and these machines' bounding set lacks it
	# ("failed to set OOM Score on shim: ... permission denied"). The
	# shim keeps containerd's score (0) instead. Go refuses an -overlay of
	# the module cache, so the module is copied (to a fixed path, which
	# keeps Go's build cache warm) and patched there; a gVisor whose line
	# differs stops the build rather than run unpatched.
	local src=$cache/src/gvisor@$gvisor gvdir
	if [ ! -f "$src/.patched" ]; then
		gvdir=$(go mod download -json "gvisor.dev/gvisor@$gvisor" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		rm -rf "$src"
		mkdir -p "$cache/src"
		cp -r "$gvdir" "$src"
		chmod -R u+w "$src"
		[ "$(grep -c '^	oomScoreMax = -999$' "$src/pkg/shim/v1/manager.go")" = 1 ] ||
			die "gVisor $gvisor's pkg/shim/v1/manager.go no longer sets oomScoreMax = -999; check the shim's OOM score before building it"
		sed -i 's/^	oomScoreMax = -999$/	oomScoreMax = 0/' "$src/pkg/shim/v1/manager.go"
		touch "$src/.patched"
	fi
	(cd "$src" && "${gobuild[@]}" build -trimpath -ldflags "-s -w" -o "$b/containerd-shim-runsc-v1" ./shim)
	t0=$t; t=$(date +%s); log "  runsc and containerd-shim-runsc-v1 ($gvisor): $((t - t0)) s"

	# The CNI plugins and agent-sandbox's controller are built with
	# `go install module@version`: each against the dependencies its own
	# go.mod pins, not mixed by Go's version selection with Kubernetes'.
	local p cni=()
	for p in main/bridge ipam/host-local main/loopback meta/portmap; do
		cni+=("github.com/containernetworking/plugins/plugins/$p@$cni_version")
	done
	GOBIN=$b/cni "${gobuild[@]}" install -trimpath -ldflags "-s -w" "${cni[@]}"
	# containerd from its module, not Debian's 1.6: gVisor's shim answers
	# containerd's start in the JSON form that containerd 1.7 introduced
	# (1.6 fails with "dial unix {"version":2,...}: invalid argument"),
	# and Kubernetes 1.36 dropped containerd 1.x. Static: btrfs, devmapper
	# and zfs (cgo) are left out; the cluster uses overlayfs.
	GOBIN=$b "${gobuild[@]}" install -trimpath -tags no_btrfs,no_devmapper,no_zfs \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
		"github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
		"github.com/containerd/containerd/v2/cmd/ctr@$containerd_version" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version"
	t0=$t; t=$(date +%s); log "  CNI plugins $cni_version and containerd $containerd_version: $((t - t0)) s"
	local asb
	asb=$(mod_version sigs.k8s.io/agent-sandbox)
	GOBIN=$b "${gobuild[@]}" install -trimpath -ldflags "-s -w" "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@$asb"
	local asbdir
	asbdir=$(go mod download -json "sigs.k8s.io/agent-sandbox@$asb" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -d "$asbdir/k8s/crds" ] || die "agent-sandbox $asb has no k8s/crds in $asbdir"
	cp "$asbdir"/k8s/crds/*.yaml "$asbdir/k8s/rbac.generated.yaml" "$asbdir/k8s/extensions-rbac.generated.yaml" "$dir.partial/agent-sandbox/"
	t0=$t; t=$(date +%s); log "  agent-sandbox controller $asb: $((t - t0)) s"

	"$b/clustertool" image -name moat.local/pause:1 -binary "$b/pause" -o "$dir.partial/images/pause.tar"
	"$b/clustertool" image -name moat.local/hello:1 -binary "$b/hello" -o "$dir.partial/images/hello.tar"
	rm -rf "$dir"
	mv "$dir.partial" "$dir"
}

ensure_built() {
	local key
	key=$(cache_key)
	out=$cache/$key
	bin=$out/bin
	if [ -x "$bin/clustertool" ] && [ -f "$out/images/hello.tar" ]; then
		return
	fi
	local t0
	t0=$(date +%s)
	mkdir -p "$cache"
	build "$out"
	log "built into $out in $(( $(date +%s) - t0 )) s"
	# Each build is some 800 MB: older ones go, unless a running component
	# still uses one (up warns about those; down and up switch).
	local d
	for d in "$cache"/*/; do
		d=${d%/}
		case $d in "$out" | "$cache/src") continue ;; esac
		grep -qsF "$d/" "$run"/*.exe && continue
		rm -rf "$d"
	done
}

# --- processes --------------------------------------------------------------

pid_of() {
	local f=$run/$1.pid pid
	[ -s "$f" ] || return 1
	pid=$(cat "$f")
	# Only a process whose binary is the one recorded is ours: a stale pid
	# file must never make us signal someone else's process.
	[ -e "/proc/$pid/exe" ] && [ "$(readlink "/proc/$pid/exe")" = "$(cat "$run/$1.exe" 2>/dev/null)" ] || return 1
	echo "$pid"
}

# start NAME [VAR=value...] BINARY ARGS...
start() {
	local name=$1
	shift
	if pid_of "$name" >/dev/null; then
		return
	fi
	local a exe=""
	for a in "$@"; do
		case $a in *=*) ;; *) exe=$(readlink -f "$(command -v "$a")"); break ;; esac
	done
	# setsid: the component outlives this script and ignores the caller's
	# terminal signals. env execs the binary, so the pid is the component's.
	setsid env "$@" >>"$logs/$name.log" 2>&1 </dev/null &
	echo $! >"$run/$name.pid"
	echo "$exe" >"$run/$name.exe"
	log "started $name (pid $!, log $logs/$name.log)"
}

stop() {
	local name=$1 pid
	if pid=$(pid_of "$name"); then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 40); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.25
		done
		kill -KILL "$pid" 2>/dev/null || true
		log "stopped $name (pid $pid)"
	fi
	rm -f "$run/$name.pid" "$run/$name.exe"
}

wait_for() {
	local what=$1 tries=$2
	shift 2
	for _ in $(seq 1 "$tries"); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	die "$what did not come up; see $logs/"
}

# --- up -------------------------------------------------------------------

ensure_packages() {
	local need=()
	command -v runc >/dev/null || need+=(runc) # containerd-shim-runc-v2 runs it for pods without a RuntimeClass
	command -v iptables >/dev/null || need+=(iptables)
	[ ${#need[@]} -eq 0 ] && return
	if ! command -v apt-get >/dev/null; then
		echo "cluster.sh: no ${need[*]} and no apt-get on this host; install them by hand to run the cluster" >&2
		exit 3
	fi
	log "installing ${need[*]}"
	apt-get update -qq
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/tmp/moat-cluster-apt.log 2>&1; then
		tail -20 /tmp/moat-cluster-apt.log >&2
		die "apt-get install ${need[*]} failed (log: /tmp/moat-cluster-apt.log)"
	fi
}

# Pods reach one another and this machine, and nothing beyond it: the
# FORWARD rules drop what a pod sends off the pod network, and what comes
# from elsewhere to a pod. (Docker's FORWARD policy is DROP, so the pod
# network's own traffic is accepted here explicitly.) Item 3 of issue 21
# narrows this per pod.
network_up() {
	modprobe br_netfilter 2>/dev/null || true
	modprobe overlay 2>/dev/null || true
	if ! ip link show "$node_if" >/dev/null 2>&1; then
		# A bridge with no ports stands in for a dummy interface, which
		# these machines' kernel lacks ("Unknown device type").
		ip link add "$node_if" type bridge
	fi
	ip addr replace "$node_ip/32" dev "$node_if"
	ip link set "$node_if" up
	sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
	iptables -N MOAT-CLUSTER 2>/dev/null || iptables -F MOAT-CLUSTER
	iptables -A MOAT-CLUSTER -s "$pod_cidr" -d "$pod_cidr" -j ACCEPT
	iptables -A MOAT-CLUSTER -s "$pod_cidr" -j DROP
	iptables -A MOAT-CLUSTER -d "$pod_cidr" -j DROP
	iptables -C FORWARD -j MOAT-CLUSTER 2>/dev/null || iptables -I FORWARD 1 -j MOAT-CLUSTER
}

# install_moat_cni builds moat's CNI plugin (cmd/moat-cni, of this
# repository, not of the cached build) into the CNI bin directory of this
# build and of the containerd that runs, which may be an older build's:
# the conflist below names it, and a pod whose plugin is missing never
# starts. Renamed into place: containerd may be running the old one.
install_moat_cni() {
	local d dirs=("$bin/cni") exe
	if exe=$(cat "$run/containerd.exe" 2>/dev/null) && [ "$(dirname "$exe")/cni" != "$bin/cni" ]; then
		dirs+=("$(dirname "$exe")/cni")
	fi
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$cache/moat-cni.new" ./cmd/moat-cni
	for d in "${dirs[@]}"; do
		[ -d "$d" ] || continue
		cp "$cache/moat-cni.new" "$d/moat-cni.new"
		mv -f "$d/moat-cni.new" "$d/moat-cni"
	done
	rm -f "$cache/moat-cni.new"
}

write_configs() {
	mkdir -p "$state/cni/net.d" "$state/containerd" "$state/kubelet" "$logs/pods"
	install_moat_cni
	# moat-cni last (docs/kubernetes.md, "Egress enforced outside the
	# sandbox"): pods of namespace agents (deploy/kubernetes/examples) and
	# pods annotated moat.dev/egress: gate reach the gate's fixed
	# clusterIP and nothing else; every other pod passes untouched.
	cat >"$state/cni/net.d/10-moat.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "moat",
  "plugins": [
    {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$node_pod_cidr"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$state/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "moat-cni",
     "gate": {"addresses": ["$gate_ip"], "ports": ["53/udp", "53/tcp", "80/tcp", "443/tcp"]},
     "namespaces": ["agents"],
     "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
  ]
}
EOF
	cat >"$state/containerd/runsc.toml" <<EOF
binary_name = "$bin/runsc"
root = "$run/runsc"
[runsc_config]
  platform = "systrap"
EOF
	cat >"$state/containerd/config.toml" <<EOF
version = 3
root = "$state/containerd/root"
state = "$run/containerd"
[grpc]
  address = "$run/containerd/containerd.sock"
[ttrpc]
  address = "$run/containerd/containerd.sock.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "$state/containerd/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = 'moat.local/pause:1'
[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # The kubelet gives a pod's sandbox an OOM score of -998, which needs
  # CAP_SYS_RESOURCE, missing here ("setting oom_score_adj to -998:
  # permission denied"): containerd raises any score below its own.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['$bin/cni']
    conf_dir = '$state/cni/net.d'
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
      runtime_type = 'io.containerd.runsc.v1'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
        TypeUrl = 'io.containerd.runsc.v1.options'
        ConfigPath = '$state/containerd/runsc.toml'
EOF
	cat >"$state/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
address: $node_ip
tlsCertFile: $pki/kubelet-server.crt
tlsPrivateKeyFile: $pki/kubelet-server.key
containerRuntimeEndpoint: unix://$run/containerd/containerd.sock
cgroupDriver: cgroupfs
# This machine mounts cgroup v1 (a hybrid hierarchy), which the kubelet
# refuses by default since Kubernetes 1.35.
failCgroupV1: false
failSwapOn: false
podLogsDir: $logs/pods
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
# The images the pods run were imported, not pulled: never let the
# kubelet's image garbage collector remove them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
serializeImagePulls: false
# No KUBE-FIREWALL and canary chains in the host's iptables: kube-proxy
# keeps its own, and down removes them with --cleanup.
makeIPTablesUtilChains: false
EOF
}

import_images() {
	local ctr=("$bin/ctr" --address "$run/containerd/containerd.sock" -n k8s.io)
	local img
	# Imported every time (a fraction of a second each): the same name may
	# hold a rebuilt binary, and an import of what is there changes nothing.
	for img in pause hello; do
		# ctr warns on stderr at each call that cgroup v1 is deprecated.
		"${ctr[@]}" images import "$out/images/$img.tar" >/dev/null 2>"$logs/ctr.log" ||
			die "importing $img: $(cat "$logs/ctr.log")"
	done
}

up() {
	local t0
	t0=$(date +%s)
	ensure_packages
	ensure_built
	mkdir -p "$state" "$run" "$logs"
	"$bin/clustertool" pki -dir "$pki" -node-ip "$node_ip" -service-ip "$service_ip" -node "$node"
	network_up
	write_configs
	local tb
	tb=$(date +%s)

	start etcd "$bin/etcd" --name moat --data-dir "$state/etcd" \
		--listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
		--listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
		--initial-cluster moat=http://127.0.0.1:12380 --listen-metrics-urls http://127.0.0.1:12381
	wait_for etcd 60 curl -fsS "$etcd_url/health"

	start kube-apiserver "$bin/kube-apiserver" \
		--etcd-servers="$etcd_url" \
		--bind-address="$node_ip" --advertise-address="$node_ip" --secure-port=6443 \
		--service-cluster-ip-range="$service_cidr" \
		--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
		--client-ca-file="$pki/ca.crt" \
		--kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key="$pki/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--allow-privileged=true --profiling=false
	"$bin/clustertool" wait -kubeconfig "$admin_kc" -timeout 120s || die "kube-apiserver is not ready; see $logs/kube-apiserver.log"

	start kube-controller-manager "$bin/kube-controller-manager" \
		--kubeconfig="$pki/kube-controller-manager.kubeconfig" \
		--authentication-kubeconfig="$pki/kube-controller-manager.kubeconfig" \
		--authorization-kubeconfig="$pki/kube-controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
		--service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
		--cluster-cidr="$pod_cidr" --service-cluster-ip-range="$service_cidr" \
		--cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key"
	start kube-scheduler "$bin/kube-scheduler" \
		--kubeconfig="$pki/kube-scheduler.kubeconfig" \
		--authentication-kubeconfig="$pki/kube-scheduler.kubeconfig" \
		--authorization-kubeconfig="$pki/kube-scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false

	start containerd PATH="$bin:$PATH" "$bin/containerd" --config "$state/containerd/config.toml"
	wait_for containerd 60 "$bin/ctr" --address "$run/containerd/containerd.sock" version
	import_images

	start kubelet "$bin/kubelet" --config="$state/kubelet/config.yaml" \
		--kubeconfig="$pki/kubelet.kubeconfig" --root-dir="$state/kubelet" \
		--hostname-override="$node" --node-ip="$node_ip"
	# kube-proxy: the gate's fixed clusterIP and the kubernetes Service that
	# in-cluster clients (the gate's informers) dial are ClusterIP paths.
	start kube-proxy "$bin/kube-proxy" --kubeconfig="$pki/kube-proxy.kubeconfig" \
		--hostname-override="$node" --cluster-cidr="$pod_cidr" --proxy-mode=iptables \
		--nodeport-addresses="$node_ip/32" --conntrack-max-per-core=0 \
		--metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256

	"$bin/clustertool" apply -kubeconfig "$admin_kc" deploy/cluster/manifests/*.yaml "$out"/agent-sandbox/*.yaml
	start agent-sandbox-controller KUBECONFIG="$pki/agent-sandbox-controller.kubeconfig" \
		"$bin/agent-sandbox-controller" --extensions --leader-elect=false \
		--metrics-bind-address=127.0.0.1:18080 --health-probe-bind-address=127.0.0.1:18081
	"$bin/clustertool" wait -kubeconfig "$admin_kc" -node "$node" -timeout 120s || die "node $node is not Ready; see $logs/kubelet.log"
	local c exe
	for c in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy agent-sandbox-controller; do
		exe=$(cat "$run/$c.exe" 2>/dev/null) || continue
		case $exe in "$bin"/*) ;; *) log "warning: $c runs $exe, from an older build; to switch: scripts/cluster.sh down && scripts/cluster.sh up" ;; esac
	done
	log "up: started in $(( $(date +%s) - tb )) s ($(( $(date +%s) - t0 )) s with build and set-up); kubeconfig $admin_kc"
}

# --- down -----------------------------------------------------------------

down() {
	local purge=${1:-}
	bin=""
	local exe
	if exe=$(cat "$run/kubelet.exe" 2>/dev/null); then
		bin=$(dirname "$exe")
	fi
	stop agent-sandbox-controller
	stop kube-proxy
	stop kubelet
	if [ -n "$bin" ] && pid_of containerd >/dev/null; then
		# Through the CRI, so containerd runs each pod's CNI DEL.
		"$bin/clustertool" cri-reset -endpoint "$run/containerd/containerd.sock" || log "some pods did not stop cleanly (above)"
	fi
	stop containerd
	# A shim whose pod was not removed (containerd already gone) would keep
	# its pod running: ours are the shims that talk to our containerd and
	# the gVisor sandboxes and gofers under our runsc root.
	local p
	for p in /proc/[0-9]*; do
		if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qE -- "-address $run/containerd/containerd.sock|--root=$run/runsc"; then
			kill -KILL "${p#/proc/}" 2>/dev/null && log "killed a leftover pod process (pid ${p#/proc/})"
		fi
	done
	stop kube-scheduler
	stop kube-controller-manager
	stop kube-apiserver
	stop etcd
	if [ -n "$bin" ] && [ -x "$bin/kube-proxy" ]; then
		"$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
	fi
	# Mounts under the cluster's directories (pods' volumes, containerd's
	# rootfs and shm, network namespaces), deepest first.
	findmnt -rn -o TARGET | { grep -E "^($state|$run)/" || true; } | sort -r | while read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m" || log "cannot unmount $m"
	done
	rm -rf "$run/containerd/netns" "$run/runsc"
	# What a kubelet made before makeIPTablesUtilChains was set, or left
	# when kube-proxy --cleanup could not run.
	local cmd t c
	for cmd in iptables ip6tables; do
		for t in filter nat mangle; do
			for c in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-PROXY-CANARY KUBE-IPTABLES-HINT; do
				"$cmd" -t "$t" -S 2>/dev/null | { grep -E -- "^-A [A-Z]+ .*-j $c\$" || true; } | sed 's/^-A/-D/' |
					while read -r rule; do eval "$cmd -t $t $rule" || true; done
				"$cmd" -t "$t" -F "$c" 2>/dev/null || true
				"$cmd" -t "$t" -X "$c" 2>/dev/null || true
			done
		done
	done
	ip link del "$bridge" 2>/dev/null || true
	ip link del "$node_if" 2>/dev/null || true
	iptables -D FORWARD -j MOAT-CLUSTER 2>/dev/null || true
	iptables -F MOAT-CLUSTER 2>/dev/null || true
	iptables -X MOAT-CLUSTER 2>/dev/null || true
	rm -rf "$state/cni/ipam"
	if [ "$purge" = --purge ]; then
		rm -rf "$state" "$logs"
		log "purged $state and $logs (the build cache $cache stays)"
	fi
	log "down"
}

# --- status ---------------------------------------------------------------

status() {
	local all=0 c pid
	for c in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy agent-sandbox-controller; do
		if pid=$(pid_of "$c"); then
			printf '%-26s up (pid %s)\n' "$c" "$pid"
		else
			printf '%-26s down\n' "$c"
			all=5
		fi
	done
	local exe
	if [ "$all" -eq 0 ] && exe=$(cat "$run/kubelet.exe"); then
		if "$(dirname "$exe")/clustertool" wait -kubeconfig "$admin_kc" -node "$node" -timeout 3s 2>/dev/null; then
			printf '%-26s Ready\n' "node $node"
		else
			printf '%-26s not Ready\n' "node $node"
			all=5
		fi
	fi
	echo "kubeconfig: $admin_kc"
	return "$all"
}

case "${1:-}" in
up) up ;;
down) down "${2:-}" ;;
status) status ;;
*)
	echo "usage: scripts/cluster.sh up|down [--purge]|status" >&2
	exit 2
	;;
esac
