package resources

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The v2 notifier's mechanism, on an ordinary file: cgroup v2 reports a
// change of memory.events as a modification of the file, as a write does
// here. (This host's memory controller is on v1, so the real file cannot be
// watched in the tests.)
func TestWatchModified(t *testing.T) {
	path := filepath.Join(t.TempDir(), "memory.events")
	if err := os.WriteFile(path, []byte("low 0\nhigh 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := watchModified(path)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()

	start := time.Now()
	if n.Wait(100 * time.Millisecond) {
		t.Fatal("the notifier fired with no change to the file")
	}
	if d := time.Since(start); d < 90*time.Millisecond || d > 2*time.Second {
		t.Errorf("an unanswered wait took %v, want about its 100 ms timeout", d)
	}

	// One write, as the kernel's one notification per change (a
	// truncating rewrite would be two modifications).
	go func() {
		time.Sleep(50 * time.Millisecond)
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err == nil {
			f.WriteAt([]byte("1"), int64(len("low 0\nhigh ")))
			f.Close()
		}
	}()
	start = time.Now()
	if !n.Wait(5 * time.Second) {
		t.Fatal("the notifier did not fire when the file changed")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the notifier fired %v after the change", d)
	}
	// Drained: the next wait times out again.
	if n.Wait(100 * time.Millisecond) {
		t.Error("the notifier fired again without a new change")
	}
	if _, err := watchModified(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("watching a missing file did not fail")
	}
}
