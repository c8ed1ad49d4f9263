package gateserve

import (
	"strings"

	"moat.dev/moat/internal/termtest"
)

// lines is what was written to s, a line each.
func lines(s *termtest.Screen) []string {
	return strings.Split(strings.TrimSpace(s.String()), "\n")
}
