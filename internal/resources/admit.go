package resources

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrNoRoom is what Admit returns (wrapped) when a sandbox does not fit.
var ErrNoRoom = errors.New("not enough memory for another sandbox")

// Running is a sandbox that holds memory now, for admission.
type Running struct {
	Name         string
	CeilingBytes uint64
}

// minReserveBytes and the quarter of RAM: the host keeps max(RAM/4, 3 GiB)
// for itself (the desktop, the editor, the build outside), per DESIGN §8.
const minReserveBytes = 3 << 30

// Reserve is the host reserve for a host of ramBytes.
func Reserve(ramBytes uint64) uint64 { return max(ramBytes/4, minReserveBytes) }

// Admit decides whether a sandbox named name with ceiling ceilingBytes may
// start next to running on a host of ramBytes that keeps reserveBytes for
// itself: the ceilings, its own included, plus the reserve must fit in RAM.
// Ceilings, not usage: a ceiling is what the sandbox may take at any moment
// without asking, so only ceilings make the check a promise. The error says
// what runs, with its ceiling, and what would make room.
func Admit(name string, ceilingBytes uint64, running []Running, ramBytes, reserveBytes uint64) error {
	var sum uint64
	for _, r := range running {
		sum += r.CeilingBytes
	}
	need := sum + ceilingBytes + reserveBytes
	if need <= ramBytes {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %q needs %s (its memory_max) but the host has %s of RAM, keeps %s for itself, and running sandboxes may take %s:\n",
		name, FormatMiB(ceilingBytes), FormatMiB(ramBytes), FormatMiB(reserveBytes), FormatMiB(sum))
	rs := append([]Running(nil), running...)
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].CeilingBytes != rs[j].CeilingBytes {
			return rs[i].CeilingBytes > rs[j].CeilingBytes
		}
		return rs[i].Name < rs[j].Name
	})
	for _, r := range rs {
		fmt.Fprintf(&b, "  %-24s memory_max %s\n", r.Name, FormatMiB(r.CeilingBytes))
	}
	b.WriteString("to make room, stop one of them:")
	for _, r := range rs {
		fmt.Fprintf(&b, " moat down %s;", r.Name)
	}
	short := need - ramBytes
	b.WriteString("\n")
	// A sandbox keeps the configuration it was created with, so a lower
	// ceiling takes a new sandbox.
	if ceilingBytes > short && ceilingBytes-short >= 64*MiB {
		fmt.Fprintf(&b, "or give %q a lower ceiling, memory_max = \"%dMiB\" or less under [sandbox] in moat.toml, and recreate it: moat destroy %s; moat up", name, (ceilingBytes-short)/MiB, name)
	} else {
		fmt.Fprintf(&b, "or give %q a lower memory_max under [sandbox] in moat.toml and recreate it: moat destroy %s; moat up", name, name)
	}
	return fmt.Errorf("%w: %s", ErrNoRoom, b.String())
}
