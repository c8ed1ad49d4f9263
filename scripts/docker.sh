#!/usr/bin/env bash
# Test-only: makes a Docker engine available for test/docker. Installs
# Debian's docker.io when dockerd is missing, starts dockerd in the
# background when nothing answers on its socket (these machines have no
# systemd as PID 1, so no unit would start it), and waits for the socket.
# Safe to run again: each step is skipped when already done.
#
# Never part of a user's set-up: moat talks to whatever Docker engine the
# user already runs.
#
# Exit codes: 0 ready; 3 no apt-get on this host (the caller skips docker
# tests loudly); anything else is a failure whose reason is on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

log=/var/log/moat-dockerd.log
pidfile=/run/moat-dockerd.pid
sock=/var/run/docker.sock

if [ "$(id -u)" -ne 0 ]; then
	echo "docker.sh: run as root (it installs packages and starts dockerd): sudo $0" >&2
	exit 4
fi

start=$(date +%s)
if ! command -v dockerd >/dev/null; then
	if ! command -v apt-get >/dev/null; then
		echo "docker.sh: no dockerd and no apt-get on this host; install a Docker engine by hand to run test/docker" >&2
		exit 3
	fi
	echo "docker.sh: installing docker.io" >&2
	apt-get update -qq
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/tmp/moat-docker-apt.log 2>&1; then
		tail -20 /tmp/moat-docker-apt.log >&2
		echo "docker.sh: apt-get install docker.io failed (log: /tmp/moat-docker-apt.log)" >&2
		exit 1
	fi
fi

# runsc, as built by scripts/setup.sh (bin/runsc), is registered as the
# runtime "runsc", so that test/docker can run the workload on it
# (MOAT_DOCKER_RUNTIME=runsc) as well as on runc. The file is rewritten
# when it names another runsc (a clone elsewhere), and a running dockerd
# reloads it on SIGHUP. Its one flag is what moat doctor tells users to
# register it with: --overlay2=none, so that the workload's writes land in
# Docker's writable layer and outlive a stop, as on runc (gVisor's default
# keeps them in the sandbox, gone when it exits).
runtimes_json() {
	printf '{\n  "runtimes": {\n    "runsc": {\n      "path": "%s",\n      "runtimeArgs": ["--overlay2=none"]\n    }\n  }\n}\n' "$PWD/bin/runsc"
}
reload=
if [ -x bin/runsc ]; then
	mkdir -p /etc/docker
	if [ "$(cat /etc/docker/daemon.json 2>/dev/null)" != "$(runtimes_json)" ]; then
		runtimes_json >/etc/docker/daemon.json
		reload=1
	fi
else
	echo "docker.sh: no bin/runsc (scripts/setup.sh builds it); runsc is not registered with Docker" >&2
fi

up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if ! up; then
	if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
		echo "docker.sh: dockerd (pid $(cat "$pidfile")) is starting; waiting" >&2
	else
		modprobe overlay 2>/dev/null || true
		modprobe br_netfilter 2>/dev/null || true
		# setsid: dockerd outlives this script and ignores the caller's
		# terminal signals; its own containerd is started by it.
		setsid dockerd --pidfile "$pidfile" >>"$log" 2>&1 </dev/null &
		echo "docker.sh: started dockerd (log: $log)" >&2
		reload=
	fi
	for _ in $(seq 1 120); do
		up && break
		sleep 0.5
	done
	if ! up; then
		tail -20 "$log" >&2 || true
		echo "docker.sh: dockerd did not answer on $sock within 60 s (log: $log)" >&2
		exit 1
	fi
fi
if [ -n "$reload" ] && [ -s "$pidfile" ]; then
	# dockerd reads daemon.json's runtimes again on SIGHUP.
	kill -HUP "$(cat "$pidfile")"
	for _ in $(seq 1 40); do
		docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null | grep -qw runsc && break
		sleep 0.25
	done
fi
echo "docker.sh: docker $(docker version --format '{{.Server.Version}}') ready in $(( $(date +%s) - start )) s; runtimes: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}')" >&2
