package resources

import "testing"

func TestHostLevel(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name string
		h    HostSample
		want Level
	}{
		{"idle host", HostSample{0, 0, 20 * gib, 24 * gib}, Calm},
		{"no meminfo total counts as plenty", HostSample{0, 0, 0, 0}, Calm},
		{"a little stall", HostSample{2, 0, 20 * gib, 24 * gib}, Between},
		{"calm PSI but 15% available", HostSample{0, 0, 24 * gib * 15 / 100, 24 * gib}, Between},
		{"some at moderate threshold", HostSample{10, 0, 20 * gib, 24 * gib}, Moderate},
		{"available under 10%", HostSample{0, 0, 24 * gib * 9 / 100, 24 * gib}, Moderate},
		{"some at high threshold", HostSample{40, 0, 20 * gib, 24 * gib}, High},
		{"full at high threshold", HostSample{5, 10, 20 * gib, 24 * gib}, High},
		{"available under 5%", HostSample{0, 0, 24 * gib * 4 / 100, 24 * gib}, High},
	}
	for _, tc := range tests {
		if got := HostLevel(tc.h); got != tc.want {
			t.Errorf("%s: HostLevel(%+v) = %v, want %v", tc.name, tc.h, got, tc.want)
		}
	}
}

func TestTarget(t *testing.T) {
	const gib = uint64(1 << 30)
	calm := HostSample{0, 0, 20 * gib, 24 * gib}
	between := HostSample{3, 0, 20 * gib, 24 * gib}
	moderate := HostSample{15, 0, 20 * gib, 24 * gib}
	high := HostSample{50, 20, 20 * gib, 24 * gib}
	// A v2 sandbox: 1 GiB baseline, 4 GiB ceiling.
	g := func(soft uint64, psi float64, usage uint64) GuestSample {
		return GuestSample{SomeAvg10: psi, UsageBytes: usage, BaselineBytes: gib, CeilingBytes: 4 * gib, SoftBytes: soft}
	}
	// A v1 sandbox (no PSI): pressure is usage at 90% of the soft limit.
	v1 := func(soft, usage uint64) GuestSample {
		return GuestSample{SomeAvg10: -1, UsageBytes: usage, BaselineBytes: gib, CeilingBytes: 4 * gib, SoftBytes: soft}
	}
	tests := []struct {
		name string
		h    HostSample
		g    GuestSample
		want uint64
	}{
		{"calm, at ceiling: stays", calm, g(4*gib, 0, gib), 4 * gib},
		{"calm, lowered earlier: ceiling back", calm, g(2*gib, 0, gib), 4 * gib},
		{"calm, soft unset means ceiling", calm, g(0, 0, gib), 4 * gib},
		{"between, not pressed: nothing moves", between, g(3*gib, 0, gib), 3 * gib},
		{"between, at ceiling: nothing moves", between, g(4*gib, 0, gib), 4 * gib},
		{"between, own pressure: ceiling", between, g(2*gib, 25, gib), 4 * gib},
		{"between, own pressure just under threshold", between, g(2*gib, 9.9, gib), 2 * gib},
		{"moderate: 3/4 of ceiling", moderate, g(4*gib, 0, gib), 3 * gib},
		{"moderate after high: not raised", moderate, g(2*gib, 0, gib), 2 * gib},
		{"moderate, own pressure: host first", moderate, g(4*gib, 50, gib), 3 * gib},
		{"moderate, own pressure below 3/4: raised to 3/4", moderate, g(2*gib, 50, gib), 2 * gib},
		{"high: 1/2 of ceiling", high, g(4*gib, 0, gib), 2 * gib},
		{"high from moderate", high, g(3*gib, 0, gib), 2 * gib},
		{"v1 calm", calm, v1(2*gib, 0), 4 * gib},
		{"v1 between, usage at 91% of soft: ceiling", between, v1(2*gib, 2*gib*91/100), 4 * gib},
		{"v1 between, usage at 80%: nothing", between, v1(2*gib, 2*gib*8/10), 2 * gib},
		{"soft above ceiling is the ceiling", between, g(8*gib, 0, gib), 4 * gib},
		// Floors.
		{"high never below baseline", high, GuestSample{SomeAvg10: 0, BaselineBytes: 3 * gib, CeilingBytes: 4 * gib, SoftBytes: 4 * gib}, 3 * gib},
		{"high never below 512 MiB", high, GuestSample{SomeAvg10: 0, BaselineBytes: 256 * MiB, CeilingBytes: 768 * MiB, SoftBytes: 768 * MiB}, 512 * MiB},
		{"ceiling under 512 MiB: floor is the ceiling", high, GuestSample{SomeAvg10: 0, BaselineBytes: 256 * MiB, CeilingBytes: 256 * MiB, SoftBytes: 256 * MiB}, 256 * MiB},
		{"fixed size never moves", high, GuestSample{SomeAvg10: 0, BaselineBytes: 2 * gib, CeilingBytes: 2 * gib, SoftBytes: 2 * gib}, 2 * gib},
		{"below floor is raised to it", between, GuestSample{SomeAvg10: 0, BaselineBytes: gib, CeilingBytes: 4 * gib, SoftBytes: 100 * MiB}, gib},
	}
	for _, tc := range tests {
		if got := Target(tc.h, tc.g); got != tc.want {
			t.Errorf("%s: Target = %d MiB, want %d MiB", tc.name, got/MiB, tc.want/MiB)
		}
	}
}

