package daemon

import (
	"os"
	"runtime/pprof"
)

// ProfileEnv names a file the gate process writes a CPU profile of its
// whole life to (go tool pprof reads it): for finding where the gate's
// time goes under a benchmark. It is created before the process locks
// itself down. Unset: no profiling, no cost.
const ProfileEnv = "MOAT_DAEMON_CPUPROFILE"

// startProfile starts the CPU profile if asked; the returned function
// stops it.
func startProfile() func() {
	path := os.Getenv(ProfileEnv)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}
