package daemon

import (
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"
)

// tasks are the goroutines one of the daemon's processes starts, each
// under a name, so that its shutdown waits for every one of them and can
// say which did not end. A goroutine nobody waits for outlives what it
// uses: the elastic loop wrote to a cgroup the keeper had removed, and a
// link call answered on a socket already closed.
//
// Not a sync.WaitGroup: a goroutine may start another while shutdown
// already waits (a link call arriving as the link ends), which a
// WaitGroup forbids, and a WaitGroup cannot name what is left.
type tasks struct {
	mu      sync.Mutex
	running map[string]int // by name: how many run
	idle    chan struct{}  // closed when the last one ends; nil while none runs
}

// Go runs f in a goroutine counted under name until it returns.
func (t *tasks) Go(name string, f func()) {
	t.mu.Lock()
	if t.running == nil {
		t.running = map[string]int{}
	}
	if len(t.running) == 0 {
		t.idle = make(chan struct{})
	}
	t.running[name]++
	t.mu.Unlock()
	go func() {
		defer t.done(name)
		f()
	}()
}

func (t *tasks) done(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running[name]--; t.running[name] == 0 {
		delete(t.running, name)
	}
	if len(t.running) == 0 {
		close(t.idle)
		t.idle = nil
	}
}

// wait waits up to within for every goroutine to end, and returns the
// names of those still running then, sorted (none: all ended).
func (t *tasks) wait(within time.Duration) []string {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		t.mu.Lock()
		idle := t.idle
		if idle == nil {
			t.mu.Unlock()
			return nil
		}
		t.mu.Unlock()
		select {
		case <-idle:
		case <-deadline.C:
			t.mu.Lock()
			defer t.mu.Unlock()
			return slices.Sorted(maps.Keys(t.running))
		}
	}
}

// Bounds of the wait for a stopping process's goroutines: each has a
// way to stop (a context, a closed socket, a process that exited), so
// one still running after this is stuck, and the process goes on without
// it rather than hang the stop. The gate process's is below the time the
// keeper gives it to exit (gateStopWait), so that it still says which.
const (
	keeperTasksWait = 10 * time.Second
	gateTasksWait   = 3 * time.Second
)

// waitTasks waits up to within for the process's goroutines at shutdown
// and logs the ones that did not end.
func waitTasks(t *tasks, within time.Duration, log *slog.Logger) {
	if left := t.wait(within); len(left) > 0 {
		log.Warn("goroutines still running at shutdown", "after", within, "running", left)
	}
}
