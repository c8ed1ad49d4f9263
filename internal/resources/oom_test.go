package resources

import (
	"testing"
	"time"
)

func TestGuardWait(t *testing.T) {
	tests := []struct {
		name           string
		usage, ceiling uint64
		cpus           int
		want           time.Duration
	}{
		{"idle 4 GiB ceiling: the longest wait", 100 * MiB, 4 << 30, 4, guardMax},
		{"at the ceiling", 640 * MiB, 640 * MiB, 1, guardMin},
		{"over the ceiling", 700 * MiB, 640 * MiB, 1, guardMin},
		{"128 MiB away on one CPU: half a second", 512 * MiB, 640 * MiB, 1, 500 * time.Millisecond},
		{"128 MiB away on four CPUs: an eighth", 512 * MiB, 640 * MiB, 4, 125 * time.Millisecond},
		{"1 MiB away: the shortest", 639 * MiB, 640 * MiB, 4, guardMin},
		{"zero cpus counts as one", 512 * MiB, 640 * MiB, 0, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := GuardWait(tt.usage, tt.ceiling, tt.cpus); got != tt.want {
			t.Errorf("%s: GuardWait(%d MiB, %d MiB, %d) = %v, want %v", tt.name, tt.usage/MiB, tt.ceiling/MiB, tt.cpus, got, tt.want)
		}
	}
}

func TestHeadroom(t *testing.T) {
	tests := []struct {
		cpus int
		want uint64
	}{
		{1, 192 * MiB}, {2, 256 * MiB}, {4, 512 * MiB}, {8, 1024 * MiB}, {0, 192 * MiB},
	}
	for _, tt := range tests {
		if got := Headroom(Limits{CPUs: tt.cpus}); got != tt.want {
			t.Errorf("Headroom(cpus %d) = %d MiB, want %d MiB", tt.cpus, got/MiB, tt.want/MiB)
		}
	}
}
