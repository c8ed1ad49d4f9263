package agent

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestChildrenSharePID1 runs the agent as PID 1 runs it: in a process that
// is the reaper of orphans (a child subreaper, in a copy of the test binary
// so that the setting stays out of the other tests) and reaps on SIGCHLD.
// Every session must still get its exit status, and no zombie may remain.
func TestChildrenSharePID1(t *testing.T) {
	if os.Getenv("MOAT_TEST_SUBREAPER") == "1" {
		testChildrenAsReaper(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildrenSharePID1$", "-test.count=1")
	cmd.Env = append(os.Environ(), "MOAT_TEST_SUBREAPER=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("subreaper run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "\nPASS") && !strings.HasPrefix(string(out), "PASS") {
		t.Fatalf("subreaper run did not pass:\n%s", out)
	}
}

func testChildrenAsReaper(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	children := NewChildren()
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-sigs:
				children.Reap()
			case <-stop:
				return
			}
		}
	}()
	ts := startServer(t, func(s *Server) { s.Children = children })
	c := ts.dial(t)
	// Each command orphans a child that outlives the session's leader by a
	// moment (it escapes the group kill with setsid), so orphans and
	// session leaders exit interleaved.
	for i := range 30 {
		cmd := fmt.Sprintf("setsid sh -c 'sleep 0.0%d' & exit %d", i%10, i%7)
		if got := run(t, c, cmd, nil, nil); got.code != i%7 {
			t.Fatalf("%s: exit %d (%+v), want %d", cmd, got.code, got, i%7)
		}
		if got := run(t, c, "true", nil, nil); got.code != 0 {
			t.Fatalf("true: %+v", got)
		}
	}
	// The orphans have exited by now (the longest sleeps 0.09 s); each must
	// have been reaped.
	for range 100 {
		if zombies(t) == 0 {
			return
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 20e6}, nil)
	}
	t.Errorf("%d zombie children left unreaped", zombies(t))
}

func zombies(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	me := fmt.Sprint(os.Getpid())
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[0] == "Z" && f[1] == me {
			n++
		}
	}
	return n
}
