//go:build amd64 || arm64

package lockdown

import (
	"fmt"

	"gvisor.dev/gvisor/pkg/bpf"
)

// The filter is compiled when moat is built, not at each start:
// seccomp.Program.Build with its optimisations took about 19 ms and
// allocated 2.2 MB in the gate process, which runs Apply at every start.
// Those allocations alone pushed the process past the Go runtime's
// first collection (at 4 MB), whose bookkeeping then stays resident in
// every idle sandbox (docs/benchmarks.md, "moat's own processes below 20 MiB").
//
// precompiledFilter is the filter built for a stand-in pid
// (precompiledseccomp.Precompile, which builds it for two pids and
// checks that only the pid's words differ), with the indexes of the
// instructions whose K is the pid. TestPrecompiledFilter fails when it
// differs from what the table builds now, and rewrites it with -update.
type precompiledFilter struct {
	instrs []bpf.Instruction
	pidAt  []int
}

// filterFor is the seccomp filter for a process whose pid is pid: the
// precompiled one where this architecture has one, else built now.
func filterFor(pid int) ([]bpf.Instruction, error) {
	if precompiled == nil {
		return buildFilter(pid)
	}
	if pid <= 0 || pid > 1<<31-1 {
		return nil, fmt.Errorf("building seccomp filter: pid %d out of range", pid)
	}
	out := append([]bpf.Instruction(nil), precompiled.instrs...)
	for _, i := range precompiled.pidAt {
		out[i].K = uint32(pid)
	}
	return out, nil
}