func TestParsePressure(t *testing.T) {
	tests := []struct {
		in         string
		some, full float64
		err        bool
	}{
		{"some avg10=1.50 avg60=0.00 avg300=0.00 total=10\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=1\n", 1.5, 0.25, false},
		{"some avg10=12.00 avg60=0.00 avg300=0.00 total=10\n", 12, 0, false},
		{"", 0, 0, true},
		{"some avg10=x\n", 0, 0, true},
	}
	for _, tc := range tests {
		some, full, err := ParsePressure(tc.in)
		if (err != nil) != tc.err || some != tc.some || full != tc.full {
			t.Errorf("ParsePressure(%q) = %v, %v, %v; want %v, %v, err %v", tc.in, some, full, err, tc.some, tc.full, tc.err)
		}
	}
}

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		in               string
		total, available uint64
		err              bool
	}{
		{"MemTotal:       24684416 kB\nMemFree:         1000 kB\nMemAvailable:   18000000 kB\n", 24684416 << 10, 18000000 << 10, false},
		{"  MemAvailable: 2 kB\r\nMemTotal:\t4 kB", 4 << 10, 2 << 10, false}, // any spacing, no final newline
		{"MemTotal: x kB\nMemTotal:\nMemTotal: 8 kB\n", 8 << 10, 0, false},   // bad lines skipped
		{"MemFree: 1 kB\n", 0, 0, true},
		{"", 0, 0, true},
	}
	for _, tc := range tests {
		total, available, err := ParseMeminfo(tc.in)
		if (err != nil) != tc.err || total != tc.total || available != tc.available {
			t.Errorf("ParseMeminfo(%q) = %v, %v, %v; want %v, %v, err %v", tc.in, total, available, err, tc.total, tc.available, tc.err)
		}
	}
}

// The elastic loop parses both files every few seconds for a sandbox's
// whole life: what they allocate is an idle daemon's garbage.
func TestParsersDoNotAllocate(t *testing.T) {
	meminfo := "MemTotal:       24684416 kB\nMemFree:         1000 kB\nMemAvailable:   18000000 kB\nBuffers:          500 kB\n"
	psi := "some avg10=1.50 avg60=0.00 avg300=0.00 total=10\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=1\n"
	if n := testing.AllocsPerRun(100, func() { ParseMeminfo(meminfo) }); n != 0 {
		t.Errorf("ParseMeminfo: %v allocations a call, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { ParsePressure(psi) }); n != 0 {
		t.Errorf("ParsePressure: %v allocations a call, want 0", n)
	}
}
