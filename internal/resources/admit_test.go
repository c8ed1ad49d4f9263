package resources

import (
	"errors"
	"strings"
	"testing"

	"moat.dev/moat/internal/config"
)

func TestReserve(t *testing.T) {
	tests := []struct{ ram, want uint64 }{
		{24 << 30, 6 << 30},
		{8 << 30, 3 << 30},
		{12 << 30, 3 << 30},
		{64 << 30, 16 << 30},
	}
	for _, tc := range tests {
		if got := Reserve(tc.ram); got != tc.want {
			t.Errorf("Reserve(%d GiB) = %d MiB, want %d MiB", tc.ram>>30, got/MiB, tc.want/MiB)
		}
	}
}

func TestAdmit(t *testing.T) {
	const gib = uint64(1 << 30)
	const mib = uint64(MiB)
	two := []Running{{"api", 4 * gib, 512 * mib}, {"web", 2 * gib, 256 * mib}}
	tests := []struct {
		name     string
		ceiling  uint64
		daemon   uint64
		running  []Running
		ram, res uint64
		ok       bool
		mentions []string
	}{
		{"empty host fits", 4 * gib, 0, nil, 24 * gib, 6 * gib, true, nil},
		// 24 GiB less the reserve and the running: 11.25 GiB for the newcomer.
		{"exactly full fits", 11 * gib, 256 * mib, two, 24 * gib, 6 * gib, true, nil},
		{"one byte over refuses", 11*gib + 1, 256 * mib, two, 24 * gib, 6 * gib, false,
			[]string{"api", "memory_max 4 GiB, daemon 512 MiB", "web", "moat down api", "moat down web",
				"256 MiB for its daemon", "memory_max = \"11264MiB\""}},
		// The daemons alone tip it: the ceilings fit, their daemons do not.
		{"daemons count", 12 * gib, 0, []Running{{"api", 4 * gib, 0}, {"web", 2 * gib, 1}}, 24 * gib, 6 * gib, false,
			[]string{"web", "daemon 0 MiB"}},
		{"reserve alone too big", gib, 64 * mib, nil, 4 * gib, 4 * gib, false, []string{"lower memory_max", "moat destroy new"}},
	}
	for _, tc := range tests {
		err := Admit(Running{"new", tc.ceiling, tc.daemon}, tc.running, tc.ram, tc.res)
		if got := err == nil; got != tc.ok {
			t.Errorf("%s: Admit = %v, want ok=%v", tc.name, err, tc.ok)
			continue
		}
		if err != nil && !errors.Is(err, ErrNoRoom) {
			t.Errorf("%s: error %v is not ErrNoRoom", tc.name, err)
		}
		for _, m := range tc.mentions {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: message lacks %q:\n%v", tc.name, m, err)
			}
		}
	}
}

func TestDaemonLimit(t *testing.T) {
	const mib = uint64(MiB)
	tests := []struct {
		name       string
		sandbox    config.Sandbox
		wantDaemon uint64
	}{
		{"derived from the default memory_max", config.Sandbox{}, DaemonLimit(config.Defaults().Sandbox.MemoryMaxBytes)},
		{"derived from memory_max", config.Sandbox{MemoryMaxBytes: 1 << 30}, 128*mib + 64*mib},
		{"derived grows with memory_max", config.Sandbox{MemoryMaxBytes: 16 << 30}, 128*mib + 1024*mib},
		{"configured", config.Sandbox{MemoryMaxBytes: 1 << 30, DaemonMemoryMaxBytes: 100 * mib}, 100 * mib},
		{"configured above memory_max", config.Sandbox{MemoryMaxBytes: 1 << 30, DaemonMemoryMaxBytes: 2 << 30}, 2 << 30},
	}
	for _, tc := range tests {
		if got := FromConfig(tc.sandbox).DaemonBytes; got != tc.wantDaemon {
			t.Errorf("%s: DaemonBytes = %d MiB, want %d MiB", tc.name, got/mib, tc.wantDaemon/mib)
		}
	}
	// The derived limit never falls below the base, whatever memory_max.
	for _, ceiling := range []uint64{0, 64 * mib, 1 << 30} {
		if got := DaemonLimit(ceiling); got < daemonBaseBytes || got < DaemonLimit(0) {
			t.Errorf("DaemonLimit(%d MiB) = %d MiB, below the base", ceiling/mib, got/mib)
		}
	}
	if got, want := GoMemLimit(400*mib), int64(300*mib); got != want {
		t.Errorf("GoMemLimit(400 MiB) = %d, want %d", got, want)
	}
}
