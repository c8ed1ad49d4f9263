package gateserve

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestServiceDrain: a stopping service accepts nothing new, lets a
// request the upstream is answering finish, and cuts one that outlasts the
// drain. Without the drain the first request's answer is lost: the
// upstream carried it out and the client is told it failed.
func TestServiceDrain(t *testing.T) {
	const drain = 2 * time.Second
	f := start(t, func(o *Options) { o.Drain = drain })
	cl := f.a.client(t, f.roots)
	results := make(map[string]chan response)
	for _, d := range []string{"1500ms", "30s"} {
		ch := make(chan response, 1)
		results[d] = ch
		go func() { ch <- get(t, cl, "https://allowed.test/slow?d="+d, nil) }()
	}
	for range 2 {
		select {
		case <-f.slow:
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream did not get both requests within 10 s")
		}
	}

	stopped := make(chan time.Duration, 1)
	t0 := time.Now()
	go func() { f.stop(); stopped <- time.Since(t0) }()

	// While the first request goes on, a new connection is refused.
	refused := false
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		c, err := f.a.dial(ctx, "tcp4", net.JoinHostPort(f.a.gw.String(), "443"), netip.Addr{})
		cancel()
		if err != nil {
			refused = true
			break
		}
		c.Close()
	}
	if !refused {
		t.Error("the stopping service still accepted connections a second after its stop")
	}

	if r := <-results["1500ms"]; r.status != 200 || !strings.Contains(r.body, "slow /slow?d=1500ms") {
		t.Errorf("the request the upstream was answering when the service stopped got %d %q, want its answer", r.status, r.body)
	}
	if r := <-results["30s"]; r.status == 200 {
		t.Errorf("a request that outlasts the drain got its answer: %d %q", r.status, r.body)
	}
	took := <-stopped
	t.Logf("stopped in %v with a drain of %v", took.Round(time.Millisecond), drain)
	if took < drain || took > drain+3*time.Second {
		t.Errorf("the service stopped %v after its context ended, want just over the drain (%v)", took, drain)
	}
	if !strings.Contains(f.logs.String(), "connections still open after the drain are cut") {
		t.Errorf("the service's log does not say it cut connections: %s", f.logs.String())
	}
}
