package gateserve

import (
	"bytes"
	"strings"
	"sync"
)

// syncBuffer is a log sink safe for the service's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lines is what was written, a line each.
func (s *syncBuffer) lines() []string {
	return strings.Split(strings.TrimSpace(s.String()), "\n")
}
