// Package userns lets an unprivileged moat start a child in a user
// namespace of its own, so that the sandbox runs without root.
//
// The child's namespace maps one id inside to the invoking user and
// every other id from 0 to N to the user's subordinate range
// (/etc/subuid; gids the same with /etc/subgid). Which id is the user's
// is the Layout: 0 (RootIsUser: root of the namespace is the user on the
// host, so what the shim and the guest's root write belongs to the user)
// or the user's own id (KeepIDs: a guest process running as the user's
// uid owns the workspace and writes files that belong to the user). The
// other ids exist for the guest: runsc (with directfs, its default) runs
// its sandbox and gofer in a nested namespace with this namespace's map,
// and a file the guest gives an owner that is not mapped cannot be made.
//
// Only the setuid helpers newuidmap and newgidmap (Debian's package
// uidmap) may write such a map for an unprivileged process, and only on a
// process that already exists, so the start has two halves:
//
//	parent (Start)                      child (Wait)
//	clone with CLONE_NEWUSER and the    exec, with every capability of
//	caller's other namespaces           the new namespace kept as ambient
//	newuidmap PID 0 UID 1 SUB N ...     blocks reading the socket
//	newgidmap PID 0 GID 1 SUB N ...
//	"mapped" on the socket ───────────▶ setresuid/gid to 0 (KeepIDs),
//	                                    sets its parent-death signal
//	returns ◀─────────────────────────── "armed" on the socket: goes on
//
// The caller's other namespaces (PID, mount, network) are created by the
// same clone or unshared right after it, after the user namespace, so
// they belong to it: the child can mount /proc and overlays and create
// tap0 in them. A child whose parent dies before the maps are
// written reads EOF and exits: it never runs unmapped; one that dies
// before the child's parent-death signal is set makes its write fail,
// and one that dies after takes the child with it.
//
// The decisions (parsing the subordinate id files, building the maps)
// are pure and in this file and subid.go; the I/O is in the _linux.go
// files beside them.
package userns

import (
	"errors"
	"fmt"
	"sort"
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

// MinSubIDs is the smallest subordinate range moat accepts: every id the
// guest's files may have must be mapped, and a Debian guest has system
// users from 0 up and nobody at 65534, so ids 0..65534 are (one is the
// user, the range gives the others).
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

// Layout is where the user's own id sits in the namespace.
type Layout int

const (
	// RootIsUser maps uid 0 to the user and 1..N to the subordinate
	// range: the namespace's root, and so the shim, runsc and the guest's
	// root, write files that belong to the user, and the user can remove
	// everything the shim made. The guest sees the workspace as root's.
	RootIsUser Layout = iota
	// KeepIDs maps the user's own uid (gid) to itself and every other id
	// from 0 to N to the subordinate range, as rootless engines' "keep
	// id" does: a guest process running as the user's uid sees the
	// workspace as its own and writes files that belong to the user;
	// what the namespace's root writes belongs to the first subordinate
	// id instead.
	KeepIDs
)

// Maps is the map for a user whose own id is id and whose subordinate
// ranges are sub, in the order of the file. The user's id sits at inside
// id 0 (RootIsUser) or id (KeepIDs), and the ranges fill every other
// inside id from 0 up, one after the other. file and user are for the
// errors.
func Maps(layout Layout, id uint32, sub []Range, file, user string) ([]IDMap, error) {
	var total uint64
	for _, r := range sub {
		total += uint64(r.Count)
	}
	if total < MinSubIDs {
		return nil, fmt.Errorf("%w: %s gives %s %d subordinate ids, and moat needs at least %d (the guest's ids up to nobody, 65534, must be mapped); %s",
			ErrNoSubIDs, file, user, total, MinSubIDs, fixSubIDs(user))
	}
	at := uint64(0)
	if layout == KeepIDs {
		at = uint64(id)
		if at > total {
			return nil, fmt.Errorf("%w: %s gives %s %d subordinate ids, too few to keep its id %d in the namespace (ids 0-%d must be mapped); %s",
				ErrNoSubIDs, file, user, total, id, id, fixSubIDs(user))
		}
	}
	maps := []IDMap{{Inside: uint32(at), Outside: id, Count: 1}}
	next := uint64(0)
	for _, r := range sub {
		if id >= r.Start && uint64(id) < uint64(r.Start)+uint64(r.Count) {
			return nil, fmt.Errorf("%w: %s gives %s the range %d-%d, which holds the user's own id %d; give a range that does not: %s",
				ErrNoSubIDs, file, user, r.Start, uint64(r.Start)+uint64(r.Count)-1, id, fixSubIDs(user))
		}
		if next+uint64(r.Count) >= 1<<32-1 {
			return nil, fmt.Errorf("%s gives %s more than 2^32-2 subordinate ids", file, user)
		}
		start, count := uint64(r.Start), uint64(r.Count)
		if next == at {
			next++
		}
		if next < at && next+count > at {
			// The range straddles the user's id: split it around it.
			below := at - next
			maps = append(maps, IDMap{Inside: uint32(next), Outside: uint32(start), Count: uint32(below)})
			start, count, next = start+below, count-below, at+1
		}
		maps = append(maps, IDMap{Inside: uint32(next), Outside: uint32(start), Count: uint32(count)})
		next += count
	}
	if len(maps) > maxExtents {
		return nil, fmt.Errorf("%s has %d ranges for %s; the kernel maps at most %d lines: merge them", file, len(sub), user, maxExtents)
	}
	sort.Slice(maps, func(i, j int) bool { return maps[i].Inside < maps[j].Inside })
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
