// Command pause is the test cluster's pod sandbox image: the process that
// holds a pod's namespaces while its containers come and go. It does what
// Kubernetes' own pause does, built here because the cluster has no
// registry to pull that image from: it waits for SIGTERM or SIGINT, and as
// PID 1 of a pod that shares its PID namespace it reaps orphans.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
