package resources

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
)

// ParsePressure reads the avg10 of the "some" and "full" lines of a PSI
// file (/proc/pressure/memory, a group's memory.pressure):
//
//	some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//	full avg10=0.00 avg60=0.00 avg300=0.00 total=0
func ParsePressure(s string) (some, full float64, err error) {
	seen := 0
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || (f[0] != "some" && f[0] != "full") {
			continue
		}
		v, ok := strings.CutPrefix(f[1], "avg10=")
		if !ok {
			return 0, 0, fmt.Errorf("parsing pressure line %q: no avg10", sc.Text())
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parsing pressure line %q: %w", sc.Text(), err)
		}
		if f[0] == "some" {
			some = x
		} else {
			full = x
		}
		seen++
	}
	if seen == 0 {
		return 0, 0, fmt.Errorf("parsing pressure: no some/full line in %q", s)
	}
	return some, full, nil
}

// ParseMeminfo reads MemTotal and MemAvailable (in bytes) from /proc/meminfo.
func ParseMeminfo(s string) (total, available uint64, err error) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			total = n << 10
		case "MemAvailable:":
			available = n << 10
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("parsing /proc/meminfo: no MemTotal")
	}
	return total, available, nil
}
