package daemon

import (
	"testing"
	"time"
)

func TestIdleSample(t *testing.T) {
	for _, tt := range []struct {
		name string
		s    idleSample
		want bool
	}{
		{"quiet", idleSample{OK: true, CPU: 0.05, NetBytes: 1024}, true},
		{"not measured", idleSample{OK: false}, false},
		{"session attached", idleSample{OK: true, Sessions: 1}, false},
		{"cpu at the line", idleSample{OK: true, CPU: idleCPU}, false},
		{"cpu under the line", idleSample{OK: true, CPU: idleCPU - 0.01}, true},
		{"network at the line", idleSample{OK: true, NetBytes: idleNetBytes}, false},
		{"network under the line", idleSample{OK: true, NetBytes: idleNetBytes - 1}, true},
	} {
		if got := tt.s.idle(); got != tt.want {
			t.Errorf("%s: idle() = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestIdleClock(t *testing.T) {
	quiet := idleSample{OK: true}
	busy := idleSample{OK: true, Sessions: 1}
	const interval, timeout = time.Minute, 3 * time.Minute
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	// Samples at the end of each minute; want says whether the stop is due.
	steps := []struct {
		s    idleSample
		want bool
	}{
		{quiet, false}, // idle 1 min
		{quiet, false}, // 2
		{busy, false},  // reset
		{quiet, false}, // 1
		{quiet, false}, // 2
		{quiet, true},  // 3: due
		{idleSample{}, false},
		{quiet, false},
	}
	var c idleClock
	for i, st := range steps {
		now := t0.Add(time.Duration(i+1) * interval)
		if got := c.step(now, interval, st.s, timeout); got != st.want {
			t.Errorf("sample %d (%+v): due = %v, want %v", i, st.s, got, st.want)
		}
	}
}

func TestParseStat(t *testing.T) {
	line := []byte("4242 (a (weird) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1000 1000000 200 18446744073709551615")
	ppid, ticks, ok := parseStat(line)
	if !ok || ppid != 17 || ticks != 325 {
		t.Errorf("parseStat = %d, %d, %v; want 17, 325, true", ppid, ticks, ok)
	}
	if _, _, ok := parseStat([]byte("garbage")); ok {
		t.Error("garbage parsed")
	}
}

func TestIdleGate(t *testing.T) {
	var g idleGate
	if !g.enter() {
		t.Fatal("enter refused on an open gate")
	}
	if g.close() {
		t.Fatal("closed with a session attached")
	}
	g.leave()
	if !g.close() {
		t.Fatal("did not close with no session")
	}
	if g.enter() {
		t.Fatal("a session entered a closing sandbox")
	}
}
