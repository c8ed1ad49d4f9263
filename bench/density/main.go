// Command density counts, with moat's own admission code and this host's
// real RAM and reserve, how many sandboxes of one ceiling fit before
// admission refuses the next: what bench/resources.sh compares with the
// memory idle sandboxes really use.
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/resources"
)

func main() {
	ceilingMiB := uint64(256)
	if len(os.Args) > 1 {
		n, err := strconv.ParseUint(os.Args[1], 10, 64)
		if err != nil || n == 0 {
			fmt.Fprintln(os.Stderr, "usage: density [ceiling MiB]")
			os.Exit(2)
		}
		ceilingMiB = n
	}
	ram, err := resources.HostRAM()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	reserve, err := resources.HostReserve(ram)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ceiling := ceilingMiB * resources.MiB
	var running []resources.Running
	for len(running) < 1<<20 {
		next := resources.Running{Name: fmt.Sprintf("s%d", len(running)), CeilingBytes: ceiling, DaemonBytes: resources.DaemonLimit(ceiling)}
		if err := resources.Admit(next, running, ram, reserve); errors.Is(err, resources.ErrNoRoom) {
			break
		}
		running = append(running, next)
	}
	// admitted ram_mib reserve_mib headroom_mib (the hard limit's, default cpus)
	fmt.Println(len(running), ram/resources.MiB, reserve/resources.MiB,
		resources.Headroom(resources.Limits{CPUs: config.Defaults().Sandbox.CPUs})/resources.MiB)
}
