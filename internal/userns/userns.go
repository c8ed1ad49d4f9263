// Package userns lets an unprivileged moat start a child in a user
// namespace of its own, so that the sandbox runs without root.
//
// The child's namespace maps uid 0 inside to the invoking user and uids
// 1..N inside to the user's subordinate range (/etc/subuid; gids the same
// with /etc/subgid). Root of the namespace is then the user on the host:
// what it writes in the workspace belongs to the user, and what it cannot
// do as the user it cannot do at all. The other N ids exist because
// runsc needs them: its sandbox and gofer run as nobody (65534) inside.
//
// Only the setuid helpers newuidmap and newgidmap (Debian's package
// uidmap) may write such a map for an unprivileged process, and only on a
// process that already exists, so the start has two halves:
//
//	parent (Start)                      child (Wait)
//	clone with CLONE_NEWUSER and the    exec, with every capability of
//	caller's other namespaces           the new namespace kept as ambient
//	newuidmap PID 0 UID 1 SUB N ...     blocks reading the sync pipe
//	newgidmap PID 0 GID 1 SUB N ...
//	writes one byte on the pipe  ──────▶ uid 0, gid 0: goes on
//
// The mount and network namespaces are created by the same clone, after
// the user namespace, so they belong to it: the child can mount overlays
// and create tap0 in them. A child whose parent dies before the maps are
// written reads EOF and exits: it never runs unmapped.
//
// The decisions (parsing the subordinate id files, building the maps)
// are pure and in this file and subid.go; the I/O is in the _linux.go
// files beside them.
package userns

import (
	"errors"
	"fmt"
	"strconv"
)

// Errors a caller can match with errors.Is; each error returned wraps one
// of them and says what to do.
var (
	// ErrNoSubIDs: the user has no (or too small a) subordinate range.
	ErrNoSubIDs = errors.New("no subordinate id range")
	// ErrNoIDMapTool: newuidmap or newgidmap is missing or not privileged.
	ErrNoIDMapTool = errors.New("newuidmap/newgidmap not usable")
	// ErrDisabled: the host does not let this user create user namespaces.
	ErrDisabled = errors.New("user namespaces are not allowed")
)

// MinSubIDs is the smallest subordinate range moat accepts: runsc runs
// its sandbox and gofer as nobody (65534) of the namespace, so ids up to
// 65534 must be mapped (0 is the user, 1..65534 come from the range).
const MinSubIDs = 65534

// Range is one entry of /etc/subuid or /etc/subgid: Count host ids from
// Start.
type Range struct {
	Start, Count uint32
}

// IDMap is one line of /proc/PID/uid_map (or gid_map): Count ids from
// Inside in the namespace are Outside.. on the host.
type IDMap struct {
	Inside, Outside, Count uint32
}

// maxExtents is the kernel's limit on lines in one uid_map (since 4.15).
const maxExtents = 340

// Maps is the map for a user whose own id is id and whose subordinate
// ranges are sub, in the order of the file: id as 0, then the ranges one
// after the other from 1. file and user are for the errors.
func Maps(id uint32, sub []Range, file, user string) ([]IDMap, error) {
	var total uint64
	for _, r := range sub {
		total += uint64(r.Count)
	}
	if total < MinSubIDs {
		return nil, fmt.Errorf("%w: %s gives %s %d subordinate ids, and moat needs at least %d (runsc runs as nobody, 65534, inside the namespace); %s",
			ErrNoSubIDs, file, user, total, MinSubIDs, fixSubIDs(user))
	}
	if len(sub)+1 > maxExtents {
		return nil, fmt.Errorf("%s has %d ranges for %s; the kernel maps at most %d: merge them", file, len(sub), user, maxExtents-1)
	}
	maps := []IDMap{{Inside: 0, Outside: id, Count: 1}}
	next := uint64(1)
	for _, r := range sub {
		if id >= r.Start && uint64(id) < uint64(r.Start)+uint64(r.Count) {
			return nil, fmt.Errorf("%w: %s gives %s the range %d-%d, which holds the user's own id %d; give a range that does not: %s",
				ErrNoSubIDs, file, user, r.Start, uint64(r.Start)+uint64(r.Count)-1, id, fixSubIDs(user))
		}
		if next+uint64(r.Count) > 1<<32-1 {
			return nil, fmt.Errorf("%s gives %s more than 2^32-2 subordinate ids", file, user)
		}
		maps = append(maps, IDMap{Inside: uint32(next), Outside: r.Start, Count: r.Count})
		next += uint64(r.Count)
	}
	return maps, nil
}

// args are newuidmap's (or newgidmap's) arguments for pid.
func args(pid int, maps []IDMap) []string {
	a := []string{strconv.Itoa(pid)}
	for _, m := range maps {
		a = append(a, strconv.FormatUint(uint64(m.Inside), 10), strconv.FormatUint(uint64(m.Outside), 10), strconv.FormatUint(uint64(m.Count), 10))
	}
	return a
}

func fixSubIDs(user string) string {
	return fmt.Sprintf("as root, give the user a range no other user has, e.g.: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 %s", user)
}
