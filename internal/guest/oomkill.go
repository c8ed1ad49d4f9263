package guest

// The guest's side of moat's OOM kill (resources/oom.go): the daemon, which
// sees the sandbox's cgroup reach the memory ceiling, sends the agent an
// OOMKillRequest, and PID 1 kills the process holding the most memory, as
// the kernel's OOM killer would inside a VM. In process, because a fork
// and exec at that moment would compete for the sandbox's CPU quota with
// the very allocation it must stop (a `sudo moat` session took a second).

// OOMKillRequest is the SSH global request that asks for one OOM kill.
const OOMKillRequest = "oomkill@moat.dev"

// Proc is one guest process, as OOMKill sees it in /proc.
type Proc struct {
	PID, PPID   int
	Comm        string
	RSSKiB      uint64
	OOMScoreAdj int
	State       string // the first letter of /proc/PID/status State: R, S, Z...
}

// PickVictim chooses the process to kill: the largest resident set, never
// PID 1 (init, with the agent inside: killing it ends the sandbox), never
// a process in spare (the killer itself and its ancestors, the session
// that runs it), never one with oom_score_adj -1000 (what the kernel
// treats as unkillable). Ties go to the higher pid, the younger process.
// ok is false when there is nothing to kill.
func PickVictim(procs []Proc, spare map[int]bool) (victim Proc, ok bool) {
	for _, p := range procs {
		if p.PID <= 1 || spare[p.PID] || p.OOMScoreAdj <= -1000 || p.RSSKiB == 0 {
			continue
		}
		if !ok || p.RSSKiB > victim.RSSKiB || (p.RSSKiB == victim.RSSKiB && p.PID > victim.PID) {
			victim, ok = p, true
		}
	}
	return victim, ok
}

// Ancestors are pid and its ancestors in procs, for PickVictim's spare.
func Ancestors(procs []Proc, pid int) map[int]bool {
	parent := make(map[int]int, len(procs))
	for _, p := range procs {
		parent[p.PID] = p.PPID
	}
	out := map[int]bool{}
	for i := 0; pid > 0 && !out[pid] && i <= len(procs); i++ {
		out[pid] = true
		pid = parent[pid]
	}
	return out
}
