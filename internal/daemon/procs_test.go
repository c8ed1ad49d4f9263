package daemon

import "testing"

func TestServingProcs(t *testing.T) {
	for _, tc := range []struct {
		cpus int
		env  string
		want int
	}{
		{2, "", 1},
		{4, "", 1},
		{1, "", 1},
		{5, "", 0},  // more cores: every processor kept
		{32, "", 0}, //
		{2, "2", 0}, // the user's GOMAXPROCS wins
		{2, "1", 0}, // set already: nothing to do
	} {
		if got := servingProcsFor(tc.cpus, tc.env); got != tc.want {
			t.Errorf("servingProcsFor(%d, %q) = %d, want %d", tc.cpus, tc.env, got, tc.want)
		}
	}
}
