package resources

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// ParsePressure reads the avg10 of the "some" and "full" lines of a PSI
// file (/proc/pressure/memory, a group's memory.pressure):
//
//	some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//	full avg10=0.00 avg60=0.00 avg300=0.00 total=0
func ParsePressure(s string) (some, full float64, err error) {
	seen := 0
	for rest := s; rest != ""; {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		kind, tail := field(line)
		avg, _ := field(tail)
		if avg == "" || (kind != "some" && kind != "full") {
			continue
		}
		v, ok := strings.CutPrefix(avg, "avg10=")
		if !ok {
			return 0, 0, fmt.Errorf("parsing pressure line %q: no avg10", strings.TrimSuffix(line, "\r"))
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parsing pressure line %q: %w", strings.TrimSuffix(line, "\r"), err)
		}
		if kind == "some" {
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
	for rest := s; rest != ""; {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		key, tail := field(line)
		num, _ := field(tail)
		if num == "" {
			continue
		}
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			continue
		}
		switch key {
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

// field is the first whitespace-separated field of s, as strings.Fields
// splits it, and what follows it. The parsers above run in the daemon's
// loops every few seconds for a sandbox's whole life: they split in place,
// where a scanner and strings.Fields for each line were most of what an
// idle daemon allocated.
func field(s string) (f, rest string) {
	s = strings.TrimLeftFunc(s, unicode.IsSpace)
	if i := strings.IndexFunc(s, unicode.IsSpace); i >= 0 {
		return s[:i], s[i:]
	}
	return s, ""
}
