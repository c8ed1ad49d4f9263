// Command moat-cni is a chained CNI plugin that fences a gated pod's
// network to moat's gate (internal/gatecni; docs/kubernetes.md, "Egress
// enforced outside the sandbox"). The container runtime runs it after
// the plugin that gives the pod its address; it is a binary of its own
// so that moat links neither the CNI library nor nftables.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"

	"moat.dev/moat/internal/gatecni"
)

func main() {
	skel.PluginMainFuncs(gatecni.Funcs(os.Stderr), gatecni.Versions, "moat-cni: fences a gated pod's network to moat's gate")
}
