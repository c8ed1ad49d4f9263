package runtime

import (
	"errors"
	"fmt"
)

// gVisor's platforms moat runs on: how the Sentry intercepts the guest's
// system calls. KVM runs the guest in a hardware virtual machine and is
// much faster where the host has /dev/kvm; systrap (seccomp traps) works
// everywhere, including in VMs without nested virtualisation.
const (
	PlatformAuto    = "auto"
	PlatformSystrap = "systrap"
	PlatformKVM     = "kvm"
)

// KVM is what the host offers: whether /dev/kvm can be used, and if not,
// why (for the error and for moat doctor).
type KVM struct {
	Usable bool
	Why    string // when not usable: "/dev/kvm does not exist", ...
}

// ErrNoKVM is the error when the configuration asks for KVM and the host
// has none.
var ErrNoKVM = errors.New("platform kvm is not available")

// ChoosePlatform is the platform runsc gets for want ("" is "auto"):
// auto takes KVM when the host offers it, else systrap; kvm without KVM
// is an error that says why and what to write instead.
func ChoosePlatform(want string, kvm KVM) (string, error) {
	switch want {
	case "", PlatformAuto:
		if kvm.Usable {
			return PlatformKVM, nil
		}
		return PlatformSystrap, nil
	case PlatformSystrap:
		return PlatformSystrap, nil
	case PlatformKVM:
		if !kvm.Usable {
			return "", fmt.Errorf("%w: %s; set [sandbox] platform = \"auto\" (or \"systrap\") in moat.toml, or give moat access to /dev/kvm", ErrNoKVM, kvm.Why)
		}
		return PlatformKVM, nil
	}
	return "", fmt.Errorf("unknown platform %q; write \"auto\", \"systrap\" or \"kvm\"", want)
}
