package session

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/agent"
	"moat.dev/moat/internal/termtest"
)

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

// startAgent starts a real agent.Server as the current user on loopback and
// returns its address, its keys, and a function that shuts it down.
func startAgent(t *testing.T) (addr string, host, client ssh.Signer, shutdown func()) {
	t.Helper()
	host, client = newSigner(t), newSigner(t)
	home := t.TempDir()
	srv := &agent.Server{
		HostKey:       host,
		AuthorizedKey: client.PublicKey(),
		UID:           os.Getuid(),
		GID:           os.Getgid(),
		Home:          home,
		Dir:           home,
		Env:           []string{"PATH=/usr/bin:/bin", "HOME=" + home},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ctx, ln)
	}()
	shutdown = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	}
	t.Cleanup(shutdown)
	return ln.Addr().String(), host, client, shutdown
}

// connector returns a client of a fresh agent, and a function that shuts
// the agent down.
type connector func(t *testing.T) (*ssh.Client, func())

// connect reaches the agent directly, as the CLI did before the daemon
// proxied sessions.
func connect(t *testing.T) (*ssh.Client, func()) {
	t.Helper()
	addr, host, client, shutdown := startAgent(t)
	c, err := ssh.Dial("tcp", addr, ClientConfig(client, host.PublicKey()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, shutdown
}

// connectProxied reaches the agent through a Proxy, as the CLI does
// through the daemon.
func connectProxied(t *testing.T) (*ssh.Client, func()) {
	t.Helper()
	addr, host, client, shutdown := startAgent(t)
	p := NewProxy(ProxyConfig{
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		Client: client, Host: host,
	})
	t.Cleanup(p.Close)
	return dialProxy(t, p, client, host), shutdown
}

// dialProxy connects a client to p over a socket pair, as the daemon serves
// one hijacked control-socket connection.
func dialProxy(t *testing.T, p *Proxy, client, host ssh.Signer) *ssh.Client {
	t.Helper()
	ours, theirs := socketPair(t)
	served := make(chan struct{})
	go func() {
		defer close(served)
		p.Serve(theirs)
	}()
	cc, chans, reqs, err := ssh.NewClientConn(ours, "daemon", ClientConfig(client, host.PublicKey()))
	if err != nil {
		t.Fatal(err)
	}
	c := ssh.NewClient(cc, chans, reqs)
	t.Cleanup(func() {
		c.Close()
		<-served
	})
	return c
}

func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// eachTransport runs f against a direct connection to the agent and
// against one through a Proxy: every session behaviour must be the same.
func eachTransport(t *testing.T, f func(t *testing.T, connect connector)) {
	t.Run("direct", func(t *testing.T) { f(t, connect) })
	t.Run("proxied", func(t *testing.T) { f(t, connectProxied) })
}

type runResult struct {
	code   int
	err    error
	stdout string
	stderr string
}

func runAsync(ctx context.Context, c *ssh.Client, o Options, stdout *termtest.Screen) <-chan runResult {
	var stderr bytes.Buffer
	o.Stdout, o.Stderr = stdout, &stderr
	resc := make(chan runResult, 1)
	go func() {
		code, err := Run(ctx, c, o)
		resc <- runResult{code, err, stdout.String(), stderr.String()}
	}()
	return resc
}

func await(t *testing.T, resc <-chan runResult) runResult {
	t.Helper()
	select {
	case r := <-resc:
		return r
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return within 2s")
		return runResult{}
	}
}

func TestRun(t *testing.T) {
	eachTransport(t, func(t *testing.T, connect connector) {
		c, _ := connect(t)
		dir := t.TempDir()
		tests := []struct {
			name       string
			o          Options
			wantCode   int
			wantStdout string
			wantStderr string
		}{
			{"argv quoting", Options{Argv: []string{"echo", "hello  world", "$HOME"}}, 0, "hello  world $HOME\n", ""},
			{"exit status", Options{Argv: []string{"sh", "-c", "exit 7"}}, 7, "", ""},
			{"exit signal", Options{Stdin: strings.NewReader("kill -KILL $$\n")}, 128 + 9, "", ""},
			{"stderr", Options{Argv: []string{"sh", "-c", "echo out; echo err >&2"}}, 0, "out\n", "err\n"},
			{"env and dir", Options{Argv: []string{"sh", "-c", `pwd; echo "$FOO"`}, Dir: dir, Env: map[string]string{"FOO": "bar"}}, 0, dir + "\nbar\n", ""},
			{"missing dir", Options{Argv: []string{"true"}, Dir: dir + "/gone"}, 1, "", "moat: using working directory " + dir + "/gone: no such file or directory\n"},
			{"shell", Options{Stdin: strings.NewReader("echo hi; exit 4\n")}, 4, "hi\n", ""},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r := await(t, runAsync(context.Background(), c, tt.o, &termtest.Screen{}))
				if r.err != nil || r.code != tt.wantCode || r.stdout != tt.wantStdout || r.stderr != tt.wantStderr {
					t.Errorf("Run = %d, %v, stdout %q, stderr %q; want %d, nil, %q, %q",
						r.code, r.err, r.stdout, r.stderr, tt.wantCode, tt.wantStdout, tt.wantStderr)
				}
			})
		}
	})
}

