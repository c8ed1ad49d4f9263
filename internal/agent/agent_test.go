package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/termtest"
)

// testServer is a Server listening on 127.0.0.1 for the duration of a test.
type testServer struct {
	srv    *Server
	addr   string
	client ssh.Signer // the authorized key
	host   ssh.PublicKey
	cancel context.CancelFunc
	done   chan error // Serve's result
}

func newSigner(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startServer runs a Server as the current user (so no credential change),
// with mod applied before it starts.
func startServer(t *testing.T, mod func(*Server)) *testServer {
	t.Helper()
	host, client := newSigner(t), newSigner(t)
	home := t.TempDir()
	srv := &Server{
		HostKey:       host,
		AuthorizedKey: client.PublicKey(),
		UID:           os.Getuid(),
		GID:           os.Getgid(),
		Home:          home,
		Shell:         "/bin/sh",
		Dir:           home,
		Env:           []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "USER=agent", "TERM=dumb", "LANG=C.UTF-8"},
		Log:           slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, addr: ln.Addr().String(), client: client, host: host.PublicKey(), cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ts.done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
	return ts
}

func (ts *testServer) dialWith(t *testing.T, key ssh.Signer) (*ssh.Client, error) {
	t.Helper()
	return ssh.Dial("tcp", ts.addr, &ssh.ClientConfig{
		User:            "agent",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: ssh.FixedHostKey(ts.host),
		Timeout:         2 * time.Second,
	})
}

func (ts *testServer) dial(t *testing.T) *ssh.Client {
	t.Helper()
	c, err := ts.dialWith(t, ts.client)
	if err != nil {
		t.Fatalf("dialing agent: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type result struct {
	stdout, stderr string
	code           int
	signal         string
}

// run executes command over a fresh session without a PTY.
func run(t *testing.T, c *ssh.Client, command string, stdin io.Reader, env map[string]string) result {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	for k, v := range env {
		if err := sess.Setenv(k, v); err != nil {
			t.Fatalf("Setenv(%s): %v", k, err)
		}
	}
	var stdout, stderr bytes.Buffer
	sess.Stdin, sess.Stdout, sess.Stderr = stdin, &stdout, &stderr
	err = sess.Run(command)
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *ssh.ExitError
	switch {
	case errors.As(err, &ee):
		r.code, r.signal = ee.ExitStatus(), ee.Signal()
	case err != nil:
		t.Fatalf("running %q: %v", command, err)
	}
	return r
}

func TestExitStatus(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	tests := []struct {
		command    string
		wantCode   int
		wantSignal string
	}{
		{"exit 0", 0, ""},
		{"exit 7", 7, ""},
		{"true", 0, ""},
		{"kill -KILL $$", 128 + 9, "KILL"},
		{"kill -TERM $$", 128 + 15, "TERM"},
	}
	for _, tt := range tests {
		t.Run(tt.command, func(t *testing.T) {
			got := run(t, c, tt.command, nil, nil)
			if got.code != tt.wantCode || got.signal != tt.wantSignal {
				t.Errorf("code, signal = %d, %q; want %d, %q", got.code, got.signal, tt.wantCode, tt.wantSignal)
			}
		})
	}
}

func TestOutputStreams(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	// 200 KB through stdout checks that everything is flushed before
	// exit-status, not just the first pipe buffer.
	got := run(t, c, "echo out; echo err >&2; head -c 200000 /dev/zero | tr '\\0' x", nil, nil)
	if want := "out\n" + strings.Repeat("x", 200000); got.stdout != want {
		t.Errorf("stdout = %.40q... (%d bytes), want %d bytes", got.stdout, len(got.stdout), len(want))
	}
	if got.stderr != "err\n" {
		t.Errorf("stderr = %q, want %q", got.stderr, "err\n")
	}
}

func TestStdin(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	tests := []struct {
		command, stdin, want string
	}{
		{"cat", "hello\nworld\n", "hello\nworld\n"},
		{"wc -l", "a\nb\nc\n", "3\n"},
		{"cat; echo eof", "", "eof\n"}, // EOF reaches the command
	}
	for _, tt := range tests {
		t.Run(tt.command, func(t *testing.T) {
			got := run(t, c, tt.command, strings.NewReader(tt.stdin), nil)
			if strings.TrimSpace(got.stdout) != strings.TrimSpace(tt.want) || got.code != 0 {
				t.Errorf("stdout, code = %q, %d; want %q, 0", got.stdout, got.code, tt.want)
			}
		})
	}
}

func TestEnvironment(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	dir := t.TempDir()
	tests := []struct {
		name    string
		command string
		env     map[string]string
		want    string
	}{
		{"base", `echo "$USER $LANG"`, nil, "agent C.UTF-8"},
		{"client var", `echo "$FOO"`, map[string]string{"FOO": "bar baz"}, "bar baz"},
		{"client overrides base", `echo "$USER"`, map[string]string{"USER": "other"}, "other"},
		{"default dir", "pwd", nil, ts.srv.Dir},
		{"MOAT_CWD", "pwd", map[string]string{cwdEnv: dir}, dir},
		{"MOAT_CWD consumed", `echo "[$MOAT_CWD]"`, map[string]string{cwdEnv: dir}, "[]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := run(t, c, tt.command, nil, tt.env)
			if strings.TrimSpace(got.stdout) != tt.want || got.code != 0 {
				t.Errorf("stdout, code = %q, %d; want %q, 0 (stderr %q)", got.stdout, got.code, tt.want, got.stderr)
			}
		})
	}
}

func TestMissingWorkingDirectory(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	missing := filepath.Join(t.TempDir(), "gone")
	got := run(t, c, "echo ran", nil, map[string]string{cwdEnv: missing})
	if got.code != 1 || got.stdout != "" || !strings.Contains(got.stderr, missing) {
		t.Errorf("got %+v; want exit 1, no stdout, stderr naming %s", got, missing)
	}
}

func TestLoginShell(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var out bytes.Buffer
	sess.Stdout = &out
	sess.Stdin = strings.NewReader("echo \"$0\"\nexit 3\n")
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	var ee *ssh.ExitError
	if err := sess.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 3 {
		t.Fatalf("Wait = %v, want exit status 3", err)
	}
	if got := strings.TrimSpace(out.String()); got != "-sh" {
		t.Errorf("$0 = %q, want -sh (login shell)", got)
	}
}

func TestAuthentication(t *testing.T) {
	ts := startServer(t, nil)
	if _, err := ts.dialWith(t, newSigner(t)); err == nil {
		t.Error("dial with an unauthorized key succeeded")
	}
	_, err := ssh.Dial("tcp", ts.addr, &ssh.ClientConfig{
		User:            "agent",
		Auth:            []ssh.AuthMethod{ssh.Password("")},
		HostKeyCallback: ssh.FixedHostKey(ts.host),
		Timeout:         2 * time.Second,
	})
	if err == nil {
		t.Error("dial with an empty password succeeded")
	}
	ts.dial(t) // the authorized key still works
}

func TestServeRequiresKeys(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &Server{HostKey: newSigner(t)}
	if err := s.Serve(context.Background(), ln); err == nil {
		t.Error("Serve without AuthorizedKey returned nil")
	}
}

func TestRejectsOtherChannels(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	_, _, err := c.OpenChannel("x11", nil)
	var oce *ssh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != ssh.UnknownChannelType {
		t.Errorf("OpenChannel(x11) = %v, want UnknownChannelType", err)
	}
}

func TestDirectTCPIP(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(conn, conn) // echo
		conn.Close()
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	open := func(port int) (ssh.Channel, error) {
		ch, reqs, err := c.OpenChannel("direct-tcpip", ssh.Marshal(struct {
			Host     string
			Port     uint32
			OrigHost string
			OrigPort uint32
		}{"127.0.0.1", uint32(port), "127.0.0.1", 1}))
		if err == nil {
			go ssh.DiscardRequests(reqs)
		}
		return ch, err
	}
	ch, err := open(port)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(ch, "ping")
	ch.CloseWrite()
	got, _ := io.ReadAll(ch)
	if string(got) != "ping" {
		t.Errorf("through direct-tcpip: %q, want the echo", got)
	}
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln2.Addr().(*net.TCPAddr).Port
	ln2.Close()
	var oce *ssh.OpenChannelError
	if _, err := open(closed); !errors.As(err, &oce) || oce.Reason != ssh.ConnectionFailed {
		t.Errorf("to a closed port: %v, want ConnectionFailed", err)
	}
}

func TestSignalRequest(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.Start("sleep 30"); err != nil {
		t.Fatal(err)
	}
	// Start returns after the agent answered exec, i.e. after the process
	// group exists, so the signal cannot arrive too early.
	if err := sess.Signal(ssh.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var ee *ssh.ExitError
	if err := waitTimeout(t, sess, 2*time.Second); !errors.As(err, &ee) || ee.Signal() != "TERM" {
		t.Errorf("Wait = %v, want exit-signal TERM", err)
	}
}

func waitTimeout(t *testing.T, sess *ssh.Session, d time.Duration) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- sess.Wait() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(d):
		sess.Close()
		t.Fatalf("session still running after %v", d)
		return nil
	}
}

// alive reports whether pid exists and is not a zombie: killed orphans are
// reparented to init, and whether init has reaped them yet is not ours.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	state, _, _, ok := parseStat(stat)
	return ok && state != 'Z'
}

