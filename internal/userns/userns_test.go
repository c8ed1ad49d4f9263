package userns

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseSubIDs(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		want    []Range
		errPart string
	}{
		{"by name", "alice:100000:65536\n", []Range{{100000, 65536}}, ""},
		{"by uid", "1001:200000:65536\n", []Range{{200000, 65536}}, ""},
		{"other users skipped", "bob:100000:65536\nalice:165536:65536\n", []Range{{165536, 65536}}, ""},
		{"several ranges in order", "alice:300000:10\nalice:100000:65536\n", []Range{{300000, 10}, {100000, 65536}}, ""},
		{"blank and comment", "\n# ranges\n  \nalice:1:2\n", []Range{{1, 2}}, ""},
		{"none", "bob:100000:65536\n", nil, ""},
		{"empty file", "", nil, ""},
		{"two fields", "alice:100000\n", nil, "/etc/subuid:1: \"alice:100000\" is not USER:START:COUNT"},
		{"four fields", "alice:1:2:3\n", nil, "is not USER:START:COUNT"},
		{"empty name", ":1:2\n", nil, "is not USER:START:COUNT"},
		{"bad start", "alice:x:2\n", nil, "/etc/subuid:1: start \"x\""},
		{"negative start", "alice:-1:2\n", nil, "start \"-1\""},
		{"zero count", "alice:1:0\n", nil, "count \"0\""},
		{"huge count", "alice:1:4294967296\n", nil, "count \"4294967296\""},
		{"overflow", "alice:4294967295:2\n", nil, "goes past the last id"},
		// Another user's broken line fails too: newuidmap would skip it,
		// and moat refuses what it cannot read.
		{"other user's bad line", "bob:1\nalice:1:2\n", nil, "/etc/subuid:1:"},
		{"line number", "alice:1:2\n\nbob:1:x\n", nil, "/etc/subuid:3:"},
	}
	for _, tt := range tests {
		got, err := ParseSubIDs(strings.NewReader(tt.file), "/etc/subuid", "alice", 1001)
		if (err != nil) != (tt.errPart != "") || (err != nil && !strings.Contains(err.Error(), tt.errPart)) {
			t.Errorf("%s: error %v, want one containing %q", tt.name, err, tt.errPart)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestMaps(t *testing.T) {
	tests := []struct {
		name    string
		layout  Layout
		id      uint32
		sub     []Range
		want    []IDMap
		err     error
		errPart string
	}{
		{"one range", RootIsUser, 1001, []Range{{100000, 65536}}, []IDMap{{0, 1001, 1}, {1, 100000, 65536}}, nil, ""},
		{"two ranges", RootIsUser, 1001, []Range{{100000, 40000}, {300000, 30000}},
			[]IDMap{{0, 1001, 1}, {1, 100000, 40000}, {40001, 300000, 30000}}, nil, ""},
		{"exactly enough", RootIsUser, 1001, []Range{{100000, MinSubIDs}}, []IDMap{{0, 1001, 1}, {1, 100000, MinSubIDs}}, nil, ""},
		{"too few", RootIsUser, 1001, []Range{{100000, 1000}}, nil, ErrNoSubIDs, "gives alice 1000 subordinate ids, and moat needs at least 65534"},
		{"none", RootIsUser, 1001, nil, nil, ErrNoSubIDs, "usermod --add-subuids 100000-165535 --add-subgids 100000-165535 alice"},
		{"own id inside", RootIsUser, 100005, []Range{{100000, 65536}}, nil, ErrNoSubIDs, "holds the user's own id 100005"},
		{"keep: user inside the range", KeepIDs, 1001, []Range{{100000, 65536}},
			[]IDMap{{0, 100000, 1001}, {1001, 1001, 1}, {1002, 101001, 64535}}, nil, ""},
		{"keep: split across two ranges", KeepIDs, 1001, []Range{{100000, 1000}, {300000, 65000}},
			[]IDMap{{0, 100000, 1000}, {1000, 300000, 1}, {1001, 1001, 1}, {1002, 300001, 64999}}, nil, ""},
		{"keep: user at a range's boundary", KeepIDs, 1000, []Range{{100000, 1000}, {300000, 65000}},
			[]IDMap{{0, 100000, 1000}, {1000, 1000, 1}, {1001, 300000, 65000}}, nil, ""},
		{"keep: user past the ranges' end", KeepIDs, 65536, []Range{{100000, 65536}},
			[]IDMap{{0, 100000, 65536}, {65536, 65536, 1}}, nil, ""},
		{"keep: too few to reach the user", KeepIDs, 70000, []Range{{100000, 65536}}, nil, ErrNoSubIDs, "too few to keep its id 70000"},
		{"keep: root", KeepIDs, 0, []Range{{100000, 65536}}, []IDMap{{0, 0, 1}, {1, 100000, 65536}}, nil, ""},
	}
	for _, tt := range tests {
		got, err := Maps(tt.layout, tt.id, tt.sub, "/etc/subuid", "alice")
		if (err != nil) != (tt.errPart != "") || (err != nil && !strings.Contains(err.Error(), tt.errPart)) {
			t.Errorf("%s: error %v, want one containing %q", tt.name, err, tt.errPart)
			continue
		}
		if tt.err != nil && !errors.Is(err, tt.err) {
			t.Errorf("%s: error %v is not %v", tt.name, err, tt.err)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestArgs(t *testing.T) {
	got := strings.Join(args(42, []IDMap{{0, 1001, 1}, {1, 100000, 65536}}), " ")
	if want := "42 0 1001 1 1 100000 65536"; got != want {
		t.Errorf("args = %q, want %q", got, want)
	}
}

func FuzzParseSubIDs(f *testing.F) {
	f.Add("alice:100000:65536\n# c\nbob:1:2\n")
	f.Add("1001:4294967294:1")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseSubIDs(strings.NewReader(s), "f", "alice", 1001)
		if err != nil {
			return
		}
		for _, r := range got {
			if r.Count == 0 || uint64(r.Start)+uint64(r.Count) > 1<<32 {
				t.Fatalf("accepted bad range %+v from %q", r, s)
			}
		}
	})
}

// FuzzMaps checks what the kernel will check: no two lines overlap inside
// or outside, the inside ids are 0..N without a gap, and the user's id is
// where the layout puts it.
func FuzzMaps(f *testing.F) {
	f.Add(uint32(1001), uint32(100000), uint32(65536), uint32(300000), uint32(10), true)
	f.Add(uint32(0), uint32(1), uint32(70000), uint32(0), uint32(0), false)
	f.Fuzz(func(t *testing.T, id, s1, c1, s2, c2 uint32, keep bool) {
		sub := []Range{{s1, c1}}
		if c2 > 0 {
			sub = append(sub, Range{s2, c2})
		}
		for _, r := range sub {
			if r.Count == 0 || uint64(r.Start)+uint64(r.Count) > 1<<32 {
				return // ParseSubIDs refuses these
			}
		}
		if c2 > 0 && uint64(s1) < uint64(s2)+uint64(c2) && uint64(s2) < uint64(s1)+uint64(c1) {
			return // overlapping ranges in the file: newuidmap's to refuse
		}
		layout := RootIsUser
		if keep {
			layout = KeepIDs
		}
		maps, err := Maps(layout, id, sub, "f", "u")
		if err != nil {
			return
		}
		next := uint64(0)
		var userAt int64 = -1
		for i, m := range maps {
			if uint64(m.Inside) != next {
				t.Fatalf("line %d starts at %d, want %d: %v", i, m.Inside, next, maps)
			}
			next += uint64(m.Count)
			if m.Outside == id && m.Count == 1 {
				userAt = int64(m.Inside)
			}
			for j, o := range maps[:i] {
				if uint64(m.Outside) < uint64(o.Outside)+uint64(o.Count) && uint64(o.Outside) < uint64(m.Outside)+uint64(m.Count) {
					t.Fatalf("lines %d and %d overlap outside: %v", j, i, maps)
				}
			}
		}
		want := int64(0)
		if keep {
			want = int64(id)
		}
		if userAt != want {
			t.Fatalf("the user's id %d is inside at %d, want %d: %v", id, userAt, want, maps)
		}
		if next < MinSubIDs+1 {
			t.Fatalf("maps cover %d ids, fewer than %d: %v", next, MinSubIDs+1, maps)
		}
	})
}
