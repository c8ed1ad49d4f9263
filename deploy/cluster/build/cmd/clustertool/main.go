// Command clustertool does what scripts/cluster.sh needs of a Go program:
// it makes the test cluster's PKI and kubeconfigs, OCI image archives of
// static binaries, applies manifests and waits for readiness through the
// API (so no kubectl is built), and empties the container runtime of pods
// on the way down.
//
// Usage:
//
//	clustertool pki -dir DIR -node-ip IP
//	clustertool image -name moat.local/pause:1 -binary bin/pause -o pause.tar
//	clustertool apply -kubeconfig KC FILE...
//	clustertool wait -kubeconfig KC [-node NAME] [-timeout 2m]
//	clustertool cri-reset -endpoint /run/moat-cluster/containerd/containerd.sock
package main

import (
	"fmt"
	"os"
)

func main() {
	cmds := map[string]func([]string) error{
		"pki":       runPKI,
		"image":     runImage,
		"apply":     runApply,
		"wait":      runWait,
		"cri-reset": runCRIReset,
	}
	if len(os.Args) < 2 || cmds[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: clustertool pki|image|apply|wait|cri-reset [flags]; see the package doc")
		os.Exit(2)
	}
	if err := cmds[os.Args[1]](os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "clustertool %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
