package netstack

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// tapLink is the stack's link endpoint on the TAP fd.
//
// gVisor's fdbased endpoint would do the job, but its dispatcher parks an OS
// thread in ppoll(2) and hands every frame to processor goroutines. In Go
// that costs, for each burst of frames, the runtime's sysmon noticing the
// blocked thread, handing its P to another thread and waking that thread,
// and then a second wake-up for the processor: three or four context
// switches before the stack sees a frame. On the machines moat runs on
// (virtualised, two cores shared with the guest) a context switch costs tens
// of microseconds and a wake-up under load up to a scheduler tick, and this
// path is walked by every DNS answer, every SYN and every ACK of a
// download. Here a goroutine reads the fd through Go's netpoller instead: a
// frame wakes one thread, which reads every frame that is queued and runs
// the stack on each right there. Writes stay fdbased's: a non-blocking
// writev(2) per frame from whichever goroutine sends.
type tapLink struct {
	*ethernet.Endpoint
	inj *fdbased.InjectableEndpoint
	f   *os.File
	wg  sync.WaitGroup
}

// frameMax is the largest frame on tap0: MTU plus the Ethernet header.
const frameMax = MTU + header.EthernetMinimumSize

// smallFrame: frames up to this size (ACKs, DNS, handshakes) are copied
// out of the read buffer into a buffer of their size; larger ones keep the
// read buffer, and the next read gets a fresh one.
const smallFrame = 2048

func newTAPLink(fd int) (*tapLink, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("setting tap fd non-blocking: %w", err)
	}
	// Checksums are neither computed nor checked in either direction:
	// frames go between two stacks through a local fd, and the guest's
	// runsc is told the same (--tx-checksum-offload).
	inj, err := fdbased.NewInjectable(fd, frameMax, stack.CapabilityRXChecksumOffload|stack.CapabilityTXChecksumOffload)
	if err != nil {
		return nil, fmt.Errorf("creating tap endpoint: %w", err)
	}
	l := &tapLink{Endpoint: ethernet.New(inj), inj: inj}
	l.SetLinkAddress(GatewayMAC)
	// A non-blocking fd given to os.NewFile is registered with the
	// runtime's poller (epoll), so reads park a goroutine, not a thread.
	l.f = os.NewFile(uintptr(fd), "tap0")
	return l, nil
}

// start reads frames until the fd is closed. Call it once the NIC exists.
func (l *tapLink) start(onErr func(error)) error {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return fmt.Errorf("tap fd: %w", err)
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		var rerr error
		big := buffer.NewViewSize(frameMax)
		err := rc.Read(func(fd uintptr) bool {
			for {
				b := big.AsSlice()
				n, err := rawRead(int(fd), b)
				switch {
				case err == unix.EAGAIN:
					return false // wait for the poller
				case err == unix.EINTR:
					continue
				case err != 0:
					rerr = err
					return true
				case n == 0:
					rerr = errors.New("tap fd closed")
					return true
				}
				var v *buffer.View
				if n <= smallFrame {
					v = buffer.NewViewWithData(b[:n])
				} else {
					v = big
					v.CapLength(n)
					big = buffer.NewViewSize(frameMax)
				}
				pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithView(v)})
				// The Ethernet endpoint parses the header and
				// passes the frame up by its EtherType.
				l.inj.InjectInbound(0, pkt)
				pkt.DecRef()
			}
		})
		big.Release()
		if rerr == nil {
			rerr = err
		}
		if rerr != nil && !errors.Is(rerr, os.ErrClosed) && onErr != nil {
			onErr(rerr)
		}
	}()
	return nil
}

// rawRead is read(2) on a non-blocking fd without telling the Go scheduler:
// the call never blocks, and a syscall the scheduler knows of wakes its
// sysmon thread when the process was idle, which then polls every 20 µs for
// as long as there is work — more context switches, on every query.
func rawRead(fd int, b []byte) (int, unix.Errno) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(n), e
}

// close stops the reader and closes the fd. The stack must be closed
// first: writes use the fd's number.
func (l *tapLink) close() {
	l.f.Close()
	l.wg.Wait()
}
