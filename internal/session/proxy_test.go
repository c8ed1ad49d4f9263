package session

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/agent"
	"moat.dev/moat/internal/termtest"
)

// agentAt serves an agent with the given keys on a new loopback listener
// until the returned function is called.
func agentAt(t *testing.T, host, client ssh.Signer) (addr string, stop func()) {
	t.Helper()
	home := t.TempDir()
	srv := &agent.Server{
		HostKey: host, AuthorizedKey: client.PublicKey(),
		UID: os.Getuid(), GID: os.Getgid(), Home: home, Dir: home,
		Env: []string{"PATH=/usr/bin:/bin", "HOME=" + home},
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
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

func runOut(t *testing.T, c *ssh.Client, argv ...string) (string, int) {
	t.Helper()
	r := await(t, runAsync(context.Background(), c, Options{Argv: argv}, &termtest.Screen{}))
	if r.err != nil {
		t.Fatalf("running %q: %v", argv, r.err)
	}
	return r.stdout, r.code
}

// TestProxyRedials: when the agent goes away (restarted by init, say), the
// next session dials it again.
func TestProxyRedials(t *testing.T) {
	host, client := newSigner(t), newSigner(t)
	var addr atomic.Value
	a1, stop1 := agentAt(t, host, client)
	addr.Store(a1)
	var dials atomic.Int32
	p := NewProxy(ProxyConfig{
		Dial: func(ctx context.Context) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr.Load().(string))
		},
		Client: client, Host: host,
	})
	t.Cleanup(p.Close)
	c := dialProxy(t, p, client, host)
	for range 3 {
		if out, code := runOut(t, c, "echo", "one"); out != "one\n" || code != 0 {
			t.Fatalf("got %q, %d", out, code)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials for three sessions, want 1: sessions share the agent connection", n)
	}
	stop1()
	a2, _ := agentAt(t, host, client)
	addr.Store(a2)
	// The proxy learns of the closed connection asynchronously.
	deadline := time.Now().Add(2 * time.Second)
	for {
		r := await(t, runAsync(context.Background(), c, Options{Argv: []string{"echo", "two"}}, &termtest.Screen{}))
		if r.err == nil && r.stdout == "two\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session after the agent came back: %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestProxyHandshakeIsReadiness: a connection handed to Handshake carries
// the sessions; the proxy does not dial one of its own.
func TestProxyHandshakeIsReadiness(t *testing.T) {
	host, client := newSigner(t), newSigner(t)
	a, _ := agentAt(t, host, client)
	p := NewProxy(ProxyConfig{
		Dial: func(context.Context) (net.Conn, error) {
			t.Error("proxy dialed although Handshake gave it a connection")
			return nil, fmt.Errorf("no dialing in this test")
		},
		Client: client, Host: host,
	})
	t.Cleanup(p.Close)
	conn, err := net.Dial("tcp", a)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handshake(conn); err != nil {
		t.Fatal(err)
	}
	c := dialProxy(t, p, client, host)
	if out, code := runOut(t, c, "echo", "ok"); out != "ok\n" || code != 0 {
		t.Errorf("got %q, %d", out, code)
	}
}

// TestProxyHandshakeChecksHostKey: an agent without the sandbox's host key
// is not the sandbox's agent.
func TestProxyHandshakeChecksHostKey(t *testing.T) {
	host, client := newSigner(t), newSigner(t)
	a, _ := agentAt(t, newSigner(t), client)
	p := NewProxy(ProxyConfig{Client: client, Host: host})
	conn, err := net.Dial("tcp", a)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handshake(conn); err == nil {
		t.Error("Handshake accepted an agent with another host key")
	}
}

// TestProxyRefusesOtherKeys: only the sandbox's client key gets in.
func TestProxyRefusesOtherKeys(t *testing.T) {
	host, client := newSigner(t), newSigner(t)
	p := NewProxy(ProxyConfig{Client: client, Host: host})
	ours, theirs := socketPair(t)
	go p.Serve(theirs)
	defer ours.Close()
	_, _, _, err := ssh.NewClientConn(ours, "daemon", ClientConfig(newSigner(t), host.PublicKey()))
	if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("handshake with another key: %v, want an authentication failure", err)
	}
}

// TestProxyClientGoneKillsGroup: a client that disconnects without closing
// its channels (killed, say) still hangs up its command in the guest.
func TestProxyClientGoneKillsGroup(t *testing.T) {
	host, client := newSigner(t), newSigner(t)
	a, _ := agentAt(t, host, client)
	p := NewProxy(ProxyConfig{
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", a)
		},
		Client: client, Host: host,
	})
	t.Cleanup(p.Close)
	ours, theirs := socketPair(t)
	go p.Serve(theirs)
	cc, chans, reqs, err := ssh.NewClientConn(ours, "daemon", ClientConfig(client, host.PublicKey()))
	if err != nil {
		t.Fatal(err)
	}
	c := ssh.NewClient(cc, chans, reqs)
	var out termtest.Screen
	runAsync(context.Background(), c, Options{Argv: []string{"sh", "-c", "echo $$; sleep 300 & wait"}}, &out)
	out.WaitFor(t, "\n", 2*time.Second)
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatal(err)
	}
	// The shell prints its pid before it forks sleep: wait (bounded) for both.
	for start := time.Now(); len(liveInGroup(t, pid)) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("process group %d has %v, want the shell and its sleep", pid, liveInGroup(t, pid))
		}
	}
	ours.Close() // the client process is gone
	deadline := time.Now().Add(2 * time.Second)
	for len(liveInGroup(t, pid)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still has %v 2 s after its client went away", pid, liveInGroup(t, pid))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// liveInGroup lists the processes of group pgid that are not zombies (an
// orphan's zombie waits for whoever reaps orphans on this host).
func liveInGroup(t *testing.T, pgid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestProxyConcurrentSessions: many clients, many sessions each, one agent
// connection; every exit status reaches the right client.
func TestProxyConcurrentSessions(t *testing.T) {
	c, _ := connectProxied(t)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() {
			code, err := Run(context.Background(), c, Options{
				Argv:   []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero; exit %d", i*1000, i%5)},
				Stdout: discard{}, Stderr: discard{},
			})
			if err != nil || code != i%5 {
				errs <- fmt.Errorf("session %d: %d, %v; want %d", i, code, err, i%5)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
