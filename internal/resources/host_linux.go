package resources

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Environment knobs. MOAT_HOST_RESERVE_MIB is for users; the MOAT_TEST_
// ones exist so that tests can drive admission and elastic memory with
// real cgroups on a host whose real RAM and pressure they cannot choose.
const (
	EnvReserve   = "MOAT_HOST_RESERVE_MIB"   // host reserve in MiB, instead of max(RAM/4, 3 GiB)
	EnvTestRAM   = "MOAT_TEST_HOST_RAM_MIB"  // test knob: the host's RAM in MiB, instead of /proc/meminfo
	EnvTestPSI   = "MOAT_TEST_PSI_FILE"      // test knob: a file read instead of /proc/pressure/memory
	EnvTestTick  = "MOAT_TEST_ELASTIC_EVERY" // test knob: the elastic loop's period, a Go duration
	EnvTestGuard = "MOAT_TEST_OOM_GUARD"     // benchmark knob: "off", or the OOM guard's fixed period (a Go duration)
)

// HostRAM is the host's physical RAM in bytes.
func HostRAM() (uint64, error) {
	if v := os.Getenv(EnvTestRAM); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return 0, fmt.Errorf("%s=%q is not a size in MiB; unset it or write e.g. %s=4096", EnvTestRAM, v, EnvTestRAM)
		}
		return n * MiB, nil
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("reading the host's RAM size: %w", err)
	}
	total, _, err := ParseMeminfo(string(b))
	return total, err
}

// HostReserve is the memory the host keeps for itself: MOAT_HOST_RESERVE_MIB
// if set, else Reserve(ram).
func HostReserve(ram uint64) (uint64, error) {
	v := os.Getenv(EnvReserve)
	if v == "" {
		return Reserve(ram), nil
	}
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a size in MiB; write e.g. %s=2048", EnvReserve, v, EnvReserve)
	}
	return n * MiB, nil
}

// lockPath is host-wide, not under a MOAT_HOME: RAM is the host's, so
// every moat on the host takes its turn at admission.
const lockPath = "/run/moat/admission.lock"

// LockHost takes the host-wide admission lock, waiting for it. The holder
// checks admission and starts its sandbox's daemon, whose group then holds
// the memory, before releasing it, so two `moat up` never both see room
// that only one of them can have.
func LockHost() (func(), error) { return LockAt(lockPath) }

// LockAt is LockHost with the lock at path: rootless moat cannot write
// /run/moat, and takes its turn among the user's own sandboxes only (its
// state dir's lock).
func LockAt(lockPath string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", filepath.Dir(lockPath), err)
	}
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the admission lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("taking the admission lock %s: %w", lockPath, err)
	}
	return func() { f.Close() }, nil
}

// SampleHost reads the host's memory pressure and MemAvailable. The
// pressure comes from MOAT_TEST_PSI_FILE when set (tests induce pressure
// that way); a host without PSI (CONFIG_PSI off, or psi=0) reads as zero
// pressure, and MemAvailable alone then decides.
func SampleHost() (HostSample, error) {
	var h HostSample
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return h, fmt.Errorf("reading /proc/meminfo: %w", err)
	}
	if h.TotalBytes, h.AvailableBytes, err = ParseMeminfo(string(b)); err != nil {
		return h, err
	}
	psi := "/proc/pressure/memory"
	if p := os.Getenv(EnvTestPSI); p != "" {
		psi = p
	}
	if b, err := os.ReadFile(psi); err == nil {
		h.SomeAvg10, h.FullAvg10, err = ParsePressure(string(b))
		if err != nil {
			return h, err
		}
	}
	return h, nil
}
