package lockdown

import (
	"strings"
	"testing"
)

// jailedStatus is the part of /proc/<pid>/status Verify reads, as Apply
// leaves it for uid and gid 1000.
const jailedStatus = `Name:	gate
Umask:	0022
State:	S (sleeping)
Uid:	1000	1000	1000	1000
Gid:	1000	1000	1000	1000
FDSize:	64
Groups:	
NoNewPrivs:	1
Seccomp:	2
Seccomp_filters:	1
CapInh:	0000000000000000
CapPrm:	0000000000000000
CapEff:	0000000000000000
CapBnd:	0000000000000000
CapAmb:	0000000000000000
`

func TestCheckStatus(t *testing.T) {
	tests := []struct {
		name    string
		replace [2]string
		want    string // a substring of the one problem, "" for none
	}{
		{"jailed", [2]string{"", ""}, ""},
		{"saved uid root", [2]string{"Uid:	1000	1000	1000	1000", "Uid:	1000	1000	0	1000"}, "Uid"},
		{"other uid", [2]string{"Uid:	1000	1000	1000	1000", "Uid:	1001	1001	1001	1001"}, "Uid"},
		{"gid root", [2]string{"Gid:	1000	1000	1000	1000", "Gid:	0	0	0	0"}, "Gid"},
		{"groups kept", [2]string{"Groups:	", "Groups:	0 27"}, "Groups"},
		{"bounding set kept", [2]string{"CapBnd:	0000000000000000", "CapBnd:	000001ffffffffff"}, "CapBnd"},
		{"inheritable kept", [2]string{"CapInh:	0000000000000000", "CapInh:	0000000000000400"}, "CapInh"},
		{"ambient kept", [2]string{"CapAmb:	0000000000000000", "CapAmb:	0000000000000001"}, "CapAmb"},
		{"no nnp", [2]string{"NoNewPrivs:	1", "NoNewPrivs:	0"}, "NoNewPrivs"},
		{"no filter", [2]string{"Seccomp:	2", "Seccomp:	0"}, "Seccomp"},
		{"strict mode", [2]string{"Seccomp:	2", "Seccomp:	1"}, "Seccomp"},
		{"field missing", [2]string{"CapAmb:	0000000000000000\n", ""}, "CapAmb missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status := jailedStatus
			if tt.replace[0] != "" {
				if !strings.Contains(status, tt.replace[0]) {
					t.Fatalf("fixture lacks %q", tt.replace[0])
				}
				status = strings.Replace(status, tt.replace[0], tt.replace[1], 1)
			}
			got := checkStatus([]byte(status), 1000, 1000)
			if tt.want == "" {
				if len(got) != 0 {
					t.Fatalf("problems %v in a jailed status", got)
				}
				return
			}
			if len(got) != 1 || !strings.Contains(got[0], tt.want) {
				t.Fatalf("got %v, want one problem about %s", got, tt.want)
			}
		})
	}
}

func TestCheckRoot(t *testing.T) {
	tests := []struct {
		name, mountinfo string
		ok              bool
	}{
		{"jailed", "900 899 0:62 / / ro,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755\n" +
			"901 900 8:1 /tmp/x /tmp/x rw,nosuid,nodev,noexec - ext4 /dev/sda1 rw\n", true},
		{"host root", "24 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n", false},
		{"writable tmpfs", "900 899 0:62 / / rw,nosuid - tmpfs tmpfs rw\n", false},
		{"jail covered by a writable mount", "900 899 0:62 / / ro - tmpfs tmpfs rw\n" +
			"950 900 0:70 / / rw - tmpfs tmpfs rw\n", false},
		{"no root", "901 900 8:1 /tmp/x /tmp/x rw - ext4 /dev/sda1 rw\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkRoot([]byte(tt.mountinfo)); (got == "") != tt.ok {
				t.Fatalf("checkRoot = %q, want ok=%v", got, tt.ok)
			}
		})
	}
}
