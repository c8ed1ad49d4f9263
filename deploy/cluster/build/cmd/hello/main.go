// Command hello is the test cluster's smoke-test image. With no argument it
// prints a greeting and the kernel's log, which under gVisor is gVisor's own
// boot banner ("Starting gVisor...") and under runc is the host kernel's log
// or an error: that difference is how the smoke test tells which runtime ran
// the pod. With "sleep" it waits for SIGTERM, as a long-lived sandbox.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "sleep" {
		fmt.Println("hello: sleeping until SIGTERM")
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		<-sigs
		return
	}
	fmt.Println("hello from the moat test cluster")
	buf := make([]byte, 1<<16)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil {
		fmt.Printf("kernel log: %v\n", err)
		return
	}
	fmt.Printf("kernel log:\n%s\n", buf[:n])
}
