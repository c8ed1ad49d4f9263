package guest

import "testing"

func TestPickVictim(t *testing.T) {
	procs := []Proc{
		{PID: 1, PPID: 0, Comm: "init", RSSKiB: 900000},
		{PID: 10, PPID: 1, Comm: "sh", RSSKiB: 2000},
		{PID: 11, PPID: 10, Comm: "python3", RSSKiB: 700000},
		{PID: 12, PPID: 10, Comm: "node", RSSKiB: 300000},
		{PID: 20, PPID: 1, Comm: "sudo", RSSKiB: 4000},
		{PID: 21, PPID: 20, Comm: "moat", RSSKiB: 800000},
		{PID: 30, PPID: 1, Comm: "protected", RSSKiB: 950000, OOMScoreAdj: -1000},
		{PID: 40, PPID: 1, Comm: "kthread-like", RSSKiB: 0},
	}
	tests := []struct {
		name   string
		procs  []Proc
		spare  map[int]bool
		want   int
		wantOK bool
	}{
		{"largest, sparing init, the killer's chain and -1000", procs, Ancestors(procs, 21), 11, true},
		{"the killer's chain spared even when largest", procs, map[int]bool{21: true}, 11, true},
		{"nothing spared but init", procs, nil, 21, true},
		{"only init and the killer", []Proc{procs[0], procs[4], procs[5]}, Ancestors(procs, 21), 0, false},
		{"a tie goes to the younger", []Proc{{PID: 5, RSSKiB: 10}, {PID: 7, RSSKiB: 10}, {PID: 6, RSSKiB: 10}}, nil, 7, true},
		{"no processes", nil, nil, 0, false},
	}
	for _, tt := range tests {
		got, ok := PickVictim(tt.procs, tt.spare)
		if ok != tt.wantOK || (ok && got.PID != tt.want) {
			t.Errorf("%s: got pid %d ok %v, want pid %d ok %v", tt.name, got.PID, ok, tt.want, tt.wantOK)
		}
	}
}

func TestAncestors(t *testing.T) {
	procs := []Proc{{PID: 1}, {PID: 5, PPID: 1}, {PID: 9, PPID: 5}, {PID: 3, PPID: 3}}
	got := Ancestors(procs, 9)
	for _, pid := range []int{9, 5, 1} {
		if !got[pid] {
			t.Errorf("Ancestors(9) = %v, lacks %d", got, pid)
		}
	}
	if len(got) != 3 {
		t.Errorf("Ancestors(9) = %v, want 9, 5 and 1", got)
	}
	if got := Ancestors(procs, 3); len(got) != 1 {
		t.Errorf("a self-parented pid loops: %v", got)
	}
}