// groupPids lists the live processes in process group pgid.
func groupPids(t *testing.T, pgid int) []int {
	t.Helper()
	p := &process{pid: pgid}
	var pids []int
	for _, pid := range p.members() {
		stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if _, pgrp, _, ok := parseStat(stat); ok && pgrp == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}

func pgidOf(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	_, pgrp, _, ok := parseStat(stat)
	if !ok {
		t.Fatalf("parsing /proc/%d/stat: %q", pid, stat)
	}
	return pgrp
}

// waitGone polls until none of pids is alive, at most d.
func waitGone(t *testing.T, pids []int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var left []int
		for _, pid := range pids {
			if alive(pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v still alive %v after the session ended", left, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newSession opens a session to a fresh server, with a PTY if asked, and
// collects its output.
func newSession(t *testing.T, usePTY bool) (*ssh.Client, *ssh.Session, *termtest.Screen) {
	t.Helper()
	ts := startServer(t, nil)
	c := ts.dial(t)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if usePTY {
		if err := sess.RequestPty("xterm", 24, 80, nil); err != nil {
			t.Fatal(err)
		}
	}
	out := &termtest.Screen{}
	sess.Stdout = out
	return c, sess, out
}

func TestDisconnectKillsGroup(t *testing.T) {
	for _, usePTY := range []bool{false, true} {
		t.Run(fmt.Sprintf("pty=%v", usePTY), func(t *testing.T) {
			c, sess, out := newSession(t, usePTY)
			pidfile := filepath.Join(t.TempDir(), "pid")
			if err := sess.Start(fmt.Sprintf(`sh -c 'echo $$ > %s; sleep 300 & sleep 300 & echo ready; wait'`, pidfile)); err != nil {
				t.Fatal(err)
			}
			out.WaitFor(t, "ready", 2*time.Second)
			b, err := os.ReadFile(pidfile)
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			pids := groupPids(t, pgidOf(t, pid))
			if len(pids) < 3 {
				t.Fatalf("process group has %v, want the shell and two sleeps", pids)
			}
			c.Close()
			waitGone(t, pids, 2*time.Second)
		})
	}
}

// A command's background processes outlive it, as after `ssh host cmd` or
// `docker exec`, without holding the session open.
func TestLeftoverChildrenKeepRunning(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	start := time.Now()
	got := run(t, c, "sleep 300 & echo $!", nil, nil)
	if got.code != 0 {
		t.Fatalf("got %+v, want exit 0", got)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("session took %v; a background child held it open", d)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(got.stdout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	time.Sleep(200 * time.Millisecond)
	if !alive(pid) {
		t.Errorf("background process %d was killed when the command exited", pid)
	}
}

// A background process that keeps writing does not hold the session open
// past outputMax.
func TestChattyLeftoverDoesNotHoldSession(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	start := time.Now()
	got := run(t, c, "(while :; do echo x; sleep 0.05; done) & echo $! >&2", nil, nil)
	if pid, err := strconv.Atoi(strings.TrimSpace(got.stderr)); err == nil {
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	}
	if d := time.Since(start); d > outputMax+time.Second {
		t.Errorf("session took %v; want at most about %v", d, outputMax)
	}
}

// A hang-up (the client went away, or a PTY's shell exited) spares what
// nohup started and ends the rest.
func TestHangupSparesNohup(t *testing.T) {
	for _, usePTY := range []bool{false, true} {
		t.Run(fmt.Sprintf("pty=%v", usePTY), func(t *testing.T) {
			c, sess, out := newSession(t, usePTY)
			dir := t.TempDir()
			kept, plain := filepath.Join(dir, "kept"), filepath.Join(dir, "plain")
			// Each writes its own pid once it runs, so nohup has set
			// SIGHUP to ignored by the time the pid file exists.
			cmd := fmt.Sprintf(`nohup sh -c 'echo $$ > %s; exec sleep 300' >/dev/null 2>&1 & sh -c 'echo $$ > %s; exec sleep 300' & `+
				`while [ ! -s %s ] || [ ! -s %s ]; do sleep 0.02; done; echo ready; `, kept, plain, kept, plain)
			if usePTY {
				cmd += "exit 0"
			} else {
				cmd += "sleep 300"
			}
			if err := sess.Start("sh -c '" + strings.ReplaceAll(cmd, "'", `'\''`) + "'"); err != nil {
				t.Fatal(err)
			}
			out.WaitFor(t, "ready", 2*time.Second)
			keptPid, plainPid := readPid(t, kept), readPid(t, plain)
			t.Cleanup(func() { syscall.Kill(keptPid, syscall.SIGKILL); syscall.Kill(plainPid, syscall.SIGKILL) })
			if !usePTY {
				c.Close()
			}
			waitGone(t, []int{plainPid}, 2*time.Second)
			// Past the grace after which the old sweep killed everything.
			time.Sleep(hangupGrace + 300*time.Millisecond)
			if !alive(keptPid) {
				t.Errorf("the nohup process %d was killed by the hang-up", keptPid)
			}
		})
	}
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestShutdownKillsSessions(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	var out termtest.Screen
	sess.Stdout = &out
	if err := sess.Start("echo $$; exec sleep 300"); err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.WaitFor(t, "\n", 2*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	ts.cancel()
	select {
	case err := <-ts.done:
		ts.done <- err // for Cleanup
	case <-time.After(2 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	waitGone(t, []int{pid}, time.Second)
	if err := waitTimeout(t, sess, time.Second); err == nil {
		t.Error("session ended cleanly; want an error after the server went away")
	}
}

func TestCredential(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("changing credentials needs root; run the tests as root to cover it")
	}
	const nobody = 65534
	ts := startServer(t, func(s *Server) {
		s.UID, s.GID, s.Groups = nobody, nobody, []uint32{nobody}
		s.Dir = "/" // t.TempDir is 0700 root
	})
	c := ts.dial(t)
	t.Run("pipes", func(t *testing.T) {
		got := run(t, c, "id -u; id -g; id -G; pwd", nil, nil)
		if want := "65534\n65534\n65534\n/\n"; got.stdout != want || got.code != 0 {
			t.Errorf("got %+v, want stdout %q", got, want)
		}
	})
	t.Run("pty", func(t *testing.T) {
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		if err := sess.RequestPty("xterm", 24, 80, nil); err != nil {
			t.Fatal(err)
		}
		out, err := sess.Output(`id -u; test -O "$(tty)" && echo owns-tty`)
		if got := strings.ReplaceAll(string(out), "\r", ""); err != nil || got != "65534\nowns-tty\n" {
			t.Errorf("Output = %q, %v; want the pty owned by uid 65534", got, err)
		}
	})
}

func TestDedupEnv(t *testing.T) {
	tests := []struct {
		in, want []string
	}{
		{nil, []string{}},
		{[]string{"A=1", "B=2"}, []string{"A=1", "B=2"}},
		{[]string{"A=1", "B=2", "A=3"}, []string{"A=3", "B=2"}},
		{[]string{"A=", "A=x=y"}, []string{"A=x=y"}},
	}
	for _, tt := range tests {
		got := dedupEnv(tt.in)
		if strings.Join(got, " ") != strings.Join(tt.want, " ") {
			t.Errorf("dedupEnv(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		in        string
		ok        bool
		state     byte
		pgrp, sid int
	}{
		{"42 (sleep) S 1 40 39 0 -1", true, 'S', 40, 39},
		{"42 (a) b) (c) Z 1 7 8 0", true, 'Z', 7, 8},
		{"42 (sleep", false, 0, 0, 0},
		{"42 (x) S 1", false, 0, 0, 0},
	}
	for _, tt := range tests {
		state, pgrp, sid, ok := parseStat([]byte(tt.in))
		if ok != tt.ok || state != tt.state || pgrp != tt.pgrp || sid != tt.sid {
			t.Errorf("parseStat(%q) = %c, %d, %d, %v; want %c, %d, %d, %v", tt.in, state, pgrp, sid, ok, tt.state, tt.pgrp, tt.sid, tt.ok)
		}
	}
}

// TestMembers: the scan that every command's exit pays finds the live
// processes of a group, not a zombie of it, and not processes of other
// groups; readStat gives what the kernel's file holds.
func TestMembers(t *testing.T) {
	sleeper := exec.Command("sleep", "30")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	pgid := sleeper.Process.Pid
	// A second member, and one that exits and stays a zombie until reaped.
	mate := exec.Command("sleep", "30")
	mate.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
	zombie := exec.Command("true")
	zombie.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
	for _, c := range []*exec.Cmd{mate, zombie} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { mate.Process.Kill(); mate.Wait() })
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, zombie.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { zombie.Wait() })

	got := (&process{pid: pgid}).members()
	slices.Sort(got)
	want := []int{pgid, mate.Process.Pid}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("members of group %d = %v, want %v (the zombie %d excluded)", pgid, got, want, zombie.Process.Pid)
	}

	stat, err := readStat(os.Getpid(), make([]byte, 4096))
	want2, err2 := os.ReadFile("/proc/self/stat")
	if err != nil || err2 != nil || len(stat) == 0 || !bytes.Equal(stat[:bytes.IndexByte(stat, ')')], want2[:bytes.IndexByte(want2, ')')]) {
		t.Errorf("readStat(self) = %q, %v; /proc/self/stat %q, %v", stat, err, want2, err2)
	}
	if _, err := readStat(os.Getpid(), make([]byte, 8)); err == nil {
		t.Error("readStat with a buffer shorter than the line: no error, want one rather than a cut line")
	}
	if _, err := readStat(1<<30, make([]byte, 4096)); err == nil {
		t.Error("readStat of a pid that does not exist: no error")
	}
}

// A process that leaves the group (setsid) escapes the kill; this package
// cannot stop that without cgroups, but it must not hold exit-status back
// by keeping stdout open.
func TestEscapedProcessDoesNotHoldSession(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial(t)
	start := time.Now()
	got := run(t, c, "setsid sleep 300 & sleep 0.1; echo $!", nil, nil)
	if pid, err := strconv.Atoi(strings.TrimSpace(got.stdout)); err == nil {
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	}
	if d := time.Since(start); got.code != 0 || d > 100*time.Millisecond+outputIdle+300*time.Millisecond {
		t.Errorf("got %+v after %v; want exit 0 about %v after the command", got, d, outputIdle)
	}
}

// TestReadyHoldsSessions: until Ready is closed, a session waits (the
// guest is still being prepared); then it runs.
func TestReadyHoldsSessions(t *testing.T) {
	ready := make(chan struct{})
	ts := startServer(t, func(s *Server) { s.Ready = ready })
	c := ts.dial(t) // connecting and authenticating do not wait
	done := make(chan result, 1)
	go func() { done <- run(t, c, "echo ran", nil, nil) }()
	select {
	case r := <-done:
		t.Fatalf("session ran before Ready: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	close(ready)
	select {
	case r := <-done:
		if r.stdout != "ran\n" || r.code != 0 {
			t.Errorf("got %+v, want ran, exit 0", r)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("session did not run after Ready")
	}
}
