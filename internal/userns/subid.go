package userns

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Files newuidmap and newgidmap read; moat reads them to build the same
// map they will check.
const (
	SubUIDFile = "/etc/subuid"
	SubGIDFile = "/etc/subgid"
)

// ParseSubIDs returns the ranges that r (the content of file, for errors)
// gives to the user called name with id id, in file order. An entry names
// its user or gives the numeric id, as shadow's tools accept both. Any
// line that is not "user:start:count" with decimal numbers, count ≥ 1 and
// no overflow is an error naming the file and line: newuidmap would skip
// it, and a range moat did not see is worse than a clear refusal. Blank
// lines and lines starting with # are skipped.
func ParseSubIDs(r io.Reader, file, name string, id uint32) ([]Range, error) {
	sc := bufio.NewScanner(r)
	idStr := strconv.FormatUint(uint64(id), 10)
	var out []Range
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) != 3 || f[0] == "" {
			return nil, fmt.Errorf("%s:%d: %q is not USER:START:COUNT; fix or remove the line", file, n, line)
		}
		start, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: start %q is not a number from 0 to 4294967295; fix or remove the line", file, n, f[1])
		}
		count, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || count == 0 {
			return nil, fmt.Errorf("%s:%d: count %q is not a number from 1 to 4294967295; fix or remove the line", file, n, f[2])
		}
		if start+count > 1<<32 {
			return nil, fmt.Errorf("%s:%d: the range %d+%d goes past the last id 4294967295; fix or remove the line", file, n, start, count)
		}
		if f[0] == name || f[0] == idStr {
			out = append(out, Range{Start: uint32(start), Count: uint32(count)})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	return out, nil
}
