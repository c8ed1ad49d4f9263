package agent

import (
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/termtest"
)

// ptyShell starts an interactive login shell on a 24x80 PTY and returns the
// session, a writer that types into it, and its output.
func ptyShell(t *testing.T, c *ssh.Client) (*ssh.Session, io.Writer, *termtest.Screen) {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	if err := sess.RequestPty("xterm", 24, 80, nil); err != nil {
		t.Fatal(err)
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &termtest.Screen{}
	sess.Stdout = out
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	return sess, stdin, out
}

// Commands typed below compute their markers with $((...)) so that the
// terminal's echo of the input line can never satisfy WaitFor.

func TestPTY(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.RequestPty("xterm-test", 24, 80, nil); err != nil {
		t.Fatal(err)
	}
	out, err := sess.Output(`tty; echo "term=$TERM"; echo err >&2`)
	if err != nil {
		t.Fatal(err)
	}
	// One stream with a pty: stderr arrives in stdout, lines end in \r\n.
	want := regexp.MustCompile(`^/dev/pts/\d+\r\nterm=xterm-test\r\nerr\r\n$`)
	if !want.Match(out) {
		t.Errorf("output = %q, want match for %s", out, want)
	}
}

func TestWindowChange(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	sess, stdin, out := ptyShell(t, c)
	io.WriteString(stdin, "stty size; echo done$((1+1))\n")
	if s := out.WaitFor(t, "done2", 2*time.Second); !strings.Contains(s, "24 80") {
		t.Fatalf("initial size missing from %q", s)
	}
	// want-reply, unlike Session.WindowChange, so the resize has happened
	// before the next command is typed.
	ok, err := sess.SendRequest("window-change", true, ssh.Marshal(struct{ Cols, Rows, Width, Height uint32 }{100, 40, 0, 0}))
	if err != nil || !ok {
		t.Fatalf("window-change = %v, %v", ok, err)
	}
	io.WriteString(stdin, "stty size; echo done$((2+2))\n")
	if s := out.WaitFor(t, "done4", 2*time.Second); !strings.Contains(s, "40 100") {
		t.Errorf("resized size missing from %q", s)
	}
}

func TestInterrupt(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	sess, stdin, out := ptyShell(t, c)
	io.WriteString(stdin, "echo started$((1+1)); sleep 30; echo not$((3+3))\n")
	out.WaitFor(t, "started2", 2*time.Second)
	time.Sleep(100 * time.Millisecond) // let sleep start; an earlier ^C aborts the line too
	io.WriteString(stdin, "\x03")
	// The tty flushes pending input on ^C; type the next line only once
	// the shell is back at its prompt.
	time.Sleep(200 * time.Millisecond)
	io.WriteString(stdin, "echo after$((2+2))\n")
	s := out.WaitFor(t, "after4", 2*time.Second)
	if strings.Contains(s, "not6") {
		t.Errorf("^C let the rest of the line run: %q", s)
	}
	io.WriteString(stdin, "exit 0\n")
	if err := waitTimeout(t, sess, 2*time.Second); err != nil {
		t.Errorf("shell exit = %v, want status 0", err)
	}
}

// A job-control shell puts background jobs in process groups of their own;
// the session sweep must still kill them when the shell exits.
func TestPTYBackgroundJobKilled(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	sess, stdin, out := ptyShell(t, c)
	io.WriteString(stdin, "sleep 300 & echo bg=$!; echo x$((1+1))\n")
	s := out.WaitFor(t, "x2", 2*time.Second)
	m := regexp.MustCompile(`bg=(\d+)`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no background pid in %q", s)
	}
	pid, _ := strconv.Atoi(m[1])
	io.WriteString(stdin, "exit 0\n")
	if err := waitTimeout(t, sess, 2*time.Second); err != nil {
		t.Errorf("shell exit = %v, want status 0", err)
	}
	waitGone(t, []int{pid}, time.Second)
}
