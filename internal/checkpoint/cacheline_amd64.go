package checkpoint

import "gvisor.dev/gvisor/pkg/cpuid"

// cacheLine: runsc restore refuses another cache line size on amd64
// (CLFLUSH depends on it).
func cacheLine(fs cpuid.FeatureSet) uint32 { return fs.CacheLine() }
