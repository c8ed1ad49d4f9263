package resources

import (
	"errors"
	"strings"
	"testing"
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
	two := []Running{{"api", 4 * gib}, {"web", 2 * gib}}
	tests := []struct {
		name     string
		ceiling  uint64
		running  []Running
		ram, res uint64
		ok       bool
		mentions []string
	}{
		{"empty host fits", 4 * gib, nil, 24 * gib, 6 * gib, true, nil},
		{"exactly full fits", 12 * gib, two, 24 * gib, 6 * gib, true, nil},
		{"one byte over refuses", 12*gib + 1, two, 24 * gib, 6 * gib, false,
			[]string{"api", "memory_max 4 GiB", "web", "moat down api", "moat down web", "memory_max = \"12288MiB\""}},
		{"reserve alone too big", gib, nil, 4 * gib, 4 * gib, false, []string{"lower memory_max", "moat destroy new"}},
	}
	for _, tc := range tests {
		err := Admit("new", tc.ceiling, tc.running, tc.ram, tc.res)
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
