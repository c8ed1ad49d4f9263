package resources

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrNoRoom is what Admit returns (wrapped) when a sandbox does not fit.
var ErrNoRoom = errors.New("not enough memory for another sandbox")

// Running is a sandbox that holds memory now, for admission: the
// ceiling of its guest and the limit of its daemon group, two cgroups
// that each may fill up to its limit without asking.
type Running struct {
	Name         string
	CeilingBytes uint64 // memory_max
	DaemonBytes  uint64 // the daemon group's limit (Limits.DaemonBytes)
}

// total is what r may take: its guest's ceiling and its daemon's limit.
func (r Running) total() uint64 { return r.CeilingBytes + r.DaemonBytes }

// minReserveBytes and the quarter of RAM: the host keeps max(RAM/4, 3 GiB)
// for itself (the desktop, the editor, the build outside).
const minReserveBytes = 3 << 30

// Reserve is the host reserve for a host of ramBytes.
func Reserve(ramBytes uint64) uint64 { return max(ramBytes/4, minReserveBytes) }

// Admit decides whether the sandbox self may start next to running on a
// host of ramBytes that keeps reserveBytes for itself: the limits, its
// own included, plus the reserve must fit in RAM. Limits, not usage: a
// limit is what a sandbox may take at any moment without asking, so only
// limits make the check a promise. Each sandbox counts twice, its guest's
// ceiling and its daemon's limit, since they are two groups (see the
// package doc). The error says what runs, with its limits, and what would
// make room.
func Admit(self Running, running []Running, ramBytes, reserveBytes uint64) error {
	var sum uint64
	for _, r := range running {
		sum += r.total()
	}
	need := sum + self.total() + reserveBytes
	if need <= ramBytes {
		return nil
	}
	name, ceilingBytes := self.Name, self.CeilingBytes
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %q needs %s (its memory_max) and %s for its daemon, but the host has %s of RAM, keeps %s for itself, and running sandboxes may take %s:\n",
		name, FormatMiB(ceilingBytes), FormatMiB(self.DaemonBytes), FormatMiB(ramBytes), FormatMiB(reserveBytes), FormatMiB(sum))
	rs := append([]Running(nil), running...)
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].total() != rs[j].total() {
			return rs[i].total() > rs[j].total()
		}
		return rs[i].Name < rs[j].Name
	})
	for _, r := range rs {
		fmt.Fprintf(&b, "  %-24s memory_max %s, daemon %s\n", r.Name, FormatMiB(r.CeilingBytes), FormatMiB(r.DaemonBytes))
	}
	b.WriteString("to make room, stop one of them:")
	for _, r := range rs {
		fmt.Fprintf(&b, " moat down %s;", r.Name)
	}
	short := need - ramBytes
	b.WriteString("\n")
	// A sandbox keeps the configuration it was created with, so a lower
	// ceiling takes a new sandbox. Lowering memory_max by the shortfall
	// is enough: the derived daemon limit only falls with it.
	if ceilingBytes > short && ceilingBytes-short >= 64*MiB {
		fmt.Fprintf(&b, "or give %q a lower ceiling, memory_max = \"%dMiB\" or less under [sandbox] in moat.toml, and recreate it: moat destroy %s; moat up", name, (ceilingBytes-short)/MiB, name)
	} else {
		fmt.Fprintf(&b, "or give %q a lower memory_max under [sandbox] in moat.toml and recreate it: moat destroy %s; moat up", name, name)
	}
	return fmt.Errorf("%w: %s", ErrNoRoom, b.String())
}
