package resources

// Elastic memory: what a sandbox's soft limit should be, from samples of
// the host's and the sandbox's memory pressure. Pure: the daemon's loop
// (elastic_linux.go) takes the samples and applies the result.

// HostSample is the host's memory pressure: /proc/pressure/memory and
// MemAvailable from /proc/meminfo.
type HostSample struct {
	SomeAvg10      float64 // % of the last 10 s in which some task stalled on memory
	FullAvg10      float64 // % in which all non-idle tasks stalled
	AvailableBytes uint64
	TotalBytes     uint64
}

// GuestSample is one sandbox's memory state.
type GuestSample struct {
	// SomeAvg10 is the group's own memory.pressure; negative when the
	// host cannot tell (cgroup v1 has no per-group PSI).
	SomeAvg10     float64
	UsageBytes    uint64
	BaselineBytes uint64
	CeilingBytes  uint64
	SoftBytes     uint64 // the current soft limit; 0 means the ceiling
}

// Level is the host's memory pressure, coarsely.
type Level int

const (
	// Calm: the host has plenty; sandboxes get their ceilings back.
	Calm Level = iota
	// Between: neither calm nor under pressure; nothing moves unless a
	// sandbox needs room.
	Between
	// Moderate: soft limits go down to 3/4 of the ceiling.
	Moderate
	// High: soft limits go down to 1/2 of the ceiling.
	High
)

func (l Level) String() string {
	return [...]string{"calm", "between", "moderate", "high"}[l]
}

// The thresholds. PSI "some" avg10 is the share of the last 10 s in which
// at least one task waited for memory; a healthy host sits at 0, and a host
// whose working set just stops fitting shows a few percent. 10 % means a
// tenth of wall time lost somewhere to reclaim or refaults: moderate. 40 %
// "some", or 10 % "full" (every task stalled at once, the desktop freezes),
// is high: that is where systemd-oomd and Android's lmkd start acting. Free
// memory is the second signal, because PSI only rises once reclaim is
// already slow: under 10 % of RAM available is moderate, under 5 % high.
// Calm needs both "some" under 1 % and at least 20 % available, so a host
// hovering near a threshold does not make soft limits flap.
const (
	moderateSomePct   = 10
	highSomePct       = 40
	highFullPct       = 10
	calmSomePct       = 1
	moderateAvailPct  = 10
	highAvailPct      = 5
	calmAvailPct      = 20
	guestSomePct      = 10 // a sandbox whose own "some" is past this needs room
	guestUsagePermill = 900
)

// MinSoftBytes is the floor of every soft limit: below 512 MiB a guest
// with a language server and a compiler thrashes instead of working.
const MinSoftBytes = 512 * MiB

// HostLevel classifies a host sample.
func HostLevel(h HostSample) Level {
	availPct := 100.0
	if h.TotalBytes > 0 {
		availPct = float64(h.AvailableBytes) * 100 / float64(h.TotalBytes)
	}
	switch {
	case h.SomeAvg10 >= highSomePct || h.FullAvg10 >= highFullPct || availPct < highAvailPct:
		return High
	case h.SomeAvg10 >= moderateSomePct || availPct < moderateAvailPct:
		return Moderate
	case h.SomeAvg10 < calmSomePct && availPct >= calmAvailPct:
		return Calm
	}
	return Between
}

// UnderPressure tells whether the sandbox needs more room: its own PSI
// where the host has it (v2), else its usage at 90 % of its soft limit or
// more (v1 has no per-group PSI; a group pressed against its soft limit is
// the closest sign).
func (g GuestSample) UnderPressure() bool {
	if g.SomeAvg10 >= 0 {
		return g.SomeAvg10 >= guestSomePct
	}
	soft := g.SoftBytes
	if soft == 0 {
		soft = g.CeilingBytes
	}
	return soft > 0 && g.UsageBytes*1000 >= soft*guestUsagePermill
}

// Floor is the lowest soft limit the sandbox may get: its baseline, and
// never under MinSoftBytes, but never over its ceiling either.
func (g GuestSample) Floor() uint64 {
	return min(max(g.BaselineBytes, MinSoftBytes), g.CeilingBytes)
}

// Target is the sandbox's new soft limit.
//
//   - Host under pressure (moderate or high): the soft limit comes down to
//     3/4 (moderate) or 1/2 (high) of the ceiling, never raised, even for a
//     sandbox under its own pressure: the host comes first, that is the
//     point of the feature.
//   - Otherwise, a sandbox under its own pressure gets room back up to its
//     ceiling.
//   - Host calm: every sandbox gets its ceiling back, which is what ends
//     an episode of pressure.
//   - Host between calm and pressure, sandbox not pressed: nothing moves.
//
// Always within [Floor, ceiling].
func Target(h HostSample, g GuestSample) uint64 {
	cur := g.SoftBytes
	if cur == 0 || cur > g.CeilingBytes {
		cur = g.CeilingBytes
	}
	var t uint64
	switch lvl := HostLevel(h); {
	case lvl == High:
		t = min(cur, g.CeilingBytes/2)
	case lvl == Moderate:
		t = min(cur, g.CeilingBytes/4*3)
	case g.UnderPressure(), lvl == Calm:
		t = g.CeilingBytes
	default:
		t = cur
	}
	return max(t, g.Floor())
}
