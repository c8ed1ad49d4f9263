package runtime

import (
	"errors"
	"io/fs"
	"os"
)

// HostKVM says whether this host's /dev/kvm can be opened for reading and
// writing, which is what runsc's KVM platform does first.
func HostKVM() KVM {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	switch {
	case err == nil:
		f.Close()
		return KVM{Usable: true}
	case errors.Is(err, fs.ErrNotExist):
		return KVM{Why: "/dev/kvm does not exist (no hardware virtualisation here, or the kvm module is not loaded)"}
	default:
		return KVM{Why: "/dev/kvm cannot be opened: " + err.Error()}
	}
}
