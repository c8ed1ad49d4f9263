// Command hello is the test cluster's smoke-test image. With no argument it
// prints a greeting and the kernel's log, which under gVisor is gVisor's own
// boot banner ("Starting gVisor...") and under runc is the host kernel's log
// or an error: that difference is how the smoke test tells which runtime ran
// the pod. With "sleep" it waits for SIGTERM, as a long-lived sandbox; with
// "dial HOST:PORT" it opens a TCP connection and says whether it could.
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

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
	if len(os.Args) > 2 && os.Args[1] == "dial" {
		conn, err := net.DialTimeout("tcp", os.Args[2], 10*time.Second)
		if err != nil {
			fmt.Printf("dial %s: %v\n", os.Args[2], err)
			os.Exit(1)
		}
		conn.Close()
		fmt.Printf("dial %s: connected\n", os.Args[2])
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
