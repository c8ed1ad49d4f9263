package dockerrt

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/gateserve"
)

// freePort is a loopback port free for TCP and UDP now.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free loopback port for TCP and UDP in 20 tries")
	return 0
}

// TestPushSecrets speaks to the gate service's own control API, as
// moat-docker does: the fields spelled out on both sides agree.
func TestPushSecrets(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.toml")
	os.WriteFile(pol, []byte("[network]\nallow = [\"api.test\"]\n[secrets.TOKEN]\nfrom = \"env:MOAT_PUSH_TEST_UNSET\"\nhosts = [\"api.test\"]\n"), 0o644)
	sock := ControlSocket(dir)
	dns, https := freePort(t), freePort(t)
	conf := fmt.Sprintf("[service]\nstate_dir = %q\ncontrol = %q\n[listen]\ndns = [\"127.0.0.1:%d\"]\nhttps = [\"127.0.0.1:%d\"]\n[tenants.%s]\nsources = [\"127.0.0.3\"]\npolicy = [%q]\npushed = [\"TOKEN\"]\n",
		filepath.Join(dir, "state"), sock, dns, https, tenant, pol)
	cfg, err := gateserve.ParseConfig(filepath.Join(dir, "gate.toml"), []byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(cfg.Path, []byte(conf), 0o644)
	ls, err := gateserve.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := gateserve.New(gateserve.Options{Config: cfg, Listeners: ls, HostAddrs: []netip.Addr{},
		Resolvers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")}})
	if err != nil {
		ls.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.Serve(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	if pending, err := PushSecrets(ctx, sock, nil); err != nil || !slices.Equal(pending, []string{"TOKEN"}) {
		t.Errorf("before a push: pending %v, %v; want [TOKEN]", pending, err)
	}
	if _, err := PushSecrets(ctx, sock, map[string]string{"TOKEN": "short"}); err == nil || !strings.Contains(err.Error(), "TOKEN") || strings.Contains(err.Error(), "short") {
		t.Errorf("a refused value: %v; want the gate's reason naming TOKEN, not the value", err)
	}
	if pending, err := PushSecrets(ctx, sock, map[string]string{"TOKEN": "a-value-long-enough-0123"}); err != nil || len(pending) != 0 {
		t.Errorf("push: pending %v, %v; want none", pending, err)
	}
	if pending, err := PushSecrets(ctx, sock, nil); err != nil || len(pending) != 0 {
		t.Errorf("after the push: pending %v, %v; want none", pending, err)
	}
	// A gate that is not there fails the push within its bound.
	start := time.Now()
	if _, err := PushSecrets(ctx, filepath.Join(dir, "nothing.sock"), map[string]string{"TOKEN": "a-value-long-enough-0123"}); err == nil || time.Since(start) > pushTimeout {
		t.Errorf("no gate: %v after %s", err, time.Since(start))
	}
}
