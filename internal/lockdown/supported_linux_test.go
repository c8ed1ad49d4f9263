//go:build amd64 || arm64

package lockdown

import (
	"errors"
	"syscall"
	"testing"
)

// Supported agrees with what this test binary is: refused with cgo (go
// test's default where a C compiler exists), accepted without on this
// kernel, which TestJail shows can build the jail.
func TestSupported(t *testing.T) {
	_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_GETPID, 0, 0, 0)
	cgo := errno == syscall.ENOTSUP
	err := Supported()
	if cgo {
		if !errors.Is(err, ErrUnsupported) {
			t.Fatalf("Supported in a cgo binary = %v, want ErrUnsupported", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Supported = %v on a kernel that runs the jail", err)
	}
}
