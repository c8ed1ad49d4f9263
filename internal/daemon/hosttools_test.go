package daemon

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// niceOf is a process's nice value, from /proc/PID/stat (the field after
// its priority).
func niceOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command's name is in parentheses and may hold spaces: fields
	// count from after it.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	n, err := strconv.Atoi(f[16])
	if err != nil {
		t.Fatalf("/proc/%d/stat: nice %q: %v", pid, f[16], err)
	}
	return n
}

// started waits until h runs a tool it did not run before, and returns
// its pid.
func (h *hostTools) started(t *testing.T, before map[int]bool) int {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		h.mu.Lock()
		for pid := range h.running {
			if !before[pid] {
				h.mu.Unlock()
				return pid
			}
		}
		h.mu.Unlock()
	}
	t.Fatal("the tool did not start within 5 s")
	return 0
}

func TestHostToolsHurry(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("raising a process's CPU priority again needs root (CAP_SYS_NICE)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	defer func() {
		cancel() // kills the tools (exec.CommandContext)
		for i := 0; i < 2; i++ {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Error("a tool outlived its context by 5 s")
				return
			}
		}
	}()
	// The keeper's tools, hurried by the gate process's call.
	d := &daemon{}
	h := &d.tools
	run := func() {
		h.run(ctx, "sleep", "30")
		done <- struct{}{}
	}
	go run()
	first := h.started(t, nil)
	if n := niceOf(t, first); n != 19 {
		t.Errorf("a tool before any connection waits for it: nice %d, want 19 (the lowest priority)", n)
	}
	if _, _, err := d.serveGate(context.Background(), "hurry", nil); err != nil {
		t.Fatalf("the keeper's hurry: %v", err)
	}
	if n := niceOf(t, first); n != 0 {
		t.Errorf("the running tool after hurry: nice %d, want 0", n)
	}
	go run()
	second := h.started(t, map[int]bool{first: true})
	if n := niceOf(t, second); n != 0 {
		t.Errorf("a tool started after hurry: nice %d, want 0", n)
	}
}