// TestRunEnv: env requests go without replies, so every variable must
// still arrive, in order before the command, and a variable the agent
// would refuse must be refused here, before anything runs.
func TestRunEnv(t *testing.T) {
	eachTransport(t, func(t *testing.T, connect connector) {
		c, _ := connect(t)
		dir := t.TempDir()
		env := map[string]string{}
		var want strings.Builder
		for i := range 40 {
			k, v := fmt.Sprintf("MOAT_TEST_%02d", i), strings.Repeat("v", i)
			env[k] = v
			fmt.Fprintf(&want, "%s=%s\n", k, v)
		}
		r := await(t, runAsync(context.Background(), c, Options{
			Argv: []string{"sh", "-c", `pwd; env | grep '^MOAT_TEST_' | sort`}, Dir: dir, Env: env,
		}, &termtest.Screen{}))
		if r.err != nil || r.code != 0 || r.stdout != dir+"\n"+want.String() {
			t.Fatalf("Run = %d, %v, stdout %q; want 0, nil, %q", r.code, r.err, r.stdout, dir+"\n"+want.String())
		}

		marker := filepath.Join(dir, "ran")
		for _, bad := range []map[string]string{{"A=B": "x"}, {"": "x"}, {"OK": "a\x00b"}} {
			r := await(t, runAsync(context.Background(), c, Options{
				Argv: []string{"touch", marker}, Env: bad,
			}, &termtest.Screen{}))
			if r.err == nil || !strings.Contains(r.err.Error(), "setting environment variable") {
				t.Errorf("Run with env %q: err = %v, want a refusal naming the variable", bad, r.err)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatalf("Run with env %q ran the command", bad)
			}
		}
		r = await(t, runAsync(context.Background(), c, Options{Argv: []string{"true"}, Dir: "a\x00b"}, &termtest.Screen{}))
		if r.err == nil || !strings.Contains(r.err.Error(), "working directory") {
			t.Errorf("Run with a NUL in Dir: err = %v, want a refusal naming the working directory", r.err)
		}
	})
}

// TestRunPipes drives a command line by line through in-memory pipes, as a
// program embedding moat would.
func TestRunPipes(t *testing.T) {
	eachTransport(t, func(t *testing.T, connect connector) {
		c, _ := connect(t)
		stdinR, stdinW := io.Pipe()
		stdoutR, stdoutW := io.Pipe()
		resc := make(chan runResult, 1)
		go func() {
			code, err := Run(context.Background(), c, Options{
				Argv:   []string{"sh", "-c", `while read l; do echo "got:$l"; done; exit 3`},
				Stdin:  stdinR,
				Stdout: stdoutW,
			})
			stdoutW.Close()
			resc <- runResult{code: code, err: err}
		}()
		lines := bufio.NewScanner(stdoutR)
		for _, in := range []string{"a", "b c"} {
			io.WriteString(stdinW, in+"\n")
			if !lines.Scan() || lines.Text() != "got:"+in {
				t.Fatalf("read %q (%v), want %q", lines.Text(), lines.Err(), "got:"+in)
			}
		}
		stdinW.Close() // EOF ends the loop
		if lines.Scan() {
			t.Errorf("unexpected output %q", lines.Text())
		}
		if r := await(t, resc); r.code != 3 || r.err != nil {
			t.Errorf("Run = %d, %v; want 3, nil", r.code, r.err)
		}
	})
}

func TestRunTTY(t *testing.T) {
	eachTransport(t, func(t *testing.T, connect connector) {
		c, _ := connect(t)
		// Stdin is not a terminal, so no raw mode, but the PTY is still real.
		r := await(t, runAsync(context.Background(), c, Options{
			Argv:  []string{"sh", "-c", `tty; echo "$TERM"; stty size`},
			TTY:   true,
			Term:  "xterm-test",
			Stdin: strings.NewReader(""),
		}, &termtest.Screen{}))
		want := regexp.MustCompile(`^/dev/pts/\d+\r\nxterm-test\r\n24 80\r\n$`)
		if r.err != nil || r.code != 0 || !want.MatchString(r.stdout) {
			t.Errorf("Run = %d, %v, %q; want 0, nil, match for %s", r.code, r.err, r.stdout, want)
		}
	})
}

func TestRunConnectionLost(t *testing.T) {
	eachTransport(t, func(t *testing.T, connect connector) {
		c, shutdown := connect(t)
		var out termtest.Screen
		resc := runAsync(context.Background(), c, Options{Argv: []string{"sh", "-c", "echo ready; sleep 30"}}, &out)
		out.WaitFor(t, "ready", 2*time.Second)
		shutdown()
		r := await(t, resc)
		if !errors.Is(r.err, ErrConnectionLost) || r.code != exitFailed {
			t.Errorf("Run = %d, %v; want %d, ErrConnectionLost", r.code, r.err, exitFailed)
		}
	})
}

func TestRunContextCancel(t *testing.T) {
	eachTransport(t, func(t *testing.T, connect connector) {
		c, _ := connect(t)
		ctx, cancel := context.WithCancel(context.Background())
		var out termtest.Screen
		resc := runAsync(ctx, c, Options{Argv: []string{"sh", "-c", "echo ready; sleep 30"}}, &out)
		out.WaitFor(t, "ready", 2*time.Second)
		cancel()
		if r := await(t, resc); !errors.Is(r.err, context.Canceled) {
			t.Errorf("Run = %d, %v; want context.Canceled", r.code, r.err)
		}
	})
}

func TestRunForwardsSignals(t *testing.T) {
	eachTransport(t, func(t *testing.T, connect connector) {
		c, _ := connect(t)
		var out termtest.Screen
		resc := runAsync(context.Background(), c, Options{Argv: []string{"sh", "-c", "echo ready; sleep 30"}}, &out)
		// "ready" is printed after Start, and Run subscribes to signals before
		// Start, so this SIGTERM goes to Run and not to the test binary.
		out.WaitFor(t, "ready", 2*time.Second)
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if r := await(t, resc); r.code != 128+15 || r.err != nil {
			t.Errorf("Run = %d, %v; want %d, nil (remote killed by TERM)", r.code, r.err, 128+15)
		}
	})
}
