package control

// Resources is Status.resources: the sandbox's cgroup, read when asked.
// Fields are only ever added.
type Resources struct {
	CPUs                int     `json:"cpus"`                  // CPU quota, whole CPUs
	CPUSeconds          float64 `json:"cpu_seconds"`           // CPU time used since start
	MemoryUsageBytes    uint64  `json:"memory_usage_bytes"`    // charged to the sandbox now
	MemoryLimitBytes    uint64  `json:"memory_limit_bytes"`    // current soft limit (elastic)
	MemoryBaselineBytes uint64  `json:"memory_baseline_bytes"` // config memory: the soft limit's floor
	MemoryCeilingBytes  uint64  `json:"memory_ceiling_bytes"`  // config memory_max: the hard limit
	// MemoryPressure is the sandbox's own PSI "some" avg10 in percent;
	// -1 where the host has none (cgroup v1).
	MemoryPressure float64 `json:"memory_pressure"`
	HostPressure   string  `json:"host_pressure"` // calm | between | moderate | high | unknown
	OOMKills       uint64  `json:"oom_kills"`     // processes the kernel's OOM killer took (the sandbox died of it)
	LimitHits      uint64  `json:"limit_hits"`    // times usage reached the ceiling
	Pids           uint64  `json:"pids"`          // host tasks in the sandbox's cgroup
	PidsMax        int     `json:"pids_max"`
	// GuestOOMKills are the guest processes moat killed at the ceiling,
	// the sandbox staying up; LastGuestOOMKill describes the last one.
	GuestOOMKills    int    `json:"guest_oom_kills"`
	LastGuestOOMKill string `json:"last_guest_oom_kill,omitempty"`
	// DaemonMemory*: the cgroup of the sandbox's daemon (its keeper and
	// gate process), beside the sandbox's; absent on a daemon without one.
	DaemonMemoryUsageBytes uint64 `json:"daemon_memory_usage_bytes,omitempty"`
	DaemonMemoryLimitBytes uint64 `json:"daemon_memory_limit_bytes,omitempty"`
}
