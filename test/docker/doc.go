// Package docker tests runtime = "docker" through the moat binary, as a
// user types it, against a real Docker engine: the topology, that every
// name is the gate's to answer, that no direct way out is left, the
// positive control through the gate, and the guest's exit codes and
// reaping.
//
// It needs root and a Docker engine: scripts/test.sh runs
// scripts/docker.sh first (which installs Debian's docker.io and starts
// dockerd) and says how that went in MOAT_DOCKER ("ready", "fail: WHY"
// or "skip: WHY"). A failed set-up fails these tests with its reason; a
// host without apt-get at all skips them, loudly.
package docker
