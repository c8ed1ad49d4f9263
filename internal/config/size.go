package config

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// sizeUnits maps each accepted unit, lower-cased, to its multiplier.
// K, M, G and T are binary, as in docker's --memory; KB, MB, GB and TB are
// decimal, as on a disk label. Units are case-insensitive because "1gib"
// and "512mb" are meant exactly as written and refusing them helps no one.
var sizeUnits = map[string]uint64{
	"":    1,
	"b":   1,
	"k":   1 << 10,
	"kib": 1 << 10,
	"m":   1 << 20,
	"mib": 1 << 20,
	"g":   1 << 30,
	"gib": 1 << 30,
	"t":   1 << 40,
	"tib": 1 << 40,
	"kb":  1e3,
	"mb":  1e6,
	"gb":  1e9,
	"tb":  1e12,
}

// ParseSize reads a size such as "512MiB", "2G" or "1000000": a whole
// number of bytes with an optional unit (B, KiB, MiB, GiB, TiB, the binary
// K, M, G, T, or the decimal KB, MB, GB, TB). Fractions are refused rather
// than rounded, so "1.5GiB" is written "1536MiB" and means exactly that.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	unit := strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if i == 0 || !ok {
		hint := `write e.g. "512MiB" or "2GiB"`
		if strings.ContainsAny(t, ".,") {
			hint = `sizes are whole numbers; write e.g. "1536MiB" instead of "1.5GiB"`
		}
		return 0, &Error{Msg: fmt.Sprintf("%q is not a size; %s", s, hint)}
	}
	n, err := strconv.ParseUint(t[:i], 10, 64)
	hi, v := bits.Mul64(n, mult)
	if err != nil || hi != 0 {
		return 0, &Error{Msg: fmt.Sprintf("%q is too large", s)}
	}
	return v, nil
}

// FormatSize writes n in the largest binary unit that holds it exactly
// ("1GiB", "1536MiB", "1000B"), so ParseSize(FormatSize(n)) == n.
func FormatSize(n uint64) string {
	for _, u := range []struct {
		name string
		mult uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatUint(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}

// minIdle: the idle watchdog samples once a minute (docs/resources.md), so a
// shorter timeout could not be honoured; refusing it beats pretending.
const minIdle = time.Minute

// parseIdle reads idle_timeout: a Go duration of at least a minute, or
// "off". It returns 0 for "off", which no valid duration can be.
func parseIdle(s string) (time.Duration, error) {
	if s == "off" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, &Error{Msg: fmt.Sprintf(`%q is not a duration; write e.g. "30m", "2h" or "off"`, s)}
	}
	if d < minIdle {
		return 0, &Error{Msg: fmt.Sprintf(`%q is shorter than the minimum of 1m (idle is sampled once a minute); write at least "1m", or "off" to never stop`, s)}
	}
	return d, nil
}
